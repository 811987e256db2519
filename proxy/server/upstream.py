"""Opening connections to the real brokers (TCP, optional TLS), TLS contexts, and the
client connection's upstream stream that opens on its first request (``LazyUpstream``)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import trio

from ..config import DownstreamTls, HostPort, UpstreamTls


def client_ssl_context(tls: UpstreamTls) -> ssl.SSLContext | None:
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.check_hostname = tls.check_hostname
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def server_ssl_context(tls: DownstreamTls) -> ssl.SSLContext | None:
    if not tls.enabled:
        return None
    assert tls.cert_file is not None  # the schema requires it when enabled
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.ca_file:
        ctx.load_verify_locations(tls.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def open_upstream(address: HostPort, ssl_context: ssl.SSLContext | None) -> trio.abc.Stream:
    """Connect and (with TLS) handshake; raises OSError or ssl.SSLError.  Callers bound the time."""
    stream: trio.abc.Stream = await trio.open_tcp_stream(address.host, address.port)
    if ssl_context is None:
        return stream
    tls = trio.SSLStream(stream, ssl_context, server_hostname=address.host)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise
    return tls


class LazyUpstream(trio.abc.Stream):
    """A client connection's upstream stream, connected by its first write.

    An accepted client costs no broker connection until it sends a request the
    proxy relays: a connection that never sends one, or sends only what the proxy
    answers itself (an ApiVersions version it does not support), opens none.
    Reads wait until the first write has connected.  ``connect()`` returns the
    stream (``on_open(stream)`` is told, so the owner can talk to it directly
    from then on) or None when no broker answers: ``failed`` is set and
    ``on_failure()`` is called, which is expected to cancel the connection (the
    owner logs why); if it does not, the write raises ``BrokenResourceError``.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[trio.abc.Stream | None]],
        *,
        on_open: Callable[[trio.abc.Stream], None],
        on_failure: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._on_open = on_open
        self._on_failure = on_failure
        self.stream: trio.abc.Stream | None = None
        """The broker connection, once the first write opened it."""
        self.failed = False
        """The first write found no broker to connect to."""
        self._settled = trio.Event()
        """Set once connected, failed or closed: what waiting reads wait for."""

    def detach(self) -> None:
        """Forget the owner's callbacks (its connection ended; they close over it)."""
        self._on_open = _ignore_stream
        self._on_failure = _ignore

    async def _open(self) -> trio.abc.Stream:
        if self.stream is not None:
            return self.stream
        if self._settled.is_set():
            raise trio.BrokenResourceError("no upstream connection")
        stream = await self._connect()
        if stream is None:
            self.failed = True
            self._settled.set()
            self._on_failure()
            await trio.lowlevel.checkpoint()  # where on_failure's cancellation lands
            raise trio.BrokenResourceError("no upstream broker reachable")
        self.stream = stream
        self._settled.set()
        self._on_open(stream)
        return stream

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        stream = self.stream if self.stream is not None else await self._open()
        await stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        if self.stream is not None:
            await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.stream is None:
            await self._settled.wait()
            if self.stream is None:
                raise trio.ClosedResourceError("no upstream connection")
        return await self.stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        self._settled.set()
        if self.stream is not None:
            await self.stream.aclose()
        else:
            await trio.lowlevel.checkpoint()


def _ignore_stream(stream: trio.abc.Stream) -> None:
    pass


def _ignore() -> None:
    pass
