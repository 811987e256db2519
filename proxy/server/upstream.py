"""Opening connections to the real brokers (TCP, optional TLS) and TLS contexts."""

from __future__ import annotations

import ssl

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
