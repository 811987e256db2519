"""The HTTP endpoint: routing (no I/O), then the trio/h11 server over memory streams and loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import h11
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.http import (
    MAX_CONNECTIONS,
    MAX_REQUEST_BODY_BYTES,
    MAX_REQUEST_HEAD_BYTES,
    SEND_TIMEOUT_SECONDS,
    Held,
    ObserveApp,
    Readiness,
    _serve_connection,
    serve_http,
)
from proxy.observe.metrics import Metrics

TIMEOUT = 10


class FakeRelay:
    """Stands in for the relay's readiness and session state."""

    def __init__(self) -> None:
        self.listeners_bound = True
        self.brokers_reachable = 1
        self.sessions: list[dict[str, Any]] = [{"session_id": 7, "epoch": 3, "partitions": 12}]

    def readiness(self) -> Readiness:
        return Readiness.of(
            listeners_bound=self.listeners_bound, upstream_reachable=self.brokers_reachable > 0
        )

    def snapshot(self) -> list[dict[str, Any]]:
        return self.sessions


def make_app(*, debug: bool = False) -> tuple[ObserveApp, Metrics, FakeRelay]:
    metrics = Metrics(CollectorRegistry())
    relay = FakeRelay()
    app = ObserveApp(
        metrics.registry, relay.readiness, debug_sessions=relay.snapshot if debug else None
    )
    return app, metrics, relay


# -- routing -------------------------------------------------------------------------


def test_metrics_in_prometheus_text_format() -> None:
    app, metrics, _ = make_app()
    metrics.connection_accepted()
    response = app.handle("GET", "/metrics")
    assert response.status == 200
    assert response.content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.body.decode())}
    (sample,) = families["kafka_fetch_proxy_client_connections_accepted"].samples[:1]
    assert sample.value == 1


def test_metrics_in_openmetrics_when_asked() -> None:
    app, _, _ = make_app()
    response = app.handle("GET", "/metrics", "application/openmetrics-text; version=1.0.0")
    assert response.content_type.startswith("application/openmetrics-text")
    assert response.body.endswith(b"# EOF\n")


def test_healthz_and_readyz() -> None:
    app, _, relay = make_app()
    assert app.handle("GET", "/healthz").status == 200
    ready = app.handle("GET", "/readyz?verbose=1")
    assert ready.status == 200
    assert json.loads(ready.body) == {
        "ready": True,
        "checks": {"listeners_bound": True, "upstream_reachable": True},
    }
    relay.brokers_reachable = 0
    not_ready = app.handle("GET", "/readyz")
    assert not_ready.status == 503
    assert json.loads(not_ready.body)["checks"]["upstream_reachable"] is False
    relay.brokers_reachable = 2
    relay.listeners_bound = False
    assert app.handle("GET", "/readyz").status == 503
    assert app.handle("GET", "/healthz").status == 200  # alive even when not ready


def test_debug_sessions_is_off_by_default() -> None:
    app, _, _ = make_app()
    assert app.handle("GET", "/debug/sessions").status == 404
    on, _, relay = make_app(debug=True)
    response = on.handle("GET", "/debug/sessions")
    assert response.status == 200
    assert response.content_type == "application/json"
    assert json.loads(response.body) == relay.sessions


def test_unknown_paths_methods_and_failing_callbacks() -> None:
    app, _, _ = make_app(debug=True)
    assert app.handle("GET", "/").status == 404
    assert app.handle("GET", "/metrics/extra").status == 404
    post = app.handle("POST", "/metrics")
    assert post.status == 405
    assert ("allow", "GET, HEAD") in post.headers

    def broken() -> Any:
        raise RuntimeError("boom")

    app.debug_sessions = broken
    assert app.handle("GET", "/debug/sessions").status == 500
    app.readiness = broken
    assert app.handle("GET", "/readyz").status == 500


# -- the server over memory streams ----------------------------------------------------


class Client:
    """A tiny h11 client on one stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def get(self, target: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        request = h11.Request(method=method, target=target, headers=[("host", "test")])
        await self.stream.send_all(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        return await self.read_response()

    async def read_response(self) -> tuple[int, dict[str, str], bytes]:
        status = 0
        headers: dict[str, str] = {}
        body = b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(bytes(await self.stream.receive_some(65536)))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, body
            else:
                raise AssertionError(event)


async def read_all(stream: trio.abc.Stream) -> bytes:
    out = b""
    while chunk := await stream.receive_some(65536):
        out += chunk
    return out


async def serve_memory(
    app: ObserveApp,
    nursery: trio.Nursery,
    *,
    held: Held | None = None,
    request_timeout: float = 5,
    idle_timeout: float = 30,
) -> trio.StapledStream[Any, Any]:
    client, server = trio.testing.memory_stream_pair()
    nursery.start_soon(
        _serve_connection,
        app,
        server,
        held if held is not None else Held(4),
        request_timeout,
        idle_timeout,
    )
    await trio.testing.wait_all_tasks_blocked()  # it is admitted and waits for a request
    return client


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    app, _, _ = make_app()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            client = Client(await serve_memory(app, nursery))
            assert (await client.get("/healthz"))[0] == 200
            status, headers, body = await client.get("/metrics")
            assert status == 200
            assert b"kafka_fetch_proxy_build_info" in body
            assert headers["cache-control"] == "no-store"
            status, headers, body = await client.get("/metrics", method="HEAD")
            assert status == 200
            assert body == b""
            assert int(headers["content-length"]) > 0
            await client.stream.aclose()


async def test_request_sent_byte_by_byte() -> None:
    app, _, _ = make_app()
    raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            stream = await serve_memory(app, nursery)
            for i in range(len(raw)):
                await stream.send_all(raw[i : i + 1])
            client = Client(stream)
            client.conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            client.conn.send(h11.EndOfMessage())
            status, _, body = await client.read_response()
            assert (status, body) == (200, b"ok\n")
            await stream.aclose()


async def test_malformed_request_gets_400_and_the_connection_closes() -> None:
    app, _, _ = make_app()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            stream = await serve_memory(app, nursery)
            await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
            reply = await read_all(stream)
            assert reply.startswith(b"HTTP/1.1 400 ")
            assert b"connection: close" in reply


async def test_oversized_head_and_body_are_refused() -> None:
    app, _, _ = make_app()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            stream = await serve_memory(app, nursery)
            huge = b"x" * (MAX_REQUEST_HEAD_BYTES + 10)
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + huge)
            reply = await read_all(stream)
            assert reply.startswith(b"HTTP/1.1 431 ")

            stream = await serve_memory(app, nursery)
            size = MAX_REQUEST_BODY_BYTES + 1
            await stream.send_all(
                b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
                + b"y" * size
            )
            assert (await read_all(stream)).startswith(b"HTTP/1.1 413 ")


async def test_at_the_limit_a_new_connection_closes_the_longest_waiting_one() -> None:
    app, _, _ = make_app()
    held = Held(2)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            first = Client(await serve_memory(app, nursery, held=held))
            assert (await first.get("/healthz"))[0] == 200  # then idles (keep-alive)
            silent = await serve_memory(app, nursery, held=held)  # sends nothing
            assert (await first.get("/metrics"))[0] == 200  # first now waits after silent
            probe = Client(await serve_memory(app, nursery, held=held))
            assert await read_all(silent) == b""  # closed to make room: it waited longest
            assert (await probe.get("/healthz"))[0] == 200
            assert held.evicted == 1 and len(held) == 2
            probe2 = Client(await serve_memory(app, nursery, held=held))
            assert await read_all(first.stream) == b""  # then the kept-alive one
            assert (await probe2.get("/readyz"))[0] == 200
            await probe.stream.aclose()
            await probe2.stream.aclose()


async def test_idle_and_slow_requests_time_out(autojump_clock: trio.testing.MockClock) -> None:
    app, _, _ = make_app()
    with trio.fail_after(200):
        async with trio.open_nursery() as nursery:
            # a new connection: its first request whole within request_timeout of the accept
            silent = await serve_memory(app, nursery, request_timeout=5, idle_timeout=30)
            start = trio.current_time()
            assert await read_all(silent) == b""  # closed silently
            assert trio.current_time() - start == pytest.approx(5)

            # kept alive after a request: idle_timeout for the next one to start
            kept = Client(await serve_memory(app, nursery, request_timeout=5, idle_timeout=30))
            assert (await kept.get("/healthz"))[0] == 200
            start = trio.current_time()
            assert await read_all(kept.stream) == b""
            assert trio.current_time() - start == pytest.approx(30)

            # slowloris: a head trickled in never completes it within request_timeout
            slow = await serve_memory(app, nursery, request_timeout=5, idle_timeout=30)
            start = trio.current_time()

            async def trickle() -> None:
                try:
                    for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n":
                        await slow.send_all(bytes([byte]))
                        await trio.sleep(1)
                except trio.BrokenResourceError:
                    pass  # closed on us

            nursery.start_soon(trickle)
            assert await read_all(slow) == b""
            assert trio.current_time() - start == pytest.approx(5)

            body = await serve_memory(app, nursery, request_timeout=5, idle_timeout=30)
            await body.send_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            assert (await read_all(body)).startswith(b"HTTP/1.1 408 ")


async def test_a_peer_that_never_reads_loses_its_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, _, _ = make_app()
    client, server = trio.testing.lockstep_stream_pair()  # send_all waits for the reader
    held = Held(1)
    with trio.fail_after(SEND_TIMEOUT_SECONDS + 5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_connection, app, server, held, 5, 30)
            await client.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            start = trio.current_time()
        # the server gave up on the send and released its slot
        assert trio.current_time() - start == pytest.approx(SEND_TIMEOUT_SECONDS)
        assert len(held) == 0


@settings(max_examples=100, deadline=None)
@given(garbage=st.binary(max_size=300))
def test_garbage_never_escapes_the_connection(garbage: bytes) -> None:
    app, _, _ = make_app()

    async def main() -> None:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                stream = await serve_memory(app, nursery, request_timeout=1, idle_timeout=1)
                await stream.send_all(garbage)
                await stream.send_eof()
                reply = await read_all(stream)
                assert reply == b"" or reply.startswith(b"HTTP/1.1 ")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- the server on loopback, with a real HTTP client ------------------------------------


async def test_serve_http_on_loopback_with_urllib() -> None:
    app, metrics, relay = make_app(debug=True)
    metrics.connection_accepted()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            assert isinstance(port, int) and port > 0
            base = f"http://127.0.0.1:{port}"

            def fetch(path: str) -> tuple[int, bytes]:
                try:
                    with urllib.request.urlopen(base + path, timeout=TIMEOUT) as r:
                        return r.status, r.read()
                except urllib.error.HTTPError as e:
                    with e:
                        return e.code, e.read()

            status, body = await trio.to_thread.run_sync(fetch, "/metrics")
            assert status == 200
            assert b"kafka_fetch_proxy_client_connections_accepted_total 1.0" in body
            assert await trio.to_thread.run_sync(fetch, "/healthz") == (200, b"ok\n")
            relay.brokers_reachable = 0
            assert (await trio.to_thread.run_sync(fetch, "/readyz"))[0] == 503
            status, body = await trio.to_thread.run_sync(fetch, "/debug/sessions")
            assert (status, json.loads(body)) == (200, relay.sessions)
            assert (await trio.to_thread.run_sync(fetch, "/nope"))[0] == 404
            nursery.cancel_scope.cancel()


async def test_probes_are_answered_however_many_idle_sockets_are_open() -> None:
    """Before: 16 idle sockets took every slot for 60 s and /healthz answered 503."""
    from proxy.observe import healthcheck

    app, _, _ = make_app()
    sockets: list[trio.SocketStream] = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            for n in range(MAX_CONNECTIONS + 16):
                sock = await trio.open_tcp_stream("127.0.0.1", port)
                if n % 2:  # half of them start a request and never finish it
                    await sock.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                sockets.append(sock)
            await trio.testing.wait_all_tasks_blocked()  # every one accepted and waiting

            def fetch(path: str) -> int:
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}{path}", timeout=TIMEOUT
                    ) as r:
                        return int(r.status)
                except urllib.error.HTTPError as e:
                    with e:
                        return e.code

            for path in ("/healthz", "/metrics", "/readyz", "/healthz"):
                assert await trio.to_thread.run_sync(fetch, path) == 200, path
            address = f"127.0.0.1:{port}"
            assert await trio.to_thread.run_sync(healthcheck.main, ["--address", address], {}) == 0
            for sock in sockets:
                await sock.aclose()
            nursery.cancel_scope.cancel()


def test_refresh_runs_before_each_scrape_and_its_failure_is_not_fatal() -> None:
    metrics = Metrics(process_metrics=False)
    calls: list[int] = []

    def refresh() -> None:
        calls.append(1)
        metrics.set_memory_budget(used=len(calls) * 100)
        if len(calls) == 2:
            raise RuntimeError("boom")

    app = ObserveApp(metrics.registry, lambda: Readiness(True), refresh=refresh)
    first = app.handle("GET", "/metrics")
    assert b"kafka_fetch_proxy_memory_budget_used_bytes 100.0" in first.body
    second = app.handle("GET", "/metrics")
    assert second.status == 200  # served as it is
    assert b"kafka_fetch_proxy_memory_budget_used_bytes 200.0" in second.body
    assert app.handle("GET", "/healthz").status == 200 and len(calls) == 2
