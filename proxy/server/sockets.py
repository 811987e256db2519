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
- ``receive_into`` can wait for more than the first bytes (``wait_for``: the
  socket's ``SO_RCVLOWAT``, at most a quarter of its receive buffer): a large
  frame's body, whose size is known, is read in fewer and larger reads, each a
  wait and a scheduler turn less (the kernel wakes the reader when that much is
  there, or at the connection's end).
- ``receive_now`` reads what has already arrived without waiting (None when
  nothing has): a caller that expects the bytes to be there already (a
  frame's body right behind its length prefix) saves the wait's turn.  ``send_now`` writes what the kernel takes at once and says how much (a
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
import socket

import trio

_CLOSED_ERRNOS = (errno.EBADF, errno.ENOTSOCK)
_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", None)

BODY_WAKE_BYTES = 1024 * 1024
"""A large body's reads wait until this much of it has arrived (or its rest, when less
is missing, or a quarter of the socket's receive buffer, when that is less): reads of up
to 1 MiB where a read of whatever had arrived took about 250 KB, so a large response
costs a third of the waits, each an ``epoll_wait`` and a scheduler turn.  The frame's end
is never waited past (its rest always arrives), and its buffer is allocated already: this
changes when it is read, not how much is held."""


class LeanSocketStream(trio.abc.Stream):
    """``stream``'s data path with fewer scheduler turns (see the module docstring)."""

    __slots__ = ("_low_water", "_socket", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._socket = stream.socket
        self._low_water = 1 if _RCVLOWAT is not None else 0
        """The socket's SO_RCVLOWAT as last set (1: the kernel's default; 0: never set,
        where the platform has no such option or refused it)."""

    def _wake_at(self, nbytes: int) -> None:
        """Wake the next wait for readable when *nbytes* have arrived (or at the end), or
        a quarter of what the socket's receive buffer holds, if that is less: the kernel
        would otherwise grow the buffer for the mark and clamp the window the broker may
        fill to it, so the broker would stop at each mark until this reads."""
        if not self._low_water or nbytes == self._low_water == 1:
            return
        try:
            if nbytes > 1:
                room = self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
                nbytes = max(1, min(nbytes, room))
                if nbytes == self._low_water:
                    return
            self._socket.setsockopt(socket.SOL_SOCKET, _RCVLOWAT, nbytes)  # type: ignore[arg-type]
        except OSError:
            self._low_water = 0  # not on this socket: every wait wakes at the first byte
            return
        self._low_water = nbytes

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
            if self._low_water > 1:  # a body's mark is still set: wake at the first byte
                self._wake_at(1)
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
        if self._low_water > 1:  # a body's mark is still set: wake at the first byte
            self._wake_at(1)
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

    async def receive_into(self, view: memoryview, wait_for: int = 1) -> int:
        """Read into *view* what has arrived (waiting for some): how many bytes, 0 at the
        socket's end.  A large frame's body is read where it stays (no copy, no join).

        *wait_for*: wait until that many bytes are there (at most ``len(view)``), or the
        socket's end, rather than for the first one: only for bytes that will come (the
        rest of a frame whose length is known), or the wait would last until the end."""
        if not view:
            raise ValueError("an empty view takes nothing")
        low = max(1, min(wait_for, len(view)))
        while True:
            self._fd()
            self._wake_at(low)
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
