"""AddressBook (which listener stands for which broker) and the fixed log keys."""

from __future__ import annotations

import io
import json

import structlog

from proxy import logs
from proxy.relay.addresses import AddressBook


def test_first_sight_binds_once_and_tracks_moves() -> None:
    binds: list[tuple[int, int]] = []

    def bind(node_id: int, port: int) -> int:
        binds.append((node_id, port))
        return port or 40000 + node_id

    book = AddressBook("localhost", lambda n: 9093 + n, bind)
    assert book.resolve(1, "k1", 9092) == ("localhost", 9094)
    assert book.resolve(1, "k1-moved", 9999) == ("localhost", 9094)
    assert binds == [(1, 9094)]
    assert book.upstream[1] == ("k1-moved", 9999)
    assert book.resolve(-1, "", -1) is None


def test_failed_bind_is_retried_next_time() -> None:
    results = iter([None, 5555])
    book = AddressBook("h", lambda n: 0, lambda n, p: next(results))
    assert book.resolve(3, "k3", 1) is None
    assert book.resolve(3, "k3", 1) == ("h", 5555)


def test_logs_are_json_with_documented_keys_only() -> None:
    out = io.StringIO()
    logs.configure("info", stream=out)
    try:
        structlog.contextvars.bind_contextvars(conn_id="c1", client_addr="1.2.3.4:5")
        log = logs.get_logger()
        log.info("connection_closed", reason="client_closed", payload=b"secret", records="x")
        log.debug("request", api_key=1)  # below the level
    finally:
        structlog.contextvars.clear_contextvars()
        structlog.reset_defaults()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert set(entry) <= logs.DOCUMENTED_KEYS
    assert entry["event"] == "connection_closed" and entry["conn_id"] == "c1"
    assert "secret" not in lines[0] and "payload" not in entry
