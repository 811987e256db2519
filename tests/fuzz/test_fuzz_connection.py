"""Bad frames through a real proxy: that connection closes with one log line, others go on."""

from __future__ import annotations

import socket
import struct
import time

import pytest
import structlog
from support.stack import ProxyStack

from proxy.protocol import codec
from proxy.protocol.framing import encode_frame

TIMEOUT = 20.0


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def _api_versions(cid: int) -> bytes:
    return encode_frame(struct.pack(">hhih", 18, 0, cid, 4) + b"good")


def _closed(sock: socket.socket) -> bool:
    """True once the proxy closed *sock* (EOF or reset), within the timeout."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


@pytest.mark.integration
def test_garbage_and_undecodable_fetch_close_only_their_connection() -> None:
    # A Fetch v4 whose body stops after four bytes: valid framing, undecodable request.
    bad_fetch = struct.pack(">hhih", 1, 4, 5, 3) + b"bad" + b"\xff\xff\xff\xff"
    assert codec.request_schema(1, 4) is not None
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        stack = ProxyStack(nodes=1).start()
        try:
            good = _connect(stack.bootstrap)
            good.sendall(_api_versions(1))
            assert struct.unpack_from(">i", _read_frame(good))[0] == 1

            garbage = _connect(stack.bootstrap)
            garbage.sendall(b"\xff\xff\xff\xfe" + b"\x00" * 16)  # negative frame size
            undecodable = _connect(stack.bootstrap)
            undecodable.sendall(encode_frame(bad_fetch))
            assert _closed(garbage) and _closed(undecodable)

            for cid in range(2, 6):  # the other client is unaffected
                good.sendall(_api_versions(cid))
                assert struct.unpack_from(">i", _read_frame(good))[0] == cid
            deadline = time.monotonic() + TIMEOUT
            while len([e for e in logs if e.get("reason") == "protocol_error"]) < 2:
                assert time.monotonic() < deadline, "no protocol_error log lines"
                time.sleep(0.01)
            good.close()
            garbage.close()
            undecodable.close()
        finally:
            stack.stop()
    errors = [e for e in logs if e.get("reason") == "protocol_error"]
    assert len(errors) == 2
    assert len({e["conn_id"] for e in errors}) == 2, "one line per bad connection"
    assert all(e["event"] == "connection_closed" and e["log_level"] == "warning" for e in errors)
    assert any("negative frame size" in e["error"] for e in errors)
    assert any("FetchRequest v4" in e["error"] for e in errors)
    assert not [e for e in logs if e["event"] == "connection_failed"], "a traceback was logged"
    per_conn = {e["conn_id"]: 0 for e in errors}
    for e in logs:
        if e.get("conn_id") in per_conn and e["log_level"] in ("warning", "error"):
            per_conn[e["conn_id"]] += 1
    assert set(per_conn.values()) == {1}, per_conn
