"""TLS on both sides: client -> proxy B --TLS--> proxy A -> upstream.

Proxy A serves its clients over TLS (downstream TLS); proxy B reaches its
upstream (proxy A) over TLS with CA verification and hostname checking
(upstream TLS).  kcat talks to B in plain text and to A over TLS.  The upstream
is the dev cluster or real Kafka (``backend`` is parametrised over ``BACKENDS``);
both TLS legs are the proxy's own, so the whole chain runs on both.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from support import loopback
from support.backends import BACKENDS, upstream_for
from support.kafka import KafkaCluster

from devbroker.cluster import DevCluster
from proxy import config
from proxy.server.proxy import Proxy

pytestmark = pytest.mark.integration


def make_certs(tmp: Path) -> dict[str, str]:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=tmp)

    (tmp / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf",
    )  # fmt: skip
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out",
        "other-ca.pem", "-days", "2", "-subj", "/CN=other-ca",
    )  # fmt: skip
    return {
        name: str(tmp / f"{name}")
        for name in ("ca.pem", "server.pem", "server.key", "other-ca.pem")
    }


def settings(upstream: str, **extra: Any) -> config.Settings:
    """Loopback settings with more time to connect (TLS handshakes, real Kafka)."""
    timeouts = {
        "connect_timeout_seconds": 5,
        "retry_backoff_initial_seconds": 0.05,
        "retry_backoff_max_seconds": 0.2,
    }
    return loopback.settings(upstream, **{**timeouts, **extra})


async def kcat(*args: str, stdin: bytes | None = None) -> str:
    done = await trio.run_process(
        ["kcat", *args], stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


@asynccontextmanager
async def upstream(
    cluster: KafkaCluster | None, topic: str
) -> AsyncIterator[tuple[str, list[int]]]:
    """(bootstrap, node ids) of real Kafka, or (None) of a fresh dev cluster; both with
    *topic* (3 partitions)."""
    if cluster is not None:
        await trio.to_thread.run_sync(cluster.create_topic, topic, 3)
        yield cluster.bootstrap, sorted(cluster.nodes)
        return
    async with DevCluster(nodes=3, topics={topic: 3}) as dev:
        yield dev.bootstrap, [0, 1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_upstream_and_downstream_tls(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    certs = make_certs(tmp_path)
    cluster = upstream_for(request, backend)
    secure = f"secure-{uuid.uuid4().hex[:10]}"
    with trio.fail_after(90):
        async with (
            upstream(cluster, secure) as (bootstrap, node_ids),
            trio.open_nursery() as nursery,
        ):
            tls_a = {
                "enabled": True,
                "cert_file": certs["server.pem"],
                "key_file": certs["server.key"],
            }
            a = await nursery.start(Proxy(settings(bootstrap, downstream_tls=tls_a)).serve)
            await a.discovered.wait()
            a_addr = f"127.0.0.1:{a.bootstrap.port}"
            tls_b = {"enabled": True, "ca_file": certs["ca.pem"], "check_hostname": True}
            b = await nursery.start(Proxy(settings(a_addr, upstream_tls=tls_b)).serve)
            await b.discovered.wait()
            b_addr = f"127.0.0.1:{b.bootstrap.port}"

            listing = await kcat("-b", b_addr, "-L", "-t", secure)
            assert f" {len(node_ids)} brokers:" in listing
            for node in node_ids:
                assert f"broker {node} at 127.0.0.1:{b.broker_address(node)[1]}" in listing
            lines = [f"tls-{i}" for i in range(50)]
            await kcat(
                "-b",
                b_addr,
                "-P",
                "-t",
                secure,
                "-p",
                "1",
                stdin="\n".join(lines).encode() + b"\n",
            )
            out = await kcat("-b", b_addr, "-C", "-t", secure, "-p", "1", "-e", "-f", "%s\n")
            assert out.splitlines() == lines
            # a TLS client straight to proxy A sees the same data
            out_a = await kcat(
                "-b", a_addr, "-X", "security.protocol=ssl", "-X", f"ssl.ca.location={certs['ca.pem']}",
                "-C", "-t", secure, "-p", "1", "-e", "-f", "%s\n",
            )  # fmt: skip
            assert out_a.splitlines() == lines
            assert b.readiness()[0]

            # an upstream whose certificate is not signed by the configured CA is refused
            wrong = {"enabled": True, "ca_file": certs["other-ca.pem"]}
            c = await nursery.start(Proxy(settings(a_addr, upstream_tls=wrong)).serve)
            with trio.move_on_after(1):
                await c.discovered.wait()
            assert not c.discovered.is_set()
            assert c.readiness() == (
                False,
                {
                    "bootstrap_listener_bound": True,
                    "broker_listeners_bound": True,
                    "upstream_reachable": False,
                },
            )
            nursery.cancel_scope.cancel()
