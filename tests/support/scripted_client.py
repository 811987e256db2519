"""A raw client that fetches through the proxy as a random script says, and checks every
answer against the broker read directly at that moment.

It talks to the proxy as an odd but legal client may: sessionless fetches of any version
from v7, KIP-227 sessions opened, advanced (moved offsets, added and forgotten
partitions, nothing changed), emptied and closed, read_uncommitted and read_committed
mixed on one connection, partition and response max_bytes from 1 byte to 50 MB, long
polls (max_wait up to 100 ms, min_bytes up to 1 MB), seeks, and several fetches sent
before the first answer (pipelined; a session's take consecutive epochs, as Kafka
processes a connection's requests in order).  Between fetches records are produced
(``fetch_scripts.Upstream``).  The rules each answer is held to are in
``tests/integration/test_fetch_scripts_backends.py``'s docstring; what broke one is in
``ScriptedClient.problems``, what was exercised in ``ScriptedClient.seen``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from .fetch_messages import partition_body
from .fetch_scripts import (
    FETCH,
    READ_COMMITTED,
    TopicPartition,
    Upstream,
    aborted_of,
    connect,
    learn,
    script_body,
    whole_batches,
)
from .rawclient import make_request
from .stack import ProxyStack

SESSIONLESS_VERSIONS = (7, 11, 12, 13, 15, 16, 17)
SESSION_VERSIONS = (12, 13, 16, 17)
PARTITION_MAX = (1, 500, 5000, 1 << 20)
RESPONSE_MAX = (1, 3000, 50 << 20)


# -- the client ---------------------------------------------------------------------------


@dataclass
class Session:
    session_id: int
    epoch: int
    version: int
    max_bytes: dict[TopicPartition, int]
    """partition -> its partition max bytes, in the session"""
    sent: dict[TopicPartition, int] = field(default_factory=dict)
    """partition -> the fetch offset the session has for it"""


@dataclass(frozen=True)
class Fetch:
    kind: str
    version: int
    isolation: int
    listed: list[tuple[TopicPartition, dict[str, Any]]]
    body: dict[str, Any]
    where: str


class ScriptedClient:
    """A raw client of the proxy that fetches as a random script says, and checks each
    answer against the upstream (the module docstring's rules)."""

    partition_max: tuple[int, ...] = PARTITION_MAX
    """The partition max bytes a fetch draws from."""
    response_max: tuple[int, ...] = RESPONSE_MAX
    """The response max bytes a fetch draws from."""

    def __init__(self, stack: ProxyStack, upstream: Upstream, deadline: float) -> None:
        self.upstream = upstream
        learnt = learn(stack, list(upstream.topics), deadline)
        self.ids, self.names = learnt.ids, learnt.names
        self.raw, self.fetch_max = connect(learnt.broker, "scripts", deadline)
        self.partitions = [(t, p) for t, n in upstream.topics.items() for p in range(n)]
        self.position = dict.fromkeys(self.partitions, 0)
        self.told: dict[TopicPartition, tuple[int, int, int]] = {}
        self.session: Session | None = None
        self.problems: list[str] = []
        self.seen: Counter[str] = Counter()

    def close(self) -> None:
        self.raw.close()

    def held_bytes(self, stack: ProxyStack) -> int:
        """Bytes the reuse buffer of the proxy's handler of this connection holds."""

        def find() -> int:
            [live] = [
                live for live in stack.proxy.live.values() if live.connection.client_id == "scripts"
            ]
            return int(live.relay.fetch_handler.shaper.buffer.size)

        return stack.run_sync(find)

    # -- one step ---------------------------------------------------------------------

    def step(self, rng: random.Random, label: str) -> None:
        kinds = (
            "produce",
            "seek",
            "sessionless",
            "full",
            "incremental",
            "same",
            "close",
            "pipelined",
        )
        kind = rng.choices(kinds, (2, 1, 4, 1, 4, 4, 1, 1))[0]
        if kind == "produce":
            self.upstream.produce(rng, rng.choice(self.partitions))
            return
        if kind == "seek":
            tp = rng.choice(self.partitions)
            self.position[tp] = rng.randint(0, self.position[tp] + 5)
            return
        if kind == "pipelined":
            # Sent at once, answered in order (a broker reads a connection's requests one
            # by one): the session's fetches take consecutive epochs.
            fetches: list[Fetch] = []
            ahead = 0
            for _ in range(rng.randint(2, 4)):
                in_session = self.session is not None and rng.random() < 0.6
                fetches.append(self._build(rng, "same" if in_session else "sessionless", ahead))
                ahead += in_session
            sent = [self.raw.send(make_request(FETCH, f.version, f.body)) for f in fetches]
            self.seen["pipelined"] += len(fetches)
            for f, correlation_id in zip(fetches, sent, strict=True):
                answer = self.raw.receive(FETCH, f.version, correlation_id)
                self._check(f.kind, f.version, f.isolation, f.listed, answer, f"{label} {f.where}")
            return
        if self.session is None and kind in ("incremental", "same", "close"):
            kind = "full"
        f = self._build(rng, kind)
        answer = self.raw.request(make_request(FETCH, f.version, f.body))
        self._check(kind, f.version, f.isolation, f.listed, answer, f"{label} {f.where}")

    def _build(self, rng: random.Random, kind: str, ahead: int = 0) -> Fetch:
        """A fetch of *kind*; *ahead*: fetches of the session sent before it, unanswered."""
        isolation = rng.choice((0, READ_COMMITTED))
        common = {
            "max_bytes": rng.choice(self.response_max),
            "isolation_level": isolation,
            # long polls too: a min_bytes the data may not reach, waited for up to max_wait
            "min_bytes": rng.choice((0, 1, 1, 1000, 10**6)),
            "max_wait": timedelta(milliseconds=rng.choice((0, 0, 20, 100))),
        }
        listed: list[tuple[TopicPartition, dict[str, Any]]] = []
        forgotten: list[TopicPartition] = []
        if kind == "sessionless":
            version, session_id, epoch = (
                rng.choice([v for v in SESSIONLESS_VERSIONS if v <= self.fetch_max]),
                0,
                -1,
            )
            for tp in rng.sample(self.partitions, rng.randint(1, len(self.partitions))):
                listed.append((tp, self._partition(tp, rng.choice(self.partition_max))))
        elif kind == "full":
            version, session_id, epoch = (
                rng.choice([v for v in SESSION_VERSIONS if v <= self.fetch_max]),
                0,
                0,
            )
            chosen = rng.sample(self.partitions, rng.randint(1, len(self.partitions)))
            max_bytes = {tp: rng.choice(self.partition_max) for tp in chosen}
            listed = [(tp, self._partition(tp, mb)) for tp, mb in max_bytes.items()]
            self.session = Session(0, 0, version, max_bytes)
        else:
            session = self.session
            assert session is not None
            version, session_id = session.version, session.session_id
            epoch = -1 if kind == "close" else session.epoch + ahead
            if kind != "close" and not ahead:
                # as a consumer does: the partitions whose position moved, and changes
                for tp, mb in session.max_bytes.items():
                    if session.sent.get(tp) != self.position[tp]:
                        listed.append((tp, self._partition(tp, mb)))
            if kind == "incremental":
                moved = {tp for tp, _ in listed}
                for tp in rng.sample(self.partitions, rng.randint(0, len(self.partitions))):
                    if tp in session.max_bytes and tp not in moved and rng.random() < 0.3:
                        forgotten.append(tp)
                        del session.max_bytes[tp]
                    elif tp not in session.max_bytes:
                        session.max_bytes[tp] = rng.choice(self.partition_max)
                        listed.append((tp, self._partition(tp, session.max_bytes[tp])))
        where = (
            f"{kind} v{version} {common} "
            f"asked {[(t[-6:], p, b['fetch_offset'], b['partition_max_bytes']) for (t, p), b in listed]}"
            f" forgot {forgotten}"
        )
        body = script_body(self.ids, listed, forgotten, session_id, epoch, common)
        return Fetch(kind, version, isolation, listed, body, where)

    def _partition(self, tp: TopicPartition, max_bytes: int) -> dict[str, Any]:
        return partition_body(tp[1], self.position[tp], max_bytes)

    # -- checking an answer -----------------------------------------------------------

    def _check(
        self,
        kind: str,
        version: int,
        isolation: int,
        listed: list[tuple[TopicPartition, dict[str, Any]]],
        answer: Any,
        where: str,
    ) -> None:
        def problem(text: str) -> None:
            self.problems.append(f"{where}\n    {text}")

        if answer.error_code != ErrorCode.none:
            problem(f"top-level error {answer.error_code!r}")
            self.session = None
            return
        session = self.session
        asked = {tp: body["fetch_offset"] for tp, body in listed}
        if kind == "close":
            self.session = None
            self.told.clear()
            return
        if kind == "full":
            assert session is not None
            if answer.session_id == 0:
                self.session = None
            else:
                session.session_id, session.epoch = int(answer.session_id), 1
                session.sent = dict(asked)
        elif kind in ("incremental", "same"):
            assert session is not None
            for tp in session.max_bytes:
                asked.setdefault(tp, session.sent.get(tp, self.position[tp]))
            if answer.session_id == 0:
                # the request left the session empty: the broker closed it (as Kafka does)
                self.session = None
                self.told.clear()
            else:
                session.epoch += 1
                session.sent.update((tp, b["fetch_offset"]) for tp, b in listed)
        got: dict[TopicPartition, Any] = {}
        for topic in answer.responses:
            name = self.names.get(topic.topic_id) if version >= 13 else topic.topic
            for pd in topic.partitions:
                got[(name, int(pd.partition_index))] = pd
        if kind in ("sessionless", "full") and set(got) != set(asked):
            problem(f"answered {sorted(got)}, asked {sorted(asked)}")
        if not set(got) <= set(asked):
            problem(f"answered partitions not asked: {sorted(set(got) - set(asked))}")
        if not asked:
            return
        broker = self.upstream.read(asked, isolation, max(self.partition_max))
        for tp, offset in asked.items():
            self._check_partition(tp, offset, got.get(tp), broker[tp], isolation, problem)

    def _check_partition(
        self, tp: TopicPartition, offset: int, pd: Any, direct: Any, isolation: int, problem: Any
    ) -> None:
        if pd is None:
            self.seen["left out of an incremental answer"] += 1
            if tp not in self.told:
                problem(f"{tp} left out of an incremental answer, never told before")
            return
        if pd.error_code != direct.error_code:
            problem(f"{tp} error {pd.error_code!r}, the broker's {direct.error_code!r}")
            return
        if pd.error_code != ErrorCode.none:
            self.told.pop(tp, None)
            return
        mine, size = whole_batches(pd.records)
        theirs, _ = whole_batches(direct.records)
        if [b.data for b in mine] != [b.data for b in theirs[: len(mine)]]:
            problem(
                f"{tp} batches {[(b.base, b.last) for b in mine]} are not a prefix of the"
                f" broker's {[(b.base, b.last) for b in theirs]}"
            )
        if size != sum(len(b.data) for b in mine):
            problem(f"{tp} a partial batch delivered ({size} bytes)")
        marks = (int(pd.high_watermark), int(pd.last_stable_offset), int(pd.log_start_offset))
        broker = (
            int(direct.high_watermark),
            int(direct.last_stable_offset),
            int(direct.log_start_offset),
        )
        if marks[0] > broker[0] or marks[2] > broker[2] or marks[1] > broker[1]:
            problem(f"{tp} watermarks {marks} ahead of the broker's {broker}")
        before = self.told.get(tp)
        if before is not None and (
            marks[0] < before[0] or marks[1] < before[1] or marks[2] < before[2]
        ):
            problem(f"{tp} watermarks went back: {before} -> {marks}")
        self.told[tp] = marks
        if not mine:
            return
        self.seen["partitions with records"] += 1
        if len(mine) < len(theirs):
            self.seen["trimmed"] += 1
        last = mine[-1].last
        if last >= broker[0]:
            problem(f"{tp} records up to {last}, past the high watermark {broker[0]}")
        if isolation == READ_COMMITTED:
            if last >= broker[1]:
                problem(f"{tp} read_committed records up to {last}, past the last stable offset")
            listed, known = aborted_of(pd), aborted_of(direct)
            needed = {a for a in known if a[1] <= last}
            if needed:
                self.seen["aborted transactions needed"] += 1
            if not needed <= listed:
                problem(
                    f"{tp} aborted transactions {sorted(listed)} miss {sorted(needed - listed)}"
                    f" (the broker's {sorted(known)}, records delivered up to {last})"
                )
            if not listed <= known:
                problem(f"{tp} aborted transactions {sorted(listed - known)} the broker has not")
        self.position[tp] = max(self.position[tp], last + 1)
