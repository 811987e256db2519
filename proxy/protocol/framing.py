"""Size-prefixed framing (Kafka: a 4-byte big-endian length, then that many bytes).

The decoder checks the announced size against the limit *before* buffering the
body, so a hostile length prefix cannot make us allocate.  On the client leg a
second, smaller limit applies to every request that is not a Produce: the API
key follows the size, so it is read (two bytes) before any of the body is
waited for.  What the decoder still expects of the frame in progress
(``missing``) is what the edge reserves memory for before reading it.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable, Iterable

from .errors import FrameTooLarge, ProtocolError, TruncatedFrame

_SIZE = struct.Struct(">i")

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
_PRODUCE_KEY = _SIZE.pack(0)[2:]  # api key 0 as an int16: may use the whole max_frame_bytes
COPY_BELOW = 64 * 1024
"""``frame_chunks`` joins payloads smaller than this; larger ones are written as they are."""

Buffer = bytes | bytearray | memoryview

Frame = bytes | bytearray
"""A whole frame body as the decoder hands it on: ``bytes``, or a ``bytearray`` when it
was read in place (``FrameDecoder``'s *preallocate*, Fetch responses from upstream)."""


class Gathered:
    """One frame body held as the buffers it is made of, in order (a gather list).

    An encoded Fetch response whose records are views into the upstream frame
    (``proxy.protocol.codec.encode_response_gathered``) is written to the
    client from these pieces directly, so the records are never copied into a
    second buffer as large as the response.  ``head`` is the first piece; the
    encoder puts the response header and the fields before the first records
    in it.
    """

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: Iterable[Buffer]) -> None:
        self.parts: tuple[Buffer, ...] = tuple(parts)
        if not self.parts:
            raise ValueError("a gathered frame needs at least one part")
        self.nbytes = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self.nbytes

    @property
    def head(self) -> Buffer:
        return self.parts[0]

    def with_head(self, head: Buffer) -> Gathered:
        """The same frame with its first piece replaced (same length or not)."""
        return Gathered((head, *self.parts[1:]))

    def join(self) -> bytes:
        """The frame as one bytes object (a copy: tests and small frames only)."""
        return b"".join(self.parts)


Payload = bytes | bytearray | Gathered
"""A frame body to write: one buffer, or a gather list of them."""


def payload_bytes(payload: Payload) -> bytes:
    """*payload* as one bytes object (copied unless it is ``bytes``)."""
    if isinstance(payload, Gathered):
        return payload.join()
    return payload if isinstance(payload, bytes) else bytes(payload)


def encode_frame(payload: Buffer) -> bytes:
    return _SIZE.pack(len(payload)) + bytes(payload)


def frame_chunks(payloads: Iterable[Payload], copy_below: int = COPY_BELOW) -> list[Buffer]:
    """The size-prefixed frames of *payloads* as buffers to write in order.

    Length prefixes and small buffers are joined into as few buffers as
    possible (one write for a burst of small responses); a buffer of
    *copy_below* bytes or more, a whole payload or a part of a ``Gathered``
    one, is its own buffer, the very object given, so a large Fetch response
    is never copied just to put four bytes in front of it.
    """
    out: list[Buffer] = []
    small: list[Buffer] = []
    for payload in payloads:
        small.append(_SIZE.pack(len(payload)))
        for part in payload.parts if isinstance(payload, Gathered) else (payload,):
            if not part:
                continue
            if len(part) < copy_below:
                small.append(part)
            else:
                if small:
                    out.append(b"".join(small))
                    small = []
                out.append(part)
    if small:
        out.append(b"".join(small))
    return out


def _resizer() -> Callable[[bytearray, int], int] | None:
    """CPython's ``PyByteArray_Resize`` (None elsewhere): a body taken again is given its new
    size within what it already has allocated, with no copy and no fill."""
    try:
        resize = ctypes.pythonapi.PyByteArray_Resize
    except (AttributeError, ValueError):
        return None
    resize.argtypes = (ctypes.py_object, ctypes.c_ssize_t)
    resize.restype = ctypes.c_int
    return resize


def _references_in_a_list() -> int:
    held = [bytearray(1)]
    return sys.getrefcount(held[0])  # (the same shape as BodyPool.take's test)


_RESIZE = _resizer()
_UNREFERENCED = _references_in_a_list()


def _idle_bytes(buffers: list[bytearray]) -> int:
    """Bytes allocated to those of *buffers* that nothing else refers to (``BodyPool``,
    ``CopyPool``; read as ``BodyPool.take`` reads a reference count)."""
    total = 0
    for i in range(len(buffers)):
        if sys.getrefcount(buffers[i]) == _UNREFERENCED:
            total += buffers[i].__alloc__()
    return total


def _still_kept(buffers: list[bytearray], taken: set[int]) -> tuple[list[bytearray], int]:
    """*buffers* without the idle ones not in *taken* (ids), and the bytes those had
    allocated: a pool's ``release_idle``."""
    kept: list[bytearray] = []
    freed = 0
    for i in range(len(buffers)):
        if sys.getrefcount(buffers[i]) == _UNREFERENCED and id(buffers[i]) not in taken:
            freed += buffers[i].__alloc__()
        else:
            kept.append(buffers[i])
    return kept, freed


class BodyPool:
    """Large frame bodies read in place (``FrameDecoder``'s *preallocate*), used again once
    nothing refers to them any more.

    A fresh ``bytearray`` of a few MiB costs more CPU than reading the bytes into it:
    Python fills it with zeros, and every page of it is a fresh mapping (large
    buffers are mapped and unmapped, ``proxy.server.allocator``), faulted in on
    first touch: on this project's 2-core VM, 0.9 ms per MiB, about 30 % of the
    proxy's CPU relaying uncompressed data.  So bodies are kept, at most
    *max_bodies*, and one is taken again for a frame at most 1/8 smaller than its
    allocated size (resized in place, so the memory budget, which counts the
    frame, is short by at most an eighth of it), or else the largest one smaller
    than the frame is grown to it (``take``), when nothing refers to it: its
    reference count says that no frame, view or record slice of it is alive (a
    response written to the client, its held batches dropped), so its old bytes are
    seen by no one when the next frame is read over them.

    *room*: the bytes bodies may keep while idle (the memory budget's free bytes,
    read at every take); idle bodies past it are let go, so kept bodies never
    take memory the budget would give to responses.  Without CPython's
    ``PyByteArray_Resize`` every take is a fresh body.
    """

    __slots__ = ("_bodies", "_taken", "max_bodies", "reused", "room")

    def __init__(self, *, max_bodies: int = 8, room: Callable[[], int] | None = None) -> None:
        if max_bodies < 0:
            raise ValueError("max_bodies must be >= 0")
        self._bodies: list[bytearray] = []
        self._taken: set[int] = set()
        """ids of the bodies kept that were taken since the last ``release_idle``."""
        self.max_bodies = max_bodies
        self.room = room
        self.reused = 0
        """Bodies taken again rather than made."""

    @property
    def kept_bytes(self) -> int:
        """Bytes allocated to the bodies kept (in use or idle)."""
        return sum(b.__alloc__() for b in self._bodies)

    def idle_bytes(self) -> int:
        """Bytes allocated to the bodies kept that nothing refers to."""
        return _idle_bytes(self._bodies)

    def take(self, size: int) -> bytearray:
        """A body of *size* bytes (its content is not zeroed when it is one taken again).

        An idle body at most an eighth larger is resized in place.  Failing that, the
        largest idle body smaller than *size* is grown to it: the allocator extends its
        mapping (``mremap``), so only the pages it adds are faulted in, and its
        allocation is then *size* (or at most an eighth more, CPython's own rounding), as
        the budget counts it.  Only when no idle body is either is a fresh one made."""
        bodies = self._bodies
        resize = _RESIZE
        found = -1
        smaller = -1  # the largest idle body below size (grown if none fits)
        idle: list[int] = []
        for i in range(len(bodies)):
            if sys.getrefcount(bodies[i]) != _UNREFERENCED:
                continue  # in use: a frame, a view or a record slice of it is alive
            alloc = bodies[i].__alloc__()
            if found < 0 and resize is not None and size < alloc <= size + size // 8 + 1:
                found = i
                continue
            if alloc <= size and (smaller < 0 or alloc > bodies[smaller].__alloc__()):
                smaller = i
            idle.append(i)
        if found < 0 and resize is not None and smaller >= 0:
            found = smaller
            idle.remove(smaller)
        if found >= 0 and resize is not None:
            body = bodies[found]
            resize(body, size)  # (ctypes.pythonapi raises if it fails)
            self.reused += 1
            self._taken.add(id(body))
        else:
            body = bytearray(size)
        self._let_go(idle, keep=body if found < 0 else None)
        return body

    def _let_go(self, idle: list[int], *, keep: bytearray | None) -> None:
        """Drop idle bodies past *room*, then keep the new body *keep* if there is a place
        (an idle body gives it its place when none is free)."""
        bodies = self._bodies
        room = None if self.room is None else max(0, self.room())
        drop: set[int] = set()
        if room is not None:
            total = sum(bodies[i].__alloc__() for i in idle)
            for i in idle:
                if total <= room:
                    break
                total -= bodies[i].__alloc__()
                drop.add(i)
        if keep is not None and len(bodies) - len(drop) >= self.max_bodies:
            spare = [i for i in idle if i not in drop]
            if spare:
                drop.add(spare[0])
            else:
                keep = None  # every kept body is in use: this one is not kept
        if drop:
            self._bodies = bodies = [b for i, b in enumerate(bodies) if i not in drop]
        if keep is not None and self.max_bodies:
            bodies.append(keep)
            self._taken.add(id(keep))

    def release_idle(self) -> int:
        """Let go of the idle bodies not taken since the last call (the server calls it every
        ``HEAP_TRIM_SECONDS``): after a burst the memory goes back within that time, while
        a steady stream of large frames keeps its bodies.  Returns the bytes let go."""
        taken, self._taken = self._taken, set()
        self._bodies, freed = _still_kept(self._bodies, taken)
        return freed


COPY_POOL_FROM = 128 * 1024
"""Bytes: a smaller copy is plain ``bytes`` (it comes from the heap, not a fresh mapping)."""


def copy_class(size: int) -> int:
    """The allocation a :class:`CopyPool` buffer gets for a copy of *size* bytes: the next
    of eight sizes per doubling, so at most an eighth more than it holds."""
    step = max(1, (1 << (size.bit_length() - 1)) >> 3)
    return -(-size // step) * step


class CopyPool:
    """Owned copies of the records the proxy holds for later answers, in buffers used again
    once nothing refers to them.

    The reuse buffer holds a partition's records that an answer did not take, copied out of
    the response frame so that it never keeps the frame alive.  Such a copy is a fresh
    mapping under the proxy's mmap threshold (``proxy.server.allocator``), faulted in page
    by page.  Copies of :data:`COPY_POOL_FROM` bytes or more come from here instead:
    ``bytearray`` buffers of eight sizes per doubling (:func:`copy_class`), each given its
    copy's exact size in place, so the memory budget, which counts the copy, is short by at
    most an eighth of it (as for ``BodyPool``'s frames).  A buffer is taken again when its
    reference count says that nothing refers to it (no run, view or answer holds it), so
    its old bytes are seen by no one when a copy is written over them.

    *room*, read at every copy while the buffers kept take more than it: the bytes idle
    buffers may keep; idle ones past it are let go, so kept buffers never take memory the
    budget would give to responses.  ``release_idle`` lets go of the idle ones not taken
    since its last call.  *per_class*: the buffers kept of one size.  Without CPython's
    ``PyByteArray_Resize`` every copy is ``bytes``.
    """

    __slots__ = ("_classes", "_kept", "_taken", "per_class", "reused", "room")

    def __init__(self, *, per_class: int = 32, room: Callable[[], int] | None = None) -> None:
        if per_class < 0:
            raise ValueError("per_class must be >= 0")
        self._classes: dict[int, list[bytearray]] = {}
        self._kept = 0
        """Bytes allocated to the buffers kept (in use or idle)."""
        self._taken: set[int] = set()
        """ids of the buffers kept that were taken since the last ``release_idle``."""
        self.per_class = per_class
        self.room = room
        self.reused = 0
        """Copies made into a buffer taken again."""

    @property
    def kept_bytes(self) -> int:
        """Bytes allocated to the buffers kept (in use or idle)."""
        return self._kept

    def idle_bytes(self) -> int:
        """Bytes allocated to the buffers kept that nothing refers to."""
        return sum(_idle_bytes(bodies) for bodies in self._classes.values())

    def copy(self, *parts: bytes | bytearray | memoryview) -> bytes | bytearray:
        """One owned buffer holding *parts* one after the other."""
        size = 0
        for part in parts:
            size += part.nbytes if type(part) is memoryview else len(part)
        resize = _RESIZE
        if size < COPY_POOL_FROM or resize is None or not self.per_class:
            return b"".join(parts)
        if self.room is not None and self._kept:
            room = max(0, self.room())
            if self._kept > room:
                self._let_go(room)
        alloc = copy_class(size)
        bodies = self._classes.get(alloc)
        if bodies is None:
            bodies = self._classes[alloc] = []
        body = None
        for i in range(len(bodies)):
            if sys.getrefcount(bodies[i]) == _UNREFERENCED:
                body = bodies[i]
                break
        if body is None:
            body = bytearray(alloc)
            if len(bodies) < self.per_class:
                bodies.append(body)
                self._kept += body.__alloc__()
        else:
            self.reused += 1
        resize(body, size)  # within its allocation: no copy, no fill
        self._taken.add(id(body))
        at = 0
        # Through a view: a bytearray's own slice assignment copies its source first (a
        # temporary as large as the copy, the fresh mapping this pool is here to avoid).
        with memoryview(body) as into:
            for part in parts:
                end = at + (part.nbytes if type(part) is memoryview else len(part))
                into[at:end] = part
                at = end
        return body

    def _let_go(self, room: int) -> None:
        """Let go of idle buffers until the idle ones keep at most *room* bytes."""
        idle = self.idle_bytes()
        for alloc, bodies in list(self._classes.items()):
            i = 0
            while idle > room and i < len(bodies):
                if sys.getrefcount(bodies[i]) == _UNREFERENCED:
                    size = bodies[i].__alloc__()
                    self._taken.discard(id(bodies[i]))
                    del bodies[i]
                    idle -= size
                    self._kept -= size
                else:
                    i += 1
            if not bodies:
                del self._classes[alloc]

    def release_idle(self) -> int:
        """Let go of the idle buffers not taken since the last call (the server calls it every
        ``HEAP_TRIM_SECONDS``, as for ``BodyPool``).  Returns the bytes let go."""
        taken, self._taken = self._taken, set()
        freed = 0
        for alloc, bodies in list(self._classes.items()):
            kept, let_go = _still_kept(bodies, taken)
            freed += let_go
            if kept:
                self._classes[alloc] = kept
            else:
                del self._classes[alloc]
        self._kept -= freed
        return freed


class FrameDecoder:
    """Feed bytes in, take whole frames out.

    A frame body is copied once.  Small frames are cut out of one receive
    buffer.  A body of *assemble_from* bytes or more (a large Fetch response)
    is collected as the pieces that arrive and joined once when complete, so
    it is neither copied on every growth of a buffer nor sliced out of one:
    while it arrives it costs its size, and for the one join twice that.

    *preallocate* (the upstream leg, whose frames' memory is reserved from
    their length prefix before their body is read): such a body is instead
    one ``bytearray`` of its announced size, allocated when the size is read,
    and the edge reads into it (``body_view``, then ``received``): the kernel
    copies the bytes to where they stay, with no pieces and no join.  Never on
    the client leg, where an announced size costs nothing until it arrives.
    *bodies*: where such bodies come from (a ``BodyPool``: used again once nothing
    refers to them; None: a fresh one each time).

    *max_request_frame_bytes* (requests only): a frame larger than this whose
    API key (the two bytes after the size) is not Produce is refused with
    ``FrameTooLarge`` as soon as those two bytes are in, before its body.
    """

    __slots__ = (
        "_body",
        "_buf",
        "_have",
        "_in_place",
        "_need",
        "_pieces",
        "assemble_from",
        "bodies",
        "max_frame_bytes",
        "max_request_frame_bytes",
        "preallocate",
    )

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        assemble_from: int = COPY_BELOW,
        max_request_frame_bytes: int | None = None,
        preallocate: bool = False,
        bodies: BodyPool | None = None,
    ) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        if max_request_frame_bytes is not None and max_request_frame_bytes <= 0:
            raise ValueError("max_request_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self.max_request_frame_bytes = max_request_frame_bytes
        self.assemble_from = assemble_from
        self._buf = bytearray()
        self._need: int | None = None  # body size of the frame being assembled
        self._pieces: list[bytes] | None = None  # a large body's pieces so far
        self._in_place = False  # the frame in progress is read in place (preallocate)
        self._body: bytearray | None = None  # its body, once allocated
        self._have = 0  # bytes in _pieces, or of _body filled
        self.preallocate = preallocate
        self.bodies = bodies

    @property
    def buffered(self) -> int:
        return len(self._buf) + self._have

    @property
    def missing(self) -> int | None:
        """Bytes still to come of the frame in progress, once its size is known (else None).

        Between ``next_frame`` calls that returned None this is exactly what
        completes the frame: nothing after it has been buffered yet.
        """
        need = self._need
        if need is None:
            return None
        assembling = self._pieces is not None or self._body is not None
        return need - (self._have if assembling else len(self._buf))

    def body_view(self) -> memoryview | None:
        """Where the rest of a large body goes (read into it, then ``received``), or None
        when no such body is in progress (read and ``feed`` as usual).

        The body is allocated by the first call (or ``feed``), not when its length
        prefix is read: the edge asks once it has taken the frame's memory budget."""
        if not self._in_place:
            return None
        body = self._body if self._body is not None else self._allocate()
        return memoryview(body)[self._have :]

    def received(self, nbytes: int) -> None:
        """*nbytes* were read into the start of the last ``body_view``."""
        if self._body is None or not 0 <= nbytes <= len(self._body) - self._have:
            raise ValueError(f"received {nbytes} bytes, not within the body in progress")
        self._have += nbytes

    def _allocate(self) -> bytearray:
        assert self._need is not None
        body = bytearray(self._need) if self.bodies is None else self.bodies.take(self._need)
        have = len(self._buf)
        body[:have] = self._buf
        self._buf = bytearray()
        self._body, self._have = body, have
        return body

    def feed(self, data: Buffer) -> None:
        if self._in_place:
            body = self._body if self._body is not None else self._allocate()
            with memoryview(data) as view:
                take = min(len(view), len(body) - self._have)
                # through a view of the body (``CopyPool.copy``: no temporary of the piece)
                with memoryview(body) as into:
                    into[self._have : self._have + take] = view[:take]
                self._have += take
                if take < len(view):
                    self._buf += view[take:]
            return
        pieces = self._pieces
        if pieces is None:
            self._buf += data
            return
        assert self._need is not None
        room = self._need - self._have
        if len(data) <= room:
            pieces.append(data if type(data) is bytes else bytes(data))
            self._have += len(data)
            return
        with memoryview(data) as view:
            pieces.append(bytes(view[:room]))
            self._have += room
            self._buf += view[room:]

    def next_frame(self) -> bytes | None:
        """Return the next whole frame body, or None if more bytes are needed (a decoder
        without *preallocate*: see ``next_body`` for one with it)."""
        frame = self.next_body()
        if isinstance(frame, bytearray):
            raise TypeError("a preallocating FrameDecoder hands its frames on with next_body")
        return frame

    def next_body(self) -> Frame | None:
        """``next_frame`` of a decoder with *preallocate*: a large body read in place is
        the very ``bytearray`` it was read into."""
        if self._need is None:
            if len(self._buf) < 4:
                return None
            (size,) = _SIZE.unpack_from(self._buf, 0)
            if size < 0:
                raise ProtocolError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            small = self.max_request_frame_bytes
            if small is not None and size > small:
                if len(self._buf) < 6:
                    return None  # the API key decides: wait for its two bytes, not the body
                if self._buf[4:6] != _PRODUCE_KEY:
                    (key,) = struct.unpack_from(">h", self._buf, 4)
                    raise FrameTooLarge(size, small, f"api key {key}, not Produce")
            del self._buf[:4]
            self._need = size
        need = self._need
        body = self._body
        if body is not None:
            if self._have < need:
                return None
            self._body = None
            self._in_place = False
            self._have = 0
            self._need = None
            return body
        if self._in_place:
            if len(self._buf) < need:
                return None  # not allocated yet (see body_view); cut from _buf below
            self._in_place = False
        pieces = self._pieces
        if pieces is not None:
            if self._have < need:
                return None
            frame = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._pieces = None
            self._have = 0
        elif len(self._buf) >= need:
            with memoryview(self._buf) as view:
                frame = bytes(view[:need])
            del self._buf[:need]
        else:
            if need >= self.assemble_from and self.preallocate:
                # The rest is read straight into the body's place (``body_view``), which
                # is allocated when the edge first asks for it.
                self._in_place = True
            elif need >= self.assemble_from:
                # The rest arrives in pieces: collect them instead of growing the buffer.
                self._pieces = [bytes(self._buf)] if self._buf else []
                self._have = len(self._buf)
                self._buf = bytearray()
            return None
        self._need = None
        return frame

    def frames(self) -> list[bytes]:
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out

    def close(self) -> None:
        """The peer closed its side: complain if it left a partial frame behind."""
        if self._need is not None or self._buf:
            raise TruncatedFrame(f"stream ended inside a frame ({self.buffered} bytes buffered)")
