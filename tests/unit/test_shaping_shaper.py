"""FetchShaper end to end against a model broker: nothing lost, nothing duplicated, within limits."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from support.fetch_model import (
    ModelBroker,
    batch,
    delivered,
    make_partition,
    make_request,
    make_response,
    topic_name_or_id,
)

from devbroker.log import PartitionLog
from proxy.protocol import records
from proxy.shaping.budget import MemoryBudget
from proxy.shaping.limits import Limits
from proxy.shaping.shaper import FetchShaper, is_full_fetch

V = 12
T = topic_name_or_id(V)
INF = float("inf")


@dataclass
class Consumer:
    """A client advancing its offsets over what it is given, like the Java consumer."""

    partitions: int
    client_max: int
    client_pmax: int
    offsets: dict[int, int] = field(default_factory=dict)
    got: dict[int, list[bytes]] = field(default_factory=dict)
    idle: dict[int, int] = field(default_factory=dict)
    max_idle: int = 0

    session_epoch: int = -1

    def request(self) -> object:
        return make_request(
            V,
            {i: (self.offsets.get(i, 0), self.client_pmax) for i in range(self.partitions)},
            max_bytes=self.client_max,
            session_epoch=self.session_epoch,
        )

    def accept(self, response: object, logs: dict[int, PartitionLog]) -> None:
        for (_t, i), batches in delivered(response).items():
            for b in batches:
                h = records.read_batch_header(b)
                assert h.base_offset == self.offsets.get(i, 0), "gap or duplicate"
                self.offsets[i] = h.next_offset
                self.got.setdefault(i, []).append(b)
            behind = self.offsets.get(i, 0) < logs[i].high_watermark
            self.idle[i] = 0 if batches or not behind else self.idle.get(i, 0) + 1
            self.max_idle = max(self.max_idle, self.idle[i])


def check_limits(shaped: object, limits: Limits, client_max: int, client_pmax: int) -> None:
    result = shaped.result  # type: ignore[attr-defined]
    rb = min(limits.max_response_bytes or INF, client_max)
    pb = min(limits.max_partition_bytes or INF, client_pmax)
    rr, pr = limits.max_records or INF, limits.max_partition_records or INF
    exempt = [o for o in result.outcomes.values() if o.exempt]
    assert len(exempt) <= 1
    for o in result.outcomes.values():
        if o.exempt:
            assert o.delivered_batches == 1
        else:
            assert o.delivered_bytes <= pb and o.delivered_records <= pr
    total_b = sum(o.delivered_bytes for o in result.outcomes.values())
    total_r = sum(o.delivered_records for o in result.outcomes.values())
    batches = sum(o.delivered_batches for o in result.outcomes.values())
    if total_b > rb:
        assert exempt and batches == 1
    if total_r > rr:
        assert exempt and total_r == exempt[0].delivered_records


part_spec = st.lists(st.tuples(st.integers(1, 30), st.integers(0, 400)), min_size=0, max_size=8)
opt_bytes = st.none() | st.integers(1, 3000)


@settings(max_examples=120, deadline=None)
@given(
    spec=st.lists(part_spec, min_size=1, max_size=6),
    later=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 30), st.integers(0, 400)), max_size=12
    ),
    rb=opt_bytes,
    pb=opt_bytes,
    rr=st.none() | st.integers(1, 60),
    pr=st.none() | st.integers(1, 40),
    client_max=st.integers(1, 6000),
    client_pmax=st.integers(1, 4000),
    buffer_capacity=st.sampled_from([0, 300, 10**9]),
    incremental=st.booleans(),
)
def test_successive_fetches_deliver_exactly_the_upstream_log(
    spec: list[list[tuple[int, int]]],
    later: list[tuple[int, int, int]],
    rb: int | None,
    pb: int | None,
    rr: int | None,
    pr: int | None,
    client_max: int,
    client_pmax: int,
    buffer_capacity: int,
    incremental: bool,
) -> None:
    """Sessionless full fetches (the proxy rotates upstream order) or fetches in an
    incremental session (the broker moves partitions with data to the end)."""
    n = len(spec)
    logs = {i: PartitionLog() for i in range(n)}
    for i, batches in enumerate(spec):
        for count, payload in batches:
            logs[i].append(batch(0, count, payload=payload), leader_epoch=0)
    broker = ModelBroker(V, logs, session_order=incremental)
    limits = Limits(
        max_response_bytes=rb, max_partition_bytes=pb, max_records=rr, max_partition_records=pr
    )
    shaper = FetchShaper(limits, buffer_capacity=buffer_capacity)
    consumer = Consumer(n, client_max, client_pmax, session_epoch=5 if incremental else -1)
    pending = list(later)
    for _round in range(5000):
        if pending and _round % 2:
            i, count, payload = pending.pop(0)
            logs[i % n].append(batch(0, count, payload=payload), leader_epoch=0)
        prepared = shaper.prepare(consumer.request())
        assert prepared.upstream_request.max_bytes <= min(client_max, rb or INF)
        response = broker.fetch(prepared.upstream_request)
        shaped = shaper.finish(prepared, response)
        check_limits(shaped, limits, client_max, client_pmax)
        before = dict(consumer.offsets)
        consumer.accept(shaped.response, logs)
        for (_t, i), off in shaped.next_offsets.items():
            assert consumer.offsets[i] == off and off > before.get(i, 0)
        if any(consumer.offsets.get(i, 0) < logs[i].high_watermark for i in range(n)):
            assert shaped.next_offsets, (
                "a fetch with data behind the high watermark made no progress"
            )
        elif not pending:
            break
    else:
        raise AssertionError("did not finish")
    for i in range(n):
        assert b"".join(consumer.got.get(i, [])) == bytes(logs[i].data)
    if buffer_capacity == 10**9:
        # Every whole batch crossed from upstream exactly once: trimmed-away
        # batches were served from the reuse buffer, never fetched again.
        assert broker.whole_bytes_sent == sum(len(log.data) for log in logs.values())
    if not incremental:
        # Round-robin upstream order plus serve rotation: a partition behind its
        # high watermark waits a bounded number of rounds.  (In an incremental
        # session the broker's move-to-end also moves partitions that returned
        # only a partial batch, so with partition limits below the batch size
        # a later partition can wait as long as an earlier one has data; that
        # order is the broker's, not ours.)
        assert consumer.max_idle <= 2 * n
    assert shaper.serve_rotation.max_starvation <= n - 1


def test_full_fetches_rotate_upstream_order_round_robin() -> None:
    logs = {i: PartitionLog() for i in range(4)}
    for log in logs.values():
        for _ in range(10):
            log.append(batch(0, 1, payload=200), leader_epoch=0)
    broker = ModelBroker(V, logs)
    shaper = FetchShaper(Limits(max_response_bytes=1))
    consumer = Consumer(4, 10**6, 10**6)
    firsts = []
    for _ in range(8):
        req = consumer.request()
        assert is_full_fetch(req)
        prepared = shaper.prepare(req)
        firsts.append(prepared.upstream_request.topics[0].partitions[0].partition)
        shaped = shaper.finish(prepared, broker.fetch(prepared.upstream_request))
        consumer.accept(shaped.response, logs)
        assert shaped.decision.progress_exemption or shaped.decision.delivered_bytes <= 1
    assert firsts == [0, 1, 2, 3, 0, 1, 2, 3]


def test_incremental_fetch_order_is_left_to_the_broker() -> None:
    shaper = FetchShaper(Limits())
    req = make_request(V, {0: (0, 100), 1: (0, 100)}, session_epoch=3)
    shaper.upstream_rotation.observe([(T, 0)])
    assert shaper.prepare(req).upstream_request is req


def test_buffer_is_served_and_upstream_starts_after_it() -> None:
    shaper = FetchShaper(Limits(max_partition_records=2), buffer_capacity=10_000)
    data = batch(0, 2) + batch(2, 2) + batch(4, 2)
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000)}))
    shaped = shaper.finish(prepared, make_response(V, [make_partition(V, 0, data, hw=6)]))
    assert shaped.next_offsets == {(T, 0): 2}
    assert shaped.decision.buffered_bytes == len(data) - len(batch(0, 2))
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}))
    assert prepared.upstream_offsets == {(T, 0): 6}
    assert prepared.upstream_request.topics[0].partitions[0].fetch_offset == 6
    # Upstream has nothing new: an incremental response may even leave the partition out.
    shaped = shaper.finish(prepared, make_response(V, []))
    assert delivered(shaped.response)[(T, 0)] == [batch(2, 2)]
    assert shaped.decision.reused_bytes > 0 and shaped.decision.upstream_bytes == 0
    # The client seeks elsewhere: the held batch is dropped, upstream asked at the client's offset.
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000)}))
    assert prepared.upstream_offsets == {} and shaper.buffer.size == 0


def test_decision_record_is_payload_free() -> None:
    shaper = FetchShaper(Limits(max_response_bytes=100))
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000), 1: (0, 10_000)}, max_bytes=5000))
    resp = make_response(
        V, [make_partition(V, 0, batch(0, 3, payload=300)), make_partition(V, 1, batch(0, 1))]
    )
    shaped = shaper.finish(prepared, resp)
    d = shaped.decision
    assert (d.trimmed_records, d.trimmed_bytes) == (1, len(batch(0, 1)))
    assert d.trimmed_by_limit == (("response_bytes", 1, len(batch(0, 1))),)
    assert shaped.served_after == {(T, 0): 0}
    prepared = shaper.prepare(make_request(V, {0: (3, 10_000), 1: (0, 10_000)}, max_bytes=5000))
    shaped = shaper.finish(prepared, make_response(V, [make_partition(V, 1, batch(0, 1))]))
    assert shaped.served_after == {(T, 1): 1}
    assert (d.requested_max_bytes, d.upstream_max_bytes) == (5000, 100)
    assert (d.partitions, d.partitions_with_data, d.partitions_served, d.partitions_starved) == (
        2,
        2,
        1,
        1,
    )
    assert d.progress_exemption and d.limited_by == {"response_bytes"} and d.max_starvation == 1
    assert d.limits.max_response_bytes == 100
    assert all(not isinstance(v, bytes) for v in asdict(d).values())


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.lists(st.integers(0, 900), min_size=1, max_size=10), min_size=2, max_size=5),
    capacity_batches=st.integers(2, 8),
    limit=st.integers(1, 3000),
)
def test_connections_sharing_a_budget_never_exceed_it(
    sizes: list[list[int]], capacity_batches: int, limit: int
) -> None:
    """Several connections, one budget: the budget's peak stays within capacity."""
    largest = max(len(batch(0, 1, payload=p)) for ps in sizes for p in ps)
    budget = MemoryBudget(capacity_batches * largest, floor=largest)
    conns = []
    for ps in sizes:
        logs = {0: PartitionLog(), 1: PartitionLog()}
        for j, p in enumerate(ps):
            logs[j % 2].append(batch(0, 1, payload=p), leader_epoch=0)
        conns.append(
            (
                logs,
                ModelBroker(V, logs),
                FetchShaper(Limits(max_response_bytes=limit), buffer_capacity=10**6, budget=budget),
                Consumer(2, 10**6, 10**6),
            )
        )
    in_flight: list[object] = []
    for _ in range(2000):
        active = [
            c for c in conns if any(c[3].offsets.get(i, 0) < c[0][i].high_watermark for i in c[0])
        ]
        if not active:
            break
        for logs, broker, shaper, consumer in active:
            req = consumer.request()
            # The response's room taken before it is read: as much of its max_bytes as
            # the budget has, at least the floor (one batch); else it waits.
            asked = int(req.max_bytes)  # type: ignore[attr-defined]
            size = min(asked, budget.headroom)
            grant = budget.try_reserve(size) if size >= min(asked, budget.floor) else None
            if grant is None:
                # Must wait: the oldest response finishes being written.
                assert in_flight
                in_flight.pop(0).release()  # type: ignore[attr-defined]
                continue
            prepared = shaper.prepare(req, grant=grant)
            shaped = shaper.finish(prepared, broker.fetch(prepared.upstream_request))
            assert grant.nbytes == shaped.decision.delivered_bytes
            consumer.accept(shaped.response, logs)
            in_flight.append(grant)
            assert budget.used <= budget.capacity
        while len(in_flight) > 2:
            in_flight.pop(0).release()  # type: ignore[attr-defined]
    for logs, _b, shaper, consumer in conns:
        for i in logs:
            assert b"".join(consumer.got.get(i, [])) == bytes(logs[i].data)
        shaper.close()
    for g in in_flight:
        g.release()  # type: ignore[attr-defined]
    assert budget.peak <= budget.capacity and budget.overshoot_bytes == 0
    assert budget.used == 0


def _held_after_first_fetch() -> FetchShaper:
    shaper = FetchShaper(Limits(max_partition_records=2), buffer_capacity=10_000)
    data = batch(0, 2) + batch(2, 2) + batch(4, 2)
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000)}))
    shaper.finish(prepared, make_response(V, [make_partition(V, 0, data, hw=6)]))
    return shaper


def test_high_watermark_going_back_discards_held_batches_and_data_read_past_them() -> None:
    shaper = _held_after_first_fetch()
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}))
    assert prepared.upstream_offsets == {(T, 0): 6}
    shaped = shaper.finish(prepared, make_response(V, [make_partition(V, 0, batch(6, 1), hw=3)]))
    assert delivered(shaped.response)[(T, 0)] == []  # no gap: nothing rather than offset 6
    assert shaped.next_offsets == {} and shaper.buffer.size == 0
    # The next fetch goes upstream from the client's own offset again.
    assert shaper.prepare(make_request(V, {0: (2, 10_000)})).upstream_offsets == {}


def test_offset_out_of_range_past_held_batches_is_not_the_clients_error() -> None:
    shaper = _held_after_first_fetch()
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}))
    shaped = shaper.finish(prepared, make_response(V, [make_partition(V, 0, b"", error=1)]))
    pd = shaped.response.responses[0].partitions[0]
    assert pd.error_code == 0 and pd.records == b""


def test_other_errors_reach_the_client_and_drop_held_batches() -> None:
    shaper = _held_after_first_fetch()
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}))
    shaped = shaper.finish(prepared, make_response(V, [make_partition(V, 0, b"", error=6)]))
    assert shaped.response.responses[0].partitions[0].error_code == 6
    assert shaper.buffer.size == 0


def test_leader_epoch_change_drops_held_batches() -> None:
    shaper = _held_after_first_fetch()
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}))
    resp = make_response(V, [make_partition(V, 0, batch(6, 1), hw=7, leader_epoch=9)])
    shaped = shaper.finish(prepared, resp)
    assert delivered(shaped.response)[(T, 0)] == [] and shaped.next_offsets == {}


def test_running_ahead_under_a_partition_byte_cap_fetches_each_byte_about_once() -> None:
    """The bench's shaped case (``--max-records 500 --max-partition-bytes 65536``, batches
    smaller than the cap, partitions larger): a broker cuts a partition's read at the
    partition_max_bytes it is asked, mid-batch, and the partial trailing batch is dropped
    and fetched again.  Asked the cap, each partition cost a partial batch per 64 KiB
    (1.185x at 128 MB over 1,000 partitions on Kafka); asked the client's own partition
    max_bytes while running ahead, the cap is applied by trimming and the rest is held."""
    partitions, batches, count, size = 40, 6, 24, 1000
    logs = {i: PartitionLog() for i in range(partitions)}
    for log in logs.values():
        for _ in range(batches):
            log.append(batch(0, count, payload=count * size), leader_epoch=0)
    broker = ModelBroker(V, logs)
    limits = Limits(max_records=500, max_partition_bytes=65536)
    shaper = FetchShaper(limits, buffer_capacity=4 << 20)
    consumer = Consumer(partitions, 50 << 20, 1 << 20)
    total = sum(len(log.data) for log in logs.values())
    for _round in range(10_000):
        prepared = shaper.prepare(consumer.request())
        response = broker.fetch(prepared.upstream_request)
        shaped = shaper.finish(prepared, response)
        check_limits(shaped, limits, 50 << 20, 1 << 20)
        consumer.accept(shaped.response, logs)
        if all(consumer.offsets.get(i, 0) == logs[i].high_watermark for i in logs):
            break
    else:
        raise AssertionError("did not finish")
    assert sum(len(b) for got in consumer.got.values() for b in got) == total
    assert broker.bytes_sent <= 1.05 * total, broker.bytes_sent / total
