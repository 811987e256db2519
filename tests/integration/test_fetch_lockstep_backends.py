"""With its default settings (no limits), the proxy answers a Fetch as its broker does.

Two raw clients (``support.rawclient``) run one random script in lockstep: one on the
broker, one on the proxy in front of it.  Every step sends both the same Fetch (each
client with its own session id and epoch) and compares the two answers, reduced to what
a broker must repeat: top-level error, whether a session was created or kept, and per
partition its error, high watermark, last stable offset, log start offset, aborted
transactions, preferred read replica, diverging epoch, current leader and snapshot id,
and its whole batches byte for byte.

The scripts: sessionless fetches of v4 to v17 (a partition sometimes listed twice),
KIP-227 sessions opened, advanced (offsets moved, partitions added and forgotten, nothing
changed), sent a wrong epoch and closed, read_uncommitted and read_committed, leader
epochs, offsets and log start offsets the broker refuses (FENCED or UNKNOWN_LEADER_EPOCH,
OFFSET_OUT_OF_RANGE), and records produced between fetches, plain and in transactions
that commit, abort or stay open.  Every fetch answers at once (max_wait 0).  A session
fetch that changes nothing mostly repeats the last fetch's fields, as a consumer with
nothing new to read does, so the proxy's repeat of a session client's idle fetch runs
among the rest (24 times in seeds 2, 7, 11 and 20-39 on both backends, by hand).

Not compared, by design (README, "Fetch shaping" and "Fetch sessions"): the order of the
partitions (a sessionless client's fetch reaches the broker through the proxy's own
incremental session, which orders and rotates partitions as a session does), and a
partial trailing batch (the proxy never forwards one).  The partition max bytes are 1 MiB
and the response's 50 MB: under smaller limits which partition gets KIP-74's one
oversized first batch follows the order the broker reads partitions in, which differs;
``test_fetch_scripts_backends.py`` checks those answers against the broker instead.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from support.backends import BACKENDS, running, upstream_for
from support.fetch_messages import partition_body
from support.fetch_scripts import (
    FETCH,
    READ_COMMITTED,
    TopicPartition,
    Upstream,
    connect,
    learn,
    run_seeded,
    script_body,
    whole_batches,
)
from support.rawclient import make_request
from support.stack import ProxyStack

pytestmark = pytest.mark.integration

DEADLINE = 150.0
"""Absolute time limit of one test's network operations (seconds)."""
SESSIONLESS_VERSIONS = (4, 5, 6, 7, 11, 12, 13, 15, 16, 17)
SESSION_VERSIONS = (12, 13, 16, 17)
PARTITION_MAX = 1 << 20
RESPONSE_MAX = 50 << 20
IGNORED = frozenset({"throttle_time", "records", "partition_index", "partitions", "responses"})


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    upstream = upstream_for(request, request.param)
    with running(ProxyStack({}, nodes=1, upstream=upstream, name="lockstep")) as s:
        yield s


def plain(value: Any) -> Any:
    """A kio value as plain data (enums by name, durations in ms)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name not in IGNORED
        }
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, ErrorCode):
        return value.name
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return value


class Side:
    """One of the two clients, with its own session."""

    def __init__(self, name: str, address: str, deadline: float) -> None:
        self.name = name
        self.raw, self.fetch_max = connect(address, "lockstep", deadline)
        self.session_id = 0
        self.epoch = -1

    def close(self) -> None:
        self.raw.close()


class Lockstep:
    def __init__(self, stack: ProxyStack, upstream: Upstream, deadline: float) -> None:
        self.upstream = upstream
        learnt = learn(stack, list(upstream.topics), deadline)
        self.ids, self.names = learnt.ids, learnt.names
        self.broker = Side("broker", upstream.direct_address, deadline)
        self.proxy = Side("proxy", learnt.broker, deadline)
        top = min(self.broker.fetch_max, self.proxy.fetch_max)  # (the broker's, relayed)
        self.sessionless_versions = [v for v in SESSIONLESS_VERSIONS if v <= top]
        self.session_versions = [v for v in SESSION_VERSIONS if v <= top]
        self.partitions = [(t, p) for t, n in upstream.topics.items() for p in range(n)]
        self.session: dict[TopicPartition, dict[str, Any]] | None = None
        self.session_version = 12
        self.isolation = 0
        """The isolation level of the last fetch."""
        self.differences: list[str] = []
        self.seen: Counter[str] = Counter()

    def close(self) -> None:
        self.broker.close()
        self.proxy.close()

    def _partition(self, rng: random.Random, tp: TopicPartition) -> dict[str, Any]:
        end = self.upstream.ends.get(tp, 0)
        offset = rng.choice((0, 0, end, rng.randint(0, max(0, end)), rng.randint(0, max(0, end))))
        body = partition_body(tp[1], offset, PARTITION_MAX)
        if rng.random() < 0.15:  # what the broker refuses
            field, values = rng.choice(
                (
                    ("current_leader_epoch", (0, 1, 7)),
                    ("fetch_offset", (-1, -100, 2**40, end + 3)),
                    ("log_start_offset", (0, 5)),
                    ("last_fetched_epoch", (0, 3)),
                )
            )
            body[field] = rng.choice(values)
        return body

    def step(self, rng: random.Random, label: str) -> None:
        kinds = ("produce", "sessionless", "full", "incremental", "same", "bad epoch", "close")
        kind = rng.choices(kinds, (1, 4, 2, 5, 3, 1, 1))[0]
        if kind == "produce":
            self.upstream.produce(rng, rng.choice(self.partitions))
            return
        if self.session is None and kind not in ("sessionless", "full"):
            kind = "full"
        isolation = rng.choice((0, READ_COMMITTED))
        if kind == "same" and rng.random() < 0.7:
            # as a consumer with nothing new to read: the same fetch as its last one, which
            # the proxy may answer as its last answer again (a session client's repeat)
            isolation = self.isolation
        self.isolation = isolation
        common = {"max_bytes": RESPONSE_MAX, "isolation_level": isolation}
        listed: list[tuple[TopicPartition, dict[str, Any]]] = []
        forgotten: list[TopicPartition] = []
        if kind == "sessionless":
            version = rng.choice(self.sessionless_versions)
            chosen = rng.sample(self.partitions, rng.randint(1, len(self.partitions)))
            listed = [(tp, self._partition(rng, tp)) for tp in chosen]
            if rng.random() < 0.2:  # one partition twice (a broker keeps one entry)
                tp = rng.choice(chosen)
                listed.insert(rng.randint(0, len(listed)), (tp, self._partition(rng, tp)))
        elif kind == "full":
            version = self.session_version = rng.choice(self.session_versions)
            chosen = rng.sample(self.partitions, rng.randint(1, len(self.partitions)))
            self.session = {tp: self._partition(rng, tp) for tp in chosen}
            listed = list(self.session.items())
        else:
            version = self.session_version
            assert self.session is not None
            if kind == "incremental":
                for tp in rng.sample(self.partitions, rng.randint(0, len(self.partitions))):
                    if tp in self.session and rng.random() < 0.3:
                        forgotten.append(tp)
                        del self.session[tp]
                    else:
                        self.session[tp] = self._partition(rng, tp)
                        listed.append((tp, self.session[tp]))
        where = (
            f"{label} {kind} v{version} {common} "
            f"asked {[(t[-6:], p, b['fetch_offset']) for (t, p), b in listed]}"
            f" forgot {[(t[-6:], p) for t, p in forgotten]}"
        )
        answers = {}
        for side in (self.broker, self.proxy):
            if kind in ("sessionless", "full"):
                session_id, epoch = 0, (-1 if kind == "sessionless" else 0)
            elif kind == "close":
                session_id, epoch = side.session_id, -1
            elif kind == "bad epoch":
                session_id, epoch = side.session_id, side.epoch + 2
            else:
                session_id, epoch = side.session_id, side.epoch
            body = script_body(self.ids, listed, forgotten, session_id, epoch, common)
            answers[side.name] = side.raw.request(make_request(FETCH, version, body))
            self._advance(side, kind, answers[side.name])
        self.seen[kind] += 1
        self._compare(version, answers["broker"], answers["proxy"], where)
        if kind == "close" or (
            kind in ("full", "incremental", "same") and self.broker.session_id == 0
        ):
            self.session = None

    def _advance(self, side: Side, kind: str, answer: Any) -> None:
        error = int(getattr(answer, "error_code", 0))
        if kind == "sessionless" or error:
            return
        if kind == "close":
            side.session_id, side.epoch = 0, -1
        elif kind == "full":
            side.session_id = int(answer.session_id)
            side.epoch = 1 if side.session_id else -1
        elif kind in ("incremental", "same"):
            if int(answer.session_id) == 0:  # the request emptied the session: closed
                side.session_id, side.epoch = 0, -1
            else:
                side.epoch += 1

    def _reduced(self, version: int, answer: Any) -> dict[str, Any]:
        top = plain(answer)
        top["session_id"] = "session" if top.get("session_id") else 0
        partitions: dict[str, Any] = {}
        count: Counter[TopicPartition] = Counter()
        for topic in answer.responses:
            name = self.names.get(topic.topic_id) if version >= 13 else topic.topic
            for pd in topic.partitions:
                tp = (str(name), int(pd.partition_index))
                count[tp] += 1
                batches, _ = whole_batches(pd.records)
                partitions[f"{tp[0][-6:]}-{tp[1]}"] = plain(pd) | {
                    "batches": [(b.base, b.last, hash(b.data)) for b in batches]
                }
                if batches:
                    self.seen["partitions with records"] += 1
                if pd.error_code != ErrorCode.none:
                    self.seen["partitions with errors"] += 1
        top["partitions"] = partitions
        top["listed twice"] = sorted(tp for tp, n in count.items() if n > 1)
        return top

    def _compare(self, version: int, broker: Any, proxy: Any, where: str) -> None:
        b, p = self._reduced(version, broker), self._reduced(version, proxy)
        if b == p:
            return
        lines = [
            f"    {key}: broker {b.get(key)!r}, proxy {p.get(key)!r}"
            for key in sorted(set(b) | set(p))
            if key != "partitions" and b.get(key) != p.get(key)
        ]
        bp, pp = b["partitions"], p["partitions"]
        for key in sorted(set(bp) | set(pp)):
            if bp.get(key) != pp.get(key):
                lines.append(f"    {key}: broker {bp.get(key)!r}\n{' ' * 8}proxy  {pp.get(key)!r}")
        self.differences.append(where + "\n" + "\n".join(lines))


@pytest.mark.parametrize("seed", [2, 7, 11])
def test_without_limits_the_proxy_answers_as_the_broker(stack: ProxyStack, seed: int) -> None:
    client = run_seeded(stack, seed, 70, time.monotonic() + DEADLINE, "lockstep", Lockstep)
    assert not client.differences, "\n".join(client.differences[:8])
    seen = client.seen
    # every kind of step ran, and records and errors were compared (these seeds: 190-224
    # partitions with records, both sides counted)
    assert all(seen[k] for k in ("sessionless", "full", "incremental", "same", "close")), seen
    assert seen["partitions with records"] >= 20, seen
    assert seen["partitions with errors"] >= 5, seen


def test_lockstep_sees_a_difference(stack: ProxyStack) -> None:
    """The comparison can fail: a broker answer against itself with one batch removed."""
    upstream = Upstream(stack, time.monotonic() + DEADLINE, f"lockstep-{uuid.uuid4().hex[:6]}")
    lockstep = None
    try:
        topic = upstream.create(1, "lockstepself")
        upstream.produce(random.Random(0), (topic, 0))
        upstream.produce(random.Random(1), (topic, 0))
        lockstep = Lockstep(stack, upstream, time.monotonic() + DEADLINE)
        body = script_body(
            lockstep.ids,
            [((topic, 0), partition_body(0, 0, PARTITION_MAX))],
            [],
            0,
            -1,
            {"max_bytes": RESPONSE_MAX},
        )
        answer = lockstep.broker.raw.request(make_request(FETCH, 12, body))
        [t] = answer.responses
        [pd] = t.partitions
        batches, _ = whole_batches(pd.records)
        assert len(batches) >= 2, batches
        cut = dataclasses.replace(pd, records=b"".join(b.data for b in batches[:-1]))
        fewer = dataclasses.replace(answer, responses=(dataclasses.replace(t, partitions=(cut,)),))
        lockstep._compare(12, answer, answer, "same")
        assert lockstep.differences == []
        lockstep._compare(12, answer, fewer, "one batch fewer")
        assert len(lockstep.differences) == 1 and "batches" in lockstep.differences[0]
    finally:
        if lockstep is not None:
            lockstep.close()
        upstream.close()


def test_a_session_clients_idle_fetches_are_answered_as_the_broker_answers(
    stack: ProxyStack,
) -> None:
    """A session client with nothing new to read (Java's consumer) sends an incremental
    fetch naming no partition at each next epoch; the proxy answers those from its last
    answer once its upstream session is idle (``FetchPathHandler._repeat_of``).  Every
    answer must still be the broker's: nothing, then the records produced meanwhile, then
    nothing again, and a wrong epoch refused."""
    deadline = time.monotonic() + DEADLINE
    upstream = Upstream(stack, deadline, f"idle-{uuid.uuid4().hex[:6]}")
    lockstep = None
    try:
        topic = upstream.create(2, "idlesession")
        rng = random.Random(3)
        upstream.produce(rng, (topic, 0))
        lockstep = Lockstep(stack, upstream, deadline)
        version = max(lockstep.session_versions)
        common = {"max_bytes": RESPONSE_MAX, "isolation_level": 0}
        ends = dict.fromkeys([(topic, 0), (topic, 1)], 0)

        def fetch(kind: str, listed: list[TopicPartition], label: str) -> None:
            assert lockstep is not None
            parts = [(tp, partition_body(tp[1], ends[tp], PARTITION_MAX)) for tp in listed]
            answers = {}
            for side in (lockstep.broker, lockstep.proxy):
                session_id, epoch = (0, 0) if kind == "full" else (side.session_id, side.epoch)
                if kind == "bad epoch":
                    epoch += 2
                body = script_body(lockstep.ids, parts, [], session_id, epoch, common)
                answers[side.name] = side.raw.request(make_request(FETCH, version, body))
                lockstep._advance(side, "same" if kind == "bad epoch" else kind, answers[side.name])
            lockstep._compare(version, answers["broker"], answers["proxy"], label)
            for t in answers["broker"].responses:
                for pd in t.partitions:
                    batches, _ = whole_batches(pd.records)
                    if batches:
                        ends[(topic, int(pd.partition_index))] = batches[-1].last + 1

        def repeats() -> int:
            return int(
                stack.run_sync(
                    lambda: sum(
                        live.relay.fetch_handler.repeats
                        for live in stack.proxy.live.values()
                        if live.connection.client_id == "lockstep"
                    )
                )
            )

        fetch("full", [(topic, 0), (topic, 1)], "full")
        fetch("incremental", [(topic, 0)], "moved past the records")
        for i in range(6):
            fetch("same", [], f"idle {i}")
        idle = repeats()
        assert idle >= 3, idle  # answered as the last answer again
        upstream.produce(rng, (topic, 1))
        fetch("same", [], "records produced meanwhile")
        assert ends[(topic, 1)] > 0
        fetch("incremental", [(topic, 1)], "moved past them")
        for i in range(4):
            fetch("same", [], f"idle again {i}")
        assert repeats() > idle
        fetch("bad epoch", [], "a wrong epoch")
        assert not lockstep.differences, "\n".join(lockstep.differences[:8])
    finally:
        if lockstep is not None:
            lockstep.close()
        upstream.close()
