"""A plain TCP stream with one scheduler turn per receive and none per uncontended send.

``trio.SocketStream`` makes every call a checkpoint: ``receive_some`` first tries
``recv`` (an ``EAGAIN`` when the peer has not answered yet), then waits for the
socket to become readable, reads, and yields once more after the read;
``send_all`` yields after a send that went through at once.  A connection
relaying small requests pays two extra trips through the scheduler (each an
``epoll_wait`` and a task switch) and a wasted ``recv`` per message and leg.

:class:`LeanSocketStream` takes the same socket and

- waits until it is readable, then reads once (a cancelled receive consumed
  nothing, as ``DrainableStream`` needs);
- sends at once and waits only when the kernel's buffer is full (a send that
  went through does not yield: the loops that call it yield where they wait
  for the next input, so no loop runs without a checkpoint).
- ``receive_into`` reads whatever has arrived into a caller's buffer (a large
  frame's body, where it stays), as ``receive_some`` does.  It wakes at the first
  byte, never later: a reader that waits for more (``SO_RCVLOWAT``) leaves what
  arrived unread and, while that is less than a segment (64 KiB on loopback),
  unacknowledged; a broker waiting for that acknowledgement sends again when its
  tail-loss probe fires (about 8 ms later here).  A paced consumer's 64 KiB fetches
  took 5-10 ms instead of 1-2, two in five of them, each after a spurious
  retransmission (``nstat``: ``TCPLossProbes``, ``TCPDSACKRecv``; BENCHMARKS.md).
- ``receive_now`` reads what has already arrived without waiting (None when
  nothing has): a caller that expects the bytes to be there already (a
  frame's body right behind its length prefix) saves the wait's turn.
- ``send_now`` writes what the kernel takes at once and says how much (a
  caller that must not wait for a slow reader hands the rest to a task that
  may).

Everything else (TCP_NODELAY and the rest of the socket's setup, closing) stays
with the ``SocketStream`` it wraps.  Errors are trio's: ``ClosedResourceError``
once the socket is closed, ``BrokenResourceError`` (from the ``OSError``) when
the peer resets.  Only for plain TCP: a TLS stream keeps its own.
"""

from __future__ import annotations

import errno
import os

import trio

_CLOSED_ERRNOS = (errno.EBADF, errno.ENOTSOCK)


class LeanSocketStream(trio.abc.Stream):
    """``stream``'s data path with fewer scheduler turns (see the module docstring)."""

    __slots__ = ("_socket", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._socket = stream.socket

    def _fd(self) -> int:
        # Read on every call, never kept: a closed socket reports -1, a kept number
        # could name another socket that reused it.
        fd = self._socket.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        return fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            max_bytes = 64 * 1024
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        while True:
            self._fd()  # closed: ClosedResourceError, not a wait on no socket
            await trio.lowlevel.wait_readable(self._socket)
            try:
                return os.read(self._fd(), max_bytes)
            except BlockingIOError:
                continue  # woken without data (spurious): wait again
            except OSError as exc:
                raise _stream_error(exc) from exc

    async def wait_readable(self) -> None:
        """Until the socket has bytes (or its end) to read, which ``receive_now`` then reads:
        a caller that may decide not to read after the wait (``DrainableStream``)."""
        self._fd()  # closed: ClosedResourceError, not a wait on no socket
        await trio.lowlevel.wait_readable(self._socket)

    def receive_now(self, max_bytes: int) -> bytes | None:
        """What the socket holds now, at most *max_bytes* (``b""`` at its end), or None
        when nothing has arrived: never waits, so it costs no scheduler turn (a read the
        caller expects to find data, such as a frame's body right behind its prefix)."""
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        try:
            return os.read(self._fd(), max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _stream_error(exc) from exc

    async def receive_into(self, view: memoryview) -> int:
        """Read into *view* what has arrived (waiting for the first byte): how many bytes,
        0 at the socket's end.  A large frame's body is read where it stays (no copy, no
        join)."""
        if not view:
            raise ValueError("an empty view takes nothing")
        while True:
            self._fd()
            await trio.lowlevel.wait_readable(self._socket)
            try:
                return os.readv(self._fd(), (view,))
            except BlockingIOError:
                continue  # woken without data (spurious): wait again
            except OSError as exc:
                raise _stream_error(exc) from exc

    def receive_into_now(self, view: memoryview) -> int | None:
        """``receive_into`` without waiting: None when nothing has arrived."""
        if not view:
            raise ValueError("an empty view takes nothing")
        try:
            return os.readv(self._fd(), (view,))
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _stream_error(exc) from exc

    def send_now(self, data: bytes | bytearray | memoryview) -> int:
        """Bytes of *data* the kernel takes now (0 when its buffer is full): never waits,
        so the caller keeps what was not taken and writes it later, in order."""
        try:
            return os.write(self._fd(), data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _stream_error(exc) from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with memoryview(data) as view:
            total = len(view)
            sent = 0
            while True:
                try:
                    sent += os.write(self._fd(), view[sent:] if sent else view)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise _stream_error(exc) from exc
                if sent >= total:
                    return
                self._fd()
                await trio.lowlevel.wait_writable(self._socket)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _stream_error(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    if exc.errno in _CLOSED_ERRNOS:
        return trio.ClosedResourceError("the socket was closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


def lean(stream: trio.abc.Stream) -> trio.abc.Stream:
    """``stream`` as a :class:`LeanSocketStream` when it is plain TCP, else unchanged."""
    if isinstance(stream, trio.SocketStream):
        return LeanSocketStream(stream)
    return stream
