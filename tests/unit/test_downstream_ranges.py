"""The downstream session's walks, cut into ranges, give what the uncut calls give.

Issue 19 part 2: a client's fetch is opened against its session and answered
from it in ranges of partitions (``DownstreamSessions.open_in_ranges`` and
``answer_in_ranges``), each range one slice of the event loop.  For random
fetches (names and topic ids, sessionless, creating a session, incremental with
forgotten partitions) the ranged calls must give, byte for byte, the request and
the answer the uncut ones give, and leave the session cache in the same state;
a fetch of 20,000 partitions must yield many times in each direction.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import pytest
from support.fetch_messages import counted, fetch_request, fetch_response, partition_data

from proxy.protocol import codec
from proxy.protocol.messages import make, request_module, response_module
from proxy.sessions import as_broker
from proxy.sessions.as_broker import DownstreamFetch, DownstreamSessions
from proxy.sessions.as_broker_cache import FetchSessionCache
from proxy.sessions.client_fetch import ClientFetch, ClientReply
from proxy.sessions.topic_ids import TopicIdMap

EVERY = 7


def client(request: Any) -> ClientFetch:
    """*request* validated as the fetch path validates a client's Fetch, once, at decode."""
    validated = ClientFetch.validate(request)
    assert validated is not None  # a consumer's
    return validated


def twins(seed: int) -> tuple[DownstreamSessions, DownstreamSessions]:
    """Two connections' downstream sessions in identical caches (session ids from one seed)."""
    out = []
    for _ in range(2):
        ids = TopicIdMap()
        cache = FetchSessionCache(rng=random.Random(seed), clock=lambda: 1000.0)
        out.append(DownstreamSessions(cache, ids, max_fetch_partitions=50_000))
    return out[0], out[1]


def topics_of(rng: random.Random, n: int) -> list[tuple[str, uuid.UUID, list[int]]]:
    """Runs of partitions of a few topics (a topic may come back later: two runs)."""
    names = [f"t{i}" for i in range(rng.randint(1, 6))]
    ids = {name: uuid.UUID(int=rng.getrandbits(128)) for name in names}
    runs: list[tuple[str, uuid.UUID, list[int]]] = []
    used: set[tuple[str, int]] = set()
    while sum(len(p) for _, _, p in runs) < n:
        name = rng.choice(names)
        parts = [
            p for p in rng.sample(range(4 * n + 40), rng.randint(1, 40)) if (name, p) not in used
        ]
        used.update((name, p) for p in parts)
        if parts:
            runs.append((name, ids[name], parts))
    return runs


def fetch(
    version: int,
    runs: list[tuple[str, uuid.UUID, list[int]]],
    rng: random.Random,
    *,
    session_id: int = 0,
    epoch: int = -1,
    forgotten: list[tuple[str, uuid.UUID, list[int]]] = (),  # type: ignore[assignment]
) -> Any:
    mod = request_module(1, version)
    topics = tuple(
        make(
            mod.FetchTopic,
            topic=name,
            topic_id=tid,
            partitions=tuple(
                make(
                    mod.FetchPartition,
                    partition=p,
                    fetch_offset=rng.randint(0, 1000),
                    partition_max_bytes=rng.choice((1 << 20, 65536)),
                    log_start_offset=-1,
                    current_leader_epoch=rng.choice((-1, 3)),
                    last_fetched_epoch=-1,
                )
                for p in parts
            ),
        )
        for name, tid, parts in runs
    )
    return fetch_request(
        version,
        topics,
        session_id=session_id,
        session_epoch=epoch,
        forgotten_topics_data=tuple(
            make(mod.ForgottenTopic, topic=name, topic_id=tid, partitions=tuple(parts))
            for name, tid, parts in forgotten
        ),
    )


def full_answer(opened: DownstreamFetch, rng: random.Random) -> Any:
    """The complete full response to ``opened.request``, as upstream would send it."""
    version = opened.version
    mod = response_module(1, version)
    on_ids = version >= 13
    topics = tuple(
        make(
            mod.FetchableTopicResponse,
            topic=t.topic_id if on_ids else t.topic,
            topic_id=t.topic_id if on_ids else t.topic,
            partitions=tuple(
                partition_data(
                    version,
                    p.partition,
                    high_watermark=rng.choice((5, 9)),
                    records=rng.choice((None, b"x" * 3)),
                )
                for p in t.partitions
            ),
        )
        for t in opened.request.topics
    )
    return fetch_response(version, topics)


def same_open(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, ClientReply):
        assert codec.encode_response(a.response, 1) == codec.encode_response(b.response, 1)
        return
    assert codec.encode_request(a.request, 1, "c") == codec.encode_request(b.request, 1, "c")
    assert a.by_ref == b.by_ref and list(a.by_ref) == list(b.by_ref)
    assert a.context.partitions() == b.context.partitions()


def same_caches(a: DownstreamSessions, b: DownstreamSessions) -> None:
    sa, sb = a.sessions.sessions(), b.sessions.sessions()
    assert [(s.id, s.epoch, list(s.partitions)) for s in sa] == [
        (s.id, s.epoch, list(s.partitions)) for s in sb
    ]
    assert a.sessions.num_partitions == b.sessions.num_partitions


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("version", [7, 12, 13, 17])
def test_ranged_open_and_answer_give_the_uncut_result_byte_for_byte(
    seed: int, version: int
) -> None:
    rng = random.Random(seed * 100 + version)
    whole, ranged = twins(seed)
    runs = topics_of(rng, rng.randint(1, 120))
    # a fetch that creates a session (epoch 0), then incremental ones in it
    epoch, session_id = 0, 0
    for _ in range(3):
        state = rng.getstate()
        request = fetch(version, runs, rng, session_id=session_id, epoch=epoch)
        forget = [(n, t, p[: rng.randint(0, len(p))]) for n, t, p in runs[:1]]
        if epoch > 0 and rng.random() < 0.5:
            request = fetch(
                version, runs[1:], rng, session_id=session_id, epoch=epoch, forgotten=forget
            )
        a = whole.open(client(request))
        b, _ = counted(ranged.open_in_ranges(client(request), EVERY))
        same_open(a, b)
        same_caches(whole, ranged)
        if isinstance(a, ClientReply):
            return
        assert isinstance(b, DownstreamFetch)
        rng.setstate(state)
        answer = full_answer(a, rng)
        ra = whole.answer(a, answer)
        rb, _ = counted(ranged.answer_in_ranges(b, answer, EVERY))
        assert codec.encode_response(ra, 3) == codec.encode_response(rb, 3)
        same_caches(whole, ranged)
        session_id, epoch = int(ra.session_id), (epoch + 1 if ra.session_id else -1)
        if not session_id:
            return


def test_a_fetch_of_20000_partitions_yields_in_every_walk() -> None:
    rng = random.Random(5)
    n, every = 20_000, 500
    ds = twins(1)[0]
    # A full fetch that asks for a session (epoch 0; too large for one, so it is served
    # sessionless) goes the general way: reading the client's partitions, listing them,
    # checking the request lists them as is; then reading the answer and grouping it.
    request = fetch(12, [("big", uuid.uuid4(), list(range(n)))], rng, epoch=0)
    opened, yields_open = counted(ds.open_in_ranges(client(request), every))
    assert isinstance(opened, DownstreamFetch) and len(opened.by_ref) == n
    assert not opened.as_listed and opened.covered == n
    assert yields_open >= 3 * (n // every) - 3
    answered, yields_answer = counted(ds.answer_in_ranges(opened, full_answer(opened, rng), every))
    assert yields_answer >= 2 * (n // every) - 2
    assert sum(len(t.partitions) for t in answered.responses) == n
    # A sessionless fetch in a full fetch's form: one walk, and the answer is upstream's.
    request = fetch(12, [("big", uuid.uuid4(), list(range(n)))], rng)
    opened, yields_open = counted(ds.open_in_ranges(client(request), every))
    assert isinstance(opened, DownstreamFetch) and opened.as_listed and opened.covered == n
    assert yields_open >= n // every - 1
    full = full_answer(opened, rng)
    answered, yields_answer = counted(ds.answer_in_ranges(opened, full, every))
    assert answered is full and yields_answer == 0


def odd_fetch(version: int, rng: random.Random) -> Any:
    """A sessionless fetch with what a full fetch's form excludes, now and then: a topic
    listed twice, a partition named twice, an epoch below -1, an empty topic entry."""
    runs = topics_of(rng, rng.randint(1, 60))
    if rng.random() < 0.3 and runs:
        name, tid, parts = runs[0]
        runs.append((name, tid, parts[:1]))  # listed again (and its partition twice)
    if rng.random() < 0.2 and runs:
        name, tid, parts = runs[-1]
        runs[-1] = (name, tid, [*parts, parts[0]])  # twice in one entry
    if rng.random() < 0.1:
        runs.append(("empty", uuid.UUID(int=7), []))
    request = fetch(version, runs, rng)
    if version >= 9 and rng.random() < 0.2:  # (current_leader_epoch from v9 on)
        t = request.topics[0]
        p = dataclasses.replace(t.partitions[0], current_leader_epoch=-2)
        t = dataclasses.replace(t, partitions=(p, *t.partitions[1:]))
        request = dataclasses.replace(request, topics=(t, *request.topics[1:]))
    return request


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("version", [4, 6, 7, 12, 13, 17])
def test_a_sessionless_fetch_is_opened_and_answered_as_the_general_path_does(
    seed: int, version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``as_listed`` shortcut for sessionless fetches gives, byte for byte, the request
    and the answer the general path (the session cache's context) gives."""
    rng = random.Random(seed * 1000 + version)
    request = odd_fetch(version, rng)
    state = rng.getstate()
    quick, general = twins(seed)
    a = quick.open(client(request))
    assert isinstance(a, DownstreamFetch)
    full = full_answer(a, rng)
    ra = quick.answer(a, full)
    with monkeypatch.context() as m:
        m.setattr(as_broker, "_as_listed_in_ranges", lambda *args: _no())
        b = general.open(client(request))
    assert isinstance(b, DownstreamFetch) and not b.as_listed
    rng.setstate(state)
    rb = general.answer(b, full_answer(b, rng))
    assert codec.encode_request(a.request, 1, "c") == codec.encode_request(b.request, 1, "c")
    assert a.covered == b.covered == len(b.by_ref)
    assert codec.encode_response(ra, 3) == codec.encode_response(rb, 3)
    # upstream's answer in another grouping (a topic's partitions in two entries) is
    # regrouped as the general path regroups it
    if len(full.responses) == 1 and len(full.responses[0].partitions) > 1:
        t = full.responses[0]
        split = dataclasses.replace(
            full,
            responses=(
                dataclasses.replace(t, partitions=t.partitions[:1]),
                dataclasses.replace(t, partitions=t.partitions[1:]),
            ),
        )
        assert codec.encode_response(quick.answer(a, split), 3) == codec.encode_response(
            general.answer(b, split), 3
        )


def _no() -> Any:
    """``_as_listed_in_ranges`` saying no at once: the general path."""
    return False
    yield


def test_a_sessionless_answer_of_20000_topic_entries_yields_in_its_walks() -> None:
    """The as-listed answer checks upstream's topic entries and, when they must be
    regrouped, walks the partitions twice: with a topic entry per partition each walk is
    20,000 long, and yields as the others do."""
    rng = random.Random(6)
    n, every = 20_000, 500
    ds = twins(1)[0]
    request = fetch(12, [(f"t{i}", uuid.uuid4(), [0]) for i in range(n)], rng)
    opened, _ = counted(ds.open_in_ranges(client(request), every))
    assert isinstance(opened, DownstreamFetch) and opened.as_listed
    full = full_answer(opened, rng)
    answered, yields = counted(ds.answer_in_ranges(opened, full, every))
    assert answered is full and yields >= n // every - 1  # the check of its entries
    # a session id on upstream's answer (not the client's): regrouped, session id 0
    answered, yields = counted(
        ds.answer_in_ranges(opened, dataclasses.replace(full, session_id=5), every)
    )
    assert answered.session_id == 0 and len(answered.responses) == n
    assert yields >= 2 * (n // every) - 2  # the partitions, then their grouping
