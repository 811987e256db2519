"""The least a trio relay does: bytes from the client to one broker and back, nothing else.

    .venv/bin/python -m bench.trio_relay --upstream 127.0.0.1:9092 [--listen 127.0.0.1:0]

It prints ``bootstrap=HOST:PORT`` once it listens.  Per client connection it opens one
connection to *upstream* and runs two trio tasks, each reading what arrived (at most
64 KiB) and writing it to the other side, on the sockets the proxy itself uses
(``proxy.server.sockets.LeanSocketStream``: one scheduler turn per read, none per
write the kernel takes at once).  No framing, no header, no metrics, no address
rewriting: the broker itself advertises the relay's port, on a listener of its own
(``bench.stack``'s ``FLOOR``, as haproxy has ``RELAY``).

It is the benchmark's floor for the proxy's runtime, not a product: what one small
fetch costs on this machine in any relay written on Python and trio, measured in the
same run as haproxy and the proxy (``fetch_cpu``'s ``trio_relay`` arrangement).
What the proxy costs above it (CPU per small fetch, latency added) is the proxy's own work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import trio

from proxy.server.sockets import LeanSocketStream

READ_BYTES = 64 * 1024


async def _pump(source: LeanSocketStream, sink: LeanSocketStream, both: trio.CancelScope) -> None:
    """Copy until *source* ends or either side fails; then the connection ends (*both*)."""
    try:
        while data := await source.receive_some(READ_BYTES):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        both.cancel()


async def _relay(client: trio.SocketStream, host: str, port: int) -> None:
    try:
        upstream = await trio.open_tcp_stream(host, port)
    except OSError:
        await client.aclose()
        return
    a, b = LeanSocketStream(client), LeanSocketStream(upstream)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, a, b, nursery.cancel_scope)
            nursery.start_soon(_pump, b, a, nursery.cancel_scope)
    finally:
        await client.aclose()
        await upstream.aclose()


async def serve(listen: str, upstream: str) -> None:
    host, _, port = upstream.rpartition(":")
    lhost, _, lport = listen.rpartition(":")
    listeners = await trio.open_tcp_listeners(int(lport), host=lhost)
    bound = listeners[0].socket.getsockname()
    print(f"bootstrap={bound[0]}:{bound[1]}", flush=True)

    async def handle(client: trio.SocketStream) -> None:
        await _relay(client, host, int(port))

    await trio.serve_listeners(handle, listeners)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the broker")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free)")
    args = parser.parse_args(argv)
    try:
        trio.run(serve, args.listen, args.upstream)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
