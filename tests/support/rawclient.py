"""A tiny blocking Kafka-protocol client: kio requests in, decoded kio responses out.

    with RawClient("127.0.0.1:9092") as c:
        meta = c.call(3, 12, {"topics": None, "allow_auto_topic_creation": False, ...})

Requests are built with the dev cluster's :func:`devbroker.build.build` and
encoded and decoded with the project's codec (``proxy.protocol.codec``), so the
same bytes go to any broker.  One request at a time, every socket operation
bounded by ``timeout``.  :meth:`RawClient.send_raw` sends a hand-made frame (a
version no schema knows), and :meth:`RawClient.is_closed_by_peer` tells whether
the broker closed the connection instead of answering.  A ``deadline`` (a
``time.monotonic()`` value) bounds every socket operation absolutely: once it has
passed, any further operation raises :class:`TimeoutError`.
"""

from __future__ import annotations

import socket
import struct
import time
from types import TracebackType
from typing import Any

from devbroker.build import build
from proxy.protocol import codec

DEFAULT_TIMEOUT = 15.0


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        return address
    host, _, port = address.rpartition(":")
    return host, int(port)


class PeerClosed(ConnectionError):
    """The broker closed the connection before a whole response arrived."""


class RawClient:
    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        client_id: str | None = "differential",
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float | None = None,
    ) -> None:
        self.address = parse_address(address)
        self.client_id = client_id
        self.deadline = time.monotonic() + timeout if deadline is None else deadline
        self.sock = socket.create_connection(self.address, timeout=self._remaining())
        self._correlation_id = 0

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the test's deadline has passed")
        return left

    def _sendall(self, data: bytes) -> None:
        self.sock.settimeout(self._remaining())
        self.sock.sendall(data)

    def _recv(self, n: int) -> bytes:
        self.sock.settimeout(self._remaining())
        return self.sock.recv(n)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # -- requests ------------------------------------------------------------------

    def _next_id(self) -> int:
        self._correlation_id += 1
        return self._correlation_id

    def send(self, request: Any) -> int:
        """Send a kio request; its correlation id."""
        cid = self._next_id()
        frame = codec.encode_request(request, cid, self.client_id)
        self._sendall(struct.pack(">i", len(frame)) + frame)
        return cid

    def send_raw(self, api_key: int, version: int, body: bytes, *, header_version: int = 2) -> int:
        """Send a frame with a hand-made header (1: client id; 2: client id + tags) and body."""
        cid = self._next_id()
        head = struct.pack(">hhi", api_key, version, cid)
        raw_id = (self.client_id or "").encode()
        head += struct.pack(">h", len(raw_id)) + raw_id
        if header_version == 2:
            head += b"\x00"
        frame = head + body
        self._sendall(struct.pack(">i", len(frame)) + frame)
        return cid

    def receive_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._read_exactly(4))
        return self._read_exactly(size)

    def receive(self, api_key: int, version: int, correlation_id: int) -> Any:
        cid, body = codec.decode_response(api_key, version, self.receive_frame(), strict=True)
        if cid != correlation_id:
            raise AssertionError(f"correlation id {cid}, expected {correlation_id}")
        return body

    def request(self, request: Any) -> Any:
        """Send a kio request and return the decoded response body."""
        cid = self.send(request)
        return self.receive(int(request.__api_key__), int(request.__version__), cid)

    def call(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        """Build a request of (api_key, version) from plain data, send it, decode the answer."""
        return self.request(make_request(api_key, version, data))

    def is_closed_by_peer(self) -> bool:
        """True if the broker closed the connection (EOF or reset) within the timeout.

        False if a byte arrived instead; a timeout raises (neither happened in time).
        """
        try:
            data = self._recv(1)
        except ConnectionResetError:
            return True
        return data == b""

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._recv(n - len(buf))
            if not chunk:
                raise PeerClosed(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)


def make_request(api_key: int, version: int, data: dict[str, Any]) -> Any:
    schema = codec.request_schema(api_key, version)
    if schema is None:
        raise ValueError(f"kio knows no request for api key {api_key} v{version}")
    return build(schema, data)
