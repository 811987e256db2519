"""Fuzz targets: one function per piece of the proxy the network can reach, bytes in.

Each target takes arbitrary bytes and drives the proxy's own entry points with
them.  The only outcomes allowed are a value (the target returns) or the
project's protocol error (``proxy.protocol.errors.ProtocolError``: DecodeError,
FrameTooLarge, TruncatedFrame, InvalidRecordBatch, ...), which at the trio edge
closes that one connection with one log line.  Anything else is a finding:

- any other exception (a bug that would close the connection as
  ``internal_error`` with a traceback, or worse);
- a ProtocolError *caused by* MemoryError or RecursionError (``proxy.protocol.codec``
  turns every kio exception into DecodeError, which would hide an input whose
  declared lengths made the decoder allocate or recurse without bound);
- a broken invariant (AssertionError): e.g. the framing decoder must cut the
  same frames however the bytes are chunked, and a rewritten response must
  announce the proxy's addresses;
- an input that runs longer than the time budget (``run_bounded``).

Targets that need a selector (which API and version a response frame is read
at) take it from the first two bytes, so a coverage-guided fuzzer can mutate it.
Stateful targets (``relay``, ``session_broker``, ``session_client``) read a
sequence of operations from the bytes.
"""

from __future__ import annotations

import random
import signal
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.protocol import codec, records
from proxy.protocol.apis import API_VERSIONS, PRODUCE
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import FrameDecoder
from proxy.protocol.partition_plan import PartitionPlan
from proxy.protocol.partition_result import PartitionResult
from proxy.relay import apiversions, rewrite
from proxy.relay.addresses import AddressBook
from proxy.relay.relay import Relay, _sasl_v0_mechanism, produce_acks
from proxy.sessions import as_broker_cache, as_client_session

from . import corpus

Target = Callable[[bytes], None]


class Hang(Exception):
    """An input ran longer than the time budget."""


def classify(exc: BaseException) -> str | None:
    """None when *exc* is an allowed outcome; otherwise a short label of the finding."""
    if isinstance(exc, Hang):
        return "hang"
    if isinstance(exc, ProtocolError):
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, MemoryError | RecursionError):
                return f"{type(exc).__name__} caused by {type(cause).__name__}"
            cause = cause.__cause__
        return None
    if isinstance(exc, AssertionError):
        return "invariant"
    return type(exc).__name__


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread if the block runs longer than *seconds* (SIGALRM)."""

    def expired(signum: int, frame: object) -> None:
        raise Hang(f"input ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_bounded(name: str, data: bytes, seconds: float = 5.0) -> str | None:
    """Run target *name* on *data*: None when the outcome is allowed, else the finding's label."""
    try:
        with time_budget(seconds):
            TARGETS[name](data)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return classify(exc)
    return None


def check(data: bytes, name: str) -> None:
    """For tests: fail with the finding (and its traceback) unless *data* is handled."""
    try:
        with time_budget(10.0):
            TARGETS[name](data)
    except ProtocolError as exc:
        label = classify(exc)
        if label is not None:
            raise AssertionError(f"{name}: {label} for input {data!r}") from exc


# -- kio's allocation of declared array counts -------------------------------------------------
# kio 0.6.5 reserves the count an array declares before reading its entries; the codec
# refuses counts that cannot fit (``walk.check``) before kio sees them.

ROOT = Path(__file__).resolve().parents[2]
OVERSIZED_FETCH = (
    struct.pack(">hhih", 1, 12, 7, 4)
    + b"fuzz\x00"
    + struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1)
    + b"\xff\xff\xff\xff\x0f"
    + b"\x00" * 8
)
"""A 44-byte Fetch v12 request whose topics array announces 2**32 - 2 entries."""
_PROBE = """
import sys
from proxy.protocol import codec
from proxy.protocol.errors import ProtocolError
try:
    codec.decode_request(bytes.fromhex(sys.argv[1]))
except ProtocolError as exc:
    print("refused:", exc)
"""


def probe_oversized_fetch() -> subprocess.CompletedProcess[str]:
    """Decode ``OVERSIZED_FETCH`` in a child process (kio 0.6.5 alone aborts the process on it)."""
    return subprocess.run(
        [sys.executable, "-c", _PROBE, OVERSIZED_FETCH.hex()],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


# -- a small reader of fuzz bytes ------------------------------------------------------------


class Reader:
    """Takes small values off the front of the fuzz input; zeros once it is used up."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def u8(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.u8() << 8 | self.u8()

    def i32(self) -> int:
        value = self.u16() << 16 | self.u16()
        return value - (1 << 32) if value >= 1 << 31 else value

    def pick(self, options: list[int] | tuple[int, ...]) -> int:
        return options[self.u8() % len(options)]

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


# -- framing -----------------------------------------------------------------------------------


def _reference_frames(stream: bytes, limit: int) -> tuple[list[bytes], str | None]:
    """What any correct decoder cuts from *stream*: its whole frames, then how it ends."""
    frames = []
    pos = 0
    while len(stream) - pos >= 4:
        (size,) = struct.unpack_from(">i", stream, pos)
        if size < 0 or size > limit:
            return frames, "error"
        if len(stream) - pos - 4 < size:
            return frames, "truncated"
        frames.append(stream[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames, "truncated" if pos != len(stream) else None


def framing(data: bytes) -> None:
    """FrameDecoder fed in chunks chosen by the input: the same frames as cut whole."""
    r = Reader(data)
    limit = r.pick([16, 64, 1000, 100 * 1024 * 1024])
    assemble_from = r.pick([8, 64, 64 * 1024])
    chunk = 1 + r.u8() % 17
    stream = data[r.pos :]
    want, ending = _reference_frames(stream, limit)
    for step in (len(stream) or 1, 1, chunk):
        decoder = FrameDecoder(limit, assemble_from=assemble_from)
        got: list[bytes] = []
        error: str | None = None
        try:
            for i in range(0, len(stream), step):
                decoder.feed(memoryview(stream)[i : i + step] if step % 2 else stream[i : i + step])
                # one at a time, as the connection does: frames before a bad one are kept
                while (frame := decoder.next_frame()) is not None:
                    got.append(frame)
                assert decoder.buffered <= max(limit, 4) + step + 4, "decoder buffered too much"
            decoder.close()
        except ProtocolError as exc:
            error = type(exc).__name__
        assert got == want, f"frames differ when fed {step} bytes at a time"
        if ending is None:
            assert error is None, f"{error} on a clean stream fed {step} at a time"
        elif ending == "truncated":
            assert error == "TruncatedFrame", f"{error} instead of TruncatedFrame"
        else:
            assert error in ("ProtocolError", "FrameTooLarge"), f"{error} on a bad size"


# -- requests ----------------------------------------------------------------------------------


def request(data: bytes) -> None:
    """A client's request frame: header, body decode, and what the relay reads of it."""
    header = codec.parse_request_header(data)
    if header.body_offset is not None:
        assert 8 <= header.body_offset <= len(data), "body offset outside the frame"
    acks = produce_acks(header, data) if header.api_key == PRODUCE else None
    _sasl_v0_mechanism(header, data)
    if (
        header.body_offset is None
        or codec.request_schema(header.api_key, header.api_version) is None
    ):
        return
    body = codec.decode_request_body(header, data)
    if acks is not None:
        assert acks == int(body.acks), "the relay reads another acks than the Produce request's"


# -- responses ---------------------------------------------------------------------------------


def _select(
    data: bytes, pairs: tuple[tuple[int, int], ...] | list[tuple[int, int]]
) -> tuple[int, int, bytes]:
    (index,) = struct.unpack_from(">H", data.ljust(2, b"\0"))
    api_key, version = pairs[index % len(pairs)]
    return api_key, version, data[2:]


def selector(
    api_key: int, version: int, pairs: tuple[tuple[int, int], ...] | list[tuple[int, int]]
) -> bytes:
    """The two bytes that make ``_select`` pick (api_key, version)."""
    return struct.pack(">H", list(pairs).index((api_key, version)))


def response(data: bytes) -> None:
    """kio decode of a response frame at the API and version named by the first two bytes."""
    api_key, version, frame = _select(data, corpus.response_pairs())
    codec.decode_response(api_key, version, frame)


def _advertised(node_id: int, host: str, port: int) -> tuple[str, int] | None:
    if node_id % 5 == 4:
        return None  # a node the proxy cannot bind a listener for (kept as it is)
    return (f"proxy-{node_id % 3}", 19000 + node_id % 100)


def rewrite_target(data: bytes) -> None:
    """The byte-level walker: address rewriting, endpoint collection, ApiVersions intersection."""
    api_key, version, frame = _select(data, corpus.rewritten_pairs())
    if api_key == API_VERSIONS:
        out = apiversions.rewrite_api_versions(version, frame)
        assert out[:4] == frame[:4], "correlation id changed"
        return
    found = rewrite.collect_endpoints(api_key, version, frame)
    out = rewrite.rewrite_response(api_key, version, frame, _advertised)
    if out is frame:
        assert all(
            _advertised(n, h, p) in (None, (h, p)) for n, (h, p) in found.items() if n >= 0
        ), "an endpoint was left unrewritten"
        return
    assert out[:4] == frame[:4], "correlation id changed"
    # The result is a well-formed message whose endpoints are the proxy's.
    again = rewrite.collect_endpoints(api_key, version, out)
    assert again.keys() == found.keys(), "rewriting changed the set of node ids"
    for node_id, address in again.items():
        expected = _advertised(node_id, *found[node_id]) if node_id >= 0 else None
        assert address == (expected or found[node_id]), f"node {node_id} not rewritten"


# -- record batches ----------------------------------------------------------------------------


def records_target(data: bytes) -> None:
    """RecordBatch v2 headers: iteration, whole-batch prefix, header at any position, CRC."""
    end = 0
    for header in records.iter_batches(data):
        assert header.position == end, "batches are not contiguous"
        assert header.end <= len(data), "batch extends past the buffer"
        records.verify_crc(data, header)
        _ = header.counted_records, header.next_offset, header.compression
        end = header.end
    assert records.complete_prefix_size(data) == end
    if data:
        records.read_batch_header(data, data[0] % len(data))


# -- the relay with the proxy's own Fetch path -------------------------------------------------

CLIENT, UPSTREAM, UPSTREAM_RAW, WRITTEN = range(4)
_CONFIGS = (
    {},
    {"max_records": 3, "max_partition_bytes": 150, "reuse_buffer_bytes": 4096},
    {"max_response_bytes": 100, "memory_budget_bytes": 2 * 1024 * 1024, "fetch_sessions": False},
)


def event(kind: int, payload: bytes) -> bytes:
    """One event of the ``relay`` target's input."""
    return struct.pack(">BH", kind, len(payload)) + payload


def relay(data: bytes) -> None:
    """A client connection end to end, sans-I/O: the Relay with the production FetchPath handler.

    The input is a sequence of events (``event``): a client request frame, an
    upstream response frame (its correlation id set to the oldest pending
    request's, so it reaches the decoders), a raw upstream frame, or "the
    responses were written".
    """
    config = FetchPathConfig.from_raw(_CONFIGS[data[0] % len(_CONFIGS)] if data else {})
    path = FetchPath(config)
    handler = path.handler(1)
    book = AddressBook("proxy.local", lambda node: 9093 + node % 1000, lambda node, port: port)
    relay = Relay(book.resolve, fetch_handler=handler, max_in_flight=8)
    pos = 1
    try:
        while pos + 3 <= len(data):
            kind, size = struct.unpack_from(">BH", data, pos)
            payload = data[pos + 3 : pos + 3 + size]
            pos += 3 + size
            kind %= 4
            if kind == CLIENT:
                if relay.can_accept:
                    relay.client_frame(payload)
            elif kind in (UPSTREAM, UPSTREAM_RAW) and relay._pending:
                pending = relay._pending[0]
                if kind == UPSTREAM and pending.correlation_id is not None and len(payload) >= 4:
                    payload = struct.pack(">i", pending.correlation_id) + payload[4:]
                relay.upstream_frame(payload)
            elif kind == UPSTREAM_RAW:
                relay.upstream_frame(payload)
            else:
                handler.written()
                handler.resume()
            for frame in relay.take_upstream():
                assert len(frame) >= 8, "a request frame without a header went upstream"
            relay.take_client()
    finally:
        handler.close()
    assert path.budget.used == 0, "a closed connection still holds memory budget"


# -- the proxy as KIP-227 session broker --------------------------------------------------------

_IDS = [uuid.UUID(int=i + 1) for i in range(3)]
_UNIVERSE = [
    as_broker_cache.TopicIdPartition(topic_id, name, p)
    for topic_id, name in ((None, "a"), (None, "b"), (_IDS[0], "a"), (_IDS[1], None))
    for p in range(3)
]


def _tps(r: Reader, on_ids: bool) -> list[as_broker_cache.TopicIdPartition]:
    mask = r.u16()
    return [
        tp
        for i, tp in enumerate(_UNIVERSE)
        if mask >> i & 1 and (tp.topic_id is not None) == on_ids
    ]


def _outcome(r: Reader) -> PartitionResult:
    return PartitionResult(
        error_code=r.pick([0, 0, 0, 1, 6]),
        high_watermark=r.pick([-1, 0, 10, 11, 2**63 - 1]),
        log_start_offset=r.pick([-1, 0, 5]),
        records_size=r.pick([0, 0, 100]),
        preferred_read_replica=r.pick([-1, -1, 2]),
        diverging_epoch=r.pick([-1, -1, 3]),
    )


def _check_cache(cache: as_broker_cache.FetchSessionCache) -> None:
    sessions = cache.sessions()
    assert len(sessions) <= cache.max_slots, "more sessions than slots"
    assert cache.num_partitions == sum(s.cached_size for s in sessions), "partition count drifted"
    for s in sessions:
        assert s.id > 0 and s.epoch >= 1, f"session {s.id} at epoch {s.epoch}"
        assert s.cached_size == s.size, "cached size differs from the session's size"
        assert all(cp.key == key for key, cp in s.partitions.items()), "partition under a wrong key"


def session_broker(data: bytes) -> None:
    """FetchSessionCache (the proxy toward session-using clients) under any request sequence."""
    r = Reader(data)
    now = [0.0]
    cache = as_broker_cache.FetchSessionCache(
        max_slots=1 + r.u8() % 3,
        eviction_ms=r.pick([0, 1000, 120_000]),
        clock=lambda: now[0],
        rng=random.Random(r.u8()),
    )
    names = {_IDS[0]: "a", _IDS[2]: "c"}
    open_contexts: list[as_broker_cache.FetchContext] = []
    while r.left:
        op = r.u8() % 4
        if op == 0:
            now[0] += r.u8() * 1.0
        elif op in (1, 2):
            version = r.pick([7, 12, 13, 17])
            on_ids = version >= 13
            ids = [s.id for s in cache.sessions()] or [0]
            session_id = r.pick([0, ids[r.u8() % len(ids)], ids[-1], r.i32()])
            session = cache.get(session_id)
            epoch = r.pick([-1, 0, 1, r.i32(), session.epoch if session else 1])
            context = cache.new_context(
                version,
                session_id,
                epoch,
                bool(r.u8() & 1),
                {tp: PartitionPlan(r.u8(), 1000) for tp in _tps(r, on_ids)},
                _tps(r, on_ids),
                names,
            )
            open_contexts.append(context)
            if len(open_contexts) > 3:
                open_contexts.pop(0)
        elif open_contexts:
            context = open_contexts.pop(r.u8() % len(open_contexts))
            parts = context.partitions()
            for tp, _ in parts:
                assert context.get_fetch_offset(tp) is not None or isinstance(
                    context, as_broker_cache.SessionErrorContext
                )
            if r.u8() % 5 == 0:
                context.throttled_response()
            else:
                updates = {tp: _outcome(r) for tp, _ in parts if r.u8() % 4}
                result = context.update_and_generate_response_data(updates, lambda o: o)
                assert {tp for tp, _ in result.partitions} <= set(updates), "unrequested data"
        _check_cache(cache)


# -- the proxy as a session client upstream ------------------------------------------------------

_KEYS_BY_NAME = [(t, p) for t in ("a", "b") for p in range(3)]
_KEYS_BY_ID = [(t, p) for t in _IDS[:2] for p in range(3)]


def session_client(data: bytes) -> None:
    """FetchSessionClient under any sequence of wanted partitions and upstream responses."""
    r = Reader(data)
    session = as_client_session.FetchSessionClient(sessionless_backoff=r.u8() % 3)
    while r.left:
        op = r.u8() % 4
        if session.in_flight is None and op < 2:
            on_ids = bool(r.u8() & 1)
            keys = _KEYS_BY_ID if on_ids else _KEYS_BY_NAME
            mask = r.u8()
            wanted = {
                k: PartitionPlan(r.u8() % 3, 1000) for i, k in enumerate(keys) if mask >> i & 1
            }
            req = session.build(wanted, uses_topic_ids=on_ids, supports_sessions=bool(r.u8() % 4))
            assert set(req.session_partitions) == set(wanted), "session differs from wanted"
            assert set(req.to_send) <= set(wanted), "sent a partition nobody wants"
            assert not set(req.to_forget) & set(wanted), "forgot a wanted partition"
            if req.is_full:
                assert not req.to_forget and req.to_send == wanted, "full request is not full"
            else:
                assert req.metadata.session_id != 0, "incremental request without a session"
        elif session.in_flight is not None and op < 3:
            sent = session.in_flight.metadata
            partitions = list(session.in_flight.session_partitions)
            keys = [k for k in partitions if r.u8() % 4] + ([_KEYS_BY_NAME[0]] * (r.u8() % 5 == 0))
            error = r.pick([0, 0, 0, 70, 71, 106, 1])
            session_id = r.pick([0, sent.session_id, sent.session_id, r.i32() & 0x7FFFFFFF])
            outcome = session.handle_response(
                error_code=error,
                session_id=session_id,
                throttle_time_ms=r.pick([0, 0, 100]),
                partitions=keys,
            )
            nxt = session.next_metadata
            if error == 70:
                assert nxt == as_client_session.INITIAL, (
                    "session not found must restart from scratch"
                )
            elif error:
                assert nxt.epoch == 0 and not outcome.ok, "an error must force a full fetch"
        elif session.in_flight is not None:
            session.handle_send_error()
            assert session.next_metadata.epoch == 0
        else:
            session.revoke_last_response("fuzz")
        nxt = session.next_metadata
        assert nxt.epoch >= 0, f"next epoch {nxt.epoch}"
        assert nxt.epoch == 0 or nxt.session_id > 0, f"epoch {nxt.epoch} without a session"


TARGETS: dict[str, Target] = {
    "framing": framing,
    "request": request,
    "response": response,
    "rewrite": rewrite_target,
    "records": records_target,
    "relay": relay,
    "session_broker": session_broker,
    "session_client": session_client,
}
