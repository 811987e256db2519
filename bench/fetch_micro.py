"""CPU per fetch of the sans-I/O Fetch path, in process: no sockets, no broker.

    .venv/bin/python -m bench.fetch_micro                 # the table
    .venv/bin/python -m bench.fetch_micro --json          # the same as JSON
    .venv/bin/python -m bench.fetch_micro --case 1p-record --reps 9 --profile out.prof

Each case drives one ``proxy.fetchpath.FetchPathHandler`` through a
``proxy.relay.relay.Relay`` (the relay the server uses, sans-I/O too) for whole
cycles: client request frame -> the upstream request the proxy sends -> an
upstream response frame -> the client response the proxy writes.  The upstream
is a stand-in broker whose response frames are encoded before timing starts;
per cycle it only patches the correlation id and answers the session's first
(full) request with every partition, every later (incremental) one with the
partitions that changed, as a KIP-227 broker does.

A cycle's client request moves the fetch offset of the partitions that got a
record in the previous cycle (``changed``), as a consumer does; the offsets run
through ``CYCLE`` values and start again, so the frames are encoded beforehand
too.  A session client (``session=True``) sends a full fetch once, then
incremental fetches that list only the partitions it moved.

The cycle collector runs as in the server (``proxy.server.cli.collector_as_served``:
start-up objects frozen, no automatic full collection).

Reported: CPU microseconds per cycle (``time.process_time``), the median and the
lowest of ``--reps`` repetitions of ``--cycles`` cycles (fewer for the 1,000-partition
cases).  ``digest`` is a hash of every client response of the run (with a
session client's random session id masked): equal digests before and after a
change mean the proxy answered byte for byte the same.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import json
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.protocol import codec
from proxy.protocol.apis import FETCH
from proxy.protocol.framing import payload_bytes
from proxy.protocol.messages import make, request_module, response_module
from proxy.relay.relay import Relay
from proxy.server.cli import collector_as_served
from proxy.shaping.limits import Limits

CYCLE = 16
"""Distinct fetch offsets a changed partition runs through (request frames encoded once)."""
SESSION_ID = 0x51E5
"""The session id the stand-in broker gives the proxy's upstream session."""
_I32 = struct.Struct(">i")
_EPOCH_SENTINEL = 0x5EA5EA5
_SESSION_SENTINEL = 0x5E55105


@dataclass(frozen=True)
class Case:
    name: str
    topics: int = 1
    partitions_per_topic: int = 1
    changed: int = 1
    """Partitions that get a one-record batch each cycle (the first ones)."""
    records: int = 1
    """Records in each changed partition's batch."""
    session: bool = False
    """The client uses a KIP-227 session itself (Java, franz-go) instead of full fetches."""
    limits: Limits = field(default_factory=Limits)
    version: int = 12
    cycles: int = 2000

    @property
    def partitions(self) -> list[tuple[str, int]]:
        return [
            (f"topic-{t}", p) for t in range(self.topics) for p in range(self.partitions_per_topic)
        ]


CASES = (
    Case("1p-record"),
    Case("1p-empty", changed=0),
    Case("1p-record-max-records", limits=Limits(max_records=500, max_partition_bytes=1 << 20)),
    Case("1p-session-client", session=True),
    Case("1000p-unchanged", topics=10, partitions_per_topic=100, changed=0, cycles=40),
    Case("1000p-10-changed", topics=10, partitions_per_topic=100, changed=10, cycles=40),
    # librdkafka's version (kcat, confluent-kafka): its request partitions have no
    # last_fetched_epoch, so per-version fast paths must cover it too
    Case(
        "1000p-10-changed-v11",
        topics=10,
        partitions_per_topic=100,
        changed=10,
        version=11,
        cycles=40,
    ),
    # an idle Java consumer of 1,000 partitions: incremental fetches that name nothing
    Case(
        "1000p-session-client-idle",
        topics=10,
        partitions_per_topic=100,
        changed=0,
        session=True,
        cycles=40,
    ),
    Case(
        "1000p-session-client-10",
        topics=10,
        partitions_per_topic=100,
        changed=10,
        session=True,
        cycles=40,
    ),
)


def record_batch(base_offset: int, count: int) -> bytes:
    """A RecordBatch v2 of *count* records with an opaque body (the proxy never reads records)."""
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, 1000, 1000 + count, -1, -1, -1, count)
    after_crc += b"r" * (20 * count)
    body = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def _group(items: Sequence[tuple[str, int, Any]]) -> list[tuple[str, list[Any]]]:
    out: list[tuple[str, list[Any]]] = []
    for topic, _, value in items:
        if out and out[-1][0] == topic:
            out[-1][1].append(value)
        else:
            out.append((topic, [value]))
    return out


class Traffic:
    """A case's frames: client requests per cycle, upstream responses, encoded beforehand."""

    def __init__(self, case: Case) -> None:
        self.case = case
        parts = case.partitions
        self.changed = set(parts[: case.changed])
        self.requests = [self._request(i, full=True) for i in range(CYCLE)]
        self.incremental = [self._request(i, full=False) for i in range(CYCLE)]
        self.full_response = self._response(0, parts)
        self.responses = [self._response(i, parts[: case.changed]) for i in range(CYCLE)]
        epoch = _I32.pack(_EPOCH_SENTINEL)
        session = _I32.pack(_SESSION_SENTINEL)
        self.epoch_at = [f.index(epoch) for f in self.incremental]
        self.session_at = [f.index(session) for f in self.incremental]

    def offset(self, cycle: int, key: tuple[str, int]) -> int:
        return cycle % CYCLE if key in self.changed else 0

    def _request(self, cycle: int, *, full: bool) -> bytes:
        case = self.case
        mod = request_module(FETCH, case.version)
        listed = [k for k in case.partitions if full or k in self.changed]
        items = [
            (
                topic,
                p,
                make(
                    mod.FetchPartition,
                    partition=p,
                    fetch_offset=self.offset(cycle, (topic, p)),
                    partition_max_bytes=1 << 20,
                    log_start_offset=-1,
                ),
            )
            for topic, p in listed
        ]
        request = make(
            mod.FetchRequest,
            replica_id=-1,
            max_wait=timedelta(milliseconds=500),
            min_bytes=1,
            max_bytes=50 << 20,
            isolation_level=0,
            session_id=0 if full else _SESSION_SENTINEL,
            session_epoch=(0 if case.session else -1) if full else _EPOCH_SENTINEL,
            topics=tuple(
                make(mod.FetchTopic, topic=t, partitions=tuple(ps)) for t, ps in _group(items)
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        return codec.encode_request(request, 1, "rdkafka")

    def _response(self, cycle: int, listed: list[tuple[str, int]]) -> bytes:
        mod = response_module(FETCH, self.case.version)
        items = [
            (
                topic,
                p,
                make(
                    mod.PartitionData,
                    partition_index=p,
                    error_code=ErrorCode(0),
                    high_watermark=CYCLE + 1 if (topic, p) in self.changed else 0,
                    last_stable_offset=CYCLE + 1 if (topic, p) in self.changed else 0,
                    log_start_offset=0,
                    aborted_transactions=None,
                    preferred_read_replica=-1,
                    records=record_batch(cycle % CYCLE, self.case.records)
                    if (topic, p) in self.changed
                    else b"",
                ),
            )
            for topic, p in listed
        ]
        response = make(
            mod.FetchResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode(0),
            session_id=SESSION_ID,
            responses=tuple(
                make(mod.FetchableTopicResponse, topic=t, partitions=tuple(ps))
                for t, ps in _group(items)
            ),
        )
        return codec.encode_response(response, 0)


def _session_epoch(frame: bytes) -> int:
    """The session epoch of an upstream Fetch request (v7-v14 layout: after replica_id)."""
    header = codec.parse_request_header(frame)
    assert header.body_offset is not None and 7 <= header.api_version <= 14
    (epoch,) = _I32.unpack_from(frame, header.body_offset + 21)
    return int(epoch)


class Run:
    """One handler and its relay, driven cycle by cycle."""

    def __init__(self, case: Case, traffic: Traffic) -> None:
        self.case = case
        self.traffic = traffic
        path = FetchPath(FetchPathConfig(limits=case.limits))
        self.handler = path.handler(1)
        self.relay = Relay(lambda node, host, port: None, fetch_handler=self.handler)
        self.cycle = 0
        self.client_session = 0
        self.client_epoch = 0
        self.digest = hashlib.sha256()

    def client_frame(self) -> bytes:
        t = self.traffic
        i = self.cycle % CYCLE
        if not self.case.session or self.client_epoch == 0:
            return t.requests[i]
        frame = bytearray(t.incremental[i])
        _I32.pack_into(frame, t.epoch_at[i], self.client_epoch)
        _I32.pack_into(frame, t.session_at[i], self.client_session)
        return bytes(frame)

    def step(self) -> bytes:
        """One whole cycle; returns the client's response frame."""
        relay = self.relay
        relay.client_frame(self.client_frame())
        for up in relay.take_upstream():
            epoch = _session_epoch(up)
            if epoch in (0, -1):
                answer = self.traffic.full_response
            else:
                answer = self.traffic.responses[self.cycle % CYCLE]
            relay.upstream_frame(up[4:8] + answer[4:])
        [out] = relay.take_client()
        self.handler.written()
        self.cycle += 1
        return payload_bytes(out)

    def after(self, frame: bytes) -> None:
        """The client's side of a response: learn its session, hash the answer."""
        if self.case.session:
            (session_id,) = _I32.unpack_from(frame, 11)  # v12: cid, tags, throttle, error
            if self.client_epoch == 0:
                self.client_session = session_id
            self.client_epoch += 1
            frame = frame[:11] + b"\0\0\0\0" + frame[15:]
        self.digest.update(frame)


def check(case: Case, frame: bytes, cycle: int) -> None:
    """The client's response carries what the case promises (a sanity check, not a test)."""
    _, response = codec.decode_response(FETCH, case.version, frame)
    assert int(response.error_code) == 0, response.error_code
    listed = [(t.topic, int(p.partition_index)) for t in response.responses for p in t.partitions]
    with_records = [
        (t.topic, int(p.partition_index))
        for t in response.responses
        for p in t.partitions
        if p.records
    ]
    parts = case.partitions
    if not case.session or cycle == 0:
        assert sorted(listed) == sorted(parts), (len(listed), len(parts))
    assert sorted(with_records) == sorted(parts[: case.changed]), with_records


def run_case(
    case: Case, reps: int, cycles: int | None, profile: cProfile.Profile | None
) -> dict[str, Any]:
    traffic = Traffic(case)
    run = Run(case, traffic)
    n = cycles or case.cycles
    for i in range(CYCLE + 2):  # the session's full fetch, then steady state; checked
        frame = run.step()
        check(case, frame, i)
        run.after(frame)
    samples: list[float] = []
    for _ in range(reps):
        gc.collect()
        frames: list[bytes] = []
        step = run.step
        if profile is not None:
            profile.enable()
        start = time.process_time()
        for _ in range(n):
            frames.append(step())
            if case.session:
                run.after(frames.pop())
        elapsed = time.process_time() - start
        if profile is not None:
            profile.disable()
        for frame in frames:
            run.after(frame)
        samples.append(elapsed / n * 1e6)
    return {
        "case": case.name,
        "cycles": n,
        "reps": reps,
        "median_us": round(statistics.median(samples), 1),
        "min_us": round(min(samples), 1),
        "digest": run.digest.hexdigest()[:16],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'case':<26} {'median us':>10} {'min us':>10} {'cycles':>7} {'reps':>5}  digest"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:<26} {r['median_us']:>10.1f} {r['min_us']:>10.1f}"
            f" {r['cycles']:>7} {r['reps']:>5}  {r['digest']}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], Any] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per case (median)")
    parser.add_argument("--cycles", type=int, default=None, help="cycles per repetition")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the timed cycles")
    args = parser.parse_args(argv)
    known = {c.name: c for c in CASES}
    names = args.case or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {list(known)}")
    profile = cProfile.Profile() if args.profile else None
    with collector_as_served():  # the server's: no automatic full collection
        rows = [run_case(known[n], args.reps, args.cycles, profile) for n in names]
    if profile is not None:
        profile.dump_stats(args.profile)
    out(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
