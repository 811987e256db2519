"""``python -m proxy.observe.healthcheck`` (the image's HEALTHCHECK) against the real endpoint."""

from __future__ import annotations

import sys

import pytest
import trio
from prometheus_client import CollectorRegistry

from proxy.observe import healthcheck
from proxy.observe.http import ObserveApp, Readiness, serve_http

TIMEOUT = 20


def test_url_for_wildcard_and_ipv6_hosts() -> None:
    assert healthcheck.url_for("0.0.0.0:9464", "/healthz") == "http://127.0.0.1:9464/healthz"
    assert healthcheck.url_for("[::]:9464", "/readyz") == "http://[::1]:9464/readyz"
    assert healthcheck.url_for("10.0.0.5:1", "/healthz") == "http://10.0.0.5:1/healthz"


async def test_exit_codes_follow_the_endpoint() -> None:
    ready = {"upstream_reachable": False}
    app = ObserveApp(CollectorRegistry(), lambda: Readiness.of(**ready))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            env = {healthcheck.ENV: f"0.0.0.0:{port}"}

            def run(*argv: str) -> int:
                return healthcheck.main(list(argv), env)

            assert await trio.to_thread.run_sync(run) == 0
            assert await trio.to_thread.run_sync(run, "--path", "/readyz") == 1
            ready["upstream_reachable"] = True
            assert await trio.to_thread.run_sync(run, "--path", "/readyz") == 0
            nursery.cancel_scope.cancel()


@pytest.mark.integration
async def test_runs_as_a_module_like_the_container_does() -> None:
    app = ObserveApp(CollectorRegistry(), lambda: Readiness(True))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            argv = [sys.executable, "-m", "proxy.observe.healthcheck", "--path", "/healthz"]
            env = {healthcheck.ENV: f"127.0.0.1:{port}", "PATH": ""}
            ok = await trio.run_process(argv, env=env, check=False)
            assert ok.returncode == 0
            nursery.cancel_scope.cancel()
    with trio.fail_after(TIMEOUT):
        down = await trio.run_process(
            [*argv, "--address", "127.0.0.1:1"], env=env, capture_stderr=True, check=False
        )
    assert down.returncode == 1
    assert b"unhealthy" in down.stderr
