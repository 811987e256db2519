"""TLS on both sides: client -> proxy B --TLS--> proxy A -> dev cluster.

Proxy A serves its clients over TLS (downstream TLS); proxy B reaches its
upstream (proxy A) over TLS with CA verification and hostname checking
(upstream TLS).  kcat talks to B in plain text and to A over TLS.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from proxy import config
from proxy.devbroker.cluster import DevCluster
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
    return config.validate(
        {
            "upstream": [upstream],
            "listen": "127.0.0.1:0",
            "broker_port_base": 0,
            "connect_timeout_seconds": 5,
            "retry_backoff_initial_seconds": 0.05,
            "retry_backoff_max_seconds": 0.2,
            **extra,
        }
    )


async def kcat(*args: str, stdin: bytes | None = None) -> str:
    done = await trio.run_process(
        ["kcat", *args], stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


async def test_upstream_and_downstream_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with trio.fail_after(60):
        async with (
            DevCluster(nodes=3, topics={"secure": 3}) as cluster,
            trio.open_nursery() as nursery,
        ):
            tls_a = {
                "enabled": True,
                "cert_file": certs["server.pem"],
                "key_file": certs["server.key"],
            }
            a = await nursery.start(Proxy(settings(cluster.bootstrap, downstream_tls=tls_a)).serve)
            await a.discovered.wait()
            a_addr = f"127.0.0.1:{a.bootstrap.port}"
            tls_b = {"enabled": True, "ca_file": certs["ca.pem"], "check_hostname": True}
            b = await nursery.start(Proxy(settings(a_addr, upstream_tls=tls_b)).serve)
            await b.discovered.wait()
            b_addr = f"127.0.0.1:{b.bootstrap.port}"

            listing = await kcat("-b", b_addr, "-L", "-t", "secure")
            assert " 3 brokers:" in listing
            for node in range(3):
                assert f"broker {node} at 127.0.0.1:{b.broker_address(node)[1]}" in listing
            lines = [f"tls-{i}" for i in range(50)]
            await kcat(
                "-b",
                b_addr,
                "-P",
                "-t",
                "secure",
                "-p",
                "1",
                stdin="\n".join(lines).encode() + b"\n",
            )
            out = await kcat("-b", b_addr, "-C", "-t", "secure", "-p", "1", "-e", "-f", "%s\n")
            assert out.splitlines() == lines
            # a TLS client straight to proxy A sees the same data
            out_a = await kcat(
                "-b", a_addr, "-X", "security.protocol=ssl", "-X", f"ssl.ca.location={certs['ca.pem']}",
                "-C", "-t", "secure", "-p", "1", "-e", "-f", "%s\n",
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
