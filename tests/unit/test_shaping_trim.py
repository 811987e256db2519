"""Trimming a Fetch response: whole batches, limits, progress, metadata, aborted transactions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fetch_model import (
    batch,
    control,
    delivered,
    make_partition,
    make_response,
    topic_name_or_id,
    txn,
)

from proxy.protocol import codec, records
from proxy.protocol.codec import drain
from proxy.protocol.messages import replaced
from proxy.protocol.partition_key import PartitionKey
from proxy.shaping.limits import ResponseLimits
from proxy.shaping.trim import (
    Prefix,
    Run,
    allocate,
    concat,
    parse_records,
    trim_held_in_ranges,
    trim_response,
)

V = 12
T = topic_name_or_id(V)


def k(i: int, version: int = V) -> PartitionKey:
    return (topic_name_or_id(version), i)


def seq(base: int, *counts: int, payload: int = 10) -> bytes:
    out = b""
    for c in counts:
        out += batch(base, c, payload=payload)
        base += c
    return out


def test_untouched_when_within_limits() -> None:
    data = seq(0, 3, 2)
    resp = make_response(V, [make_partition(V, 0, data)])
    res = trim_response(resp, ResponseLimits(response_bytes=10_000))
    assert res.response == resp
    assert res.outcomes[k(0)].next_offset == 5
    assert not res.limited_by


def test_partial_trailing_batch_dropped() -> None:
    data = seq(0, 3, 2) + batch(5, 4)[:40]
    res = trim_response(make_response(V, [make_partition(V, 0, data)]), ResponseLimits())
    assert b"".join(delivered(res.response)[k(0)]) == seq(0, 3, 2)
    o = res.outcomes[k(0)]
    assert (o.dropped_partial_bytes, o.next_offset, o.upstream_bytes) == (40, 5, len(data))


def test_partial_batch_is_never_the_only_content() -> None:
    resp = make_response(V, [make_partition(V, 0, batch(0, 4)[:30], hw=4)])
    res = trim_response(resp, ResponseLimits())
    pd = res.response.responses[0].partitions[0]
    assert pd.records == b"" and pd.high_watermark == 4
    assert res.outcomes[k(0)].next_offset is None
    assert not res.outcomes[k(0)].had_data


def test_response_byte_limit_stops_at_whole_batches() -> None:
    b = len(batch(0, 1))
    resp = make_response(
        V, [make_partition(V, 0, seq(0, 1, 1, 1)), make_partition(V, 1, seq(0, 1, 1))]
    )
    res = trim_response(resp, ResponseLimits(response_bytes=4 * b + 5))
    got = delivered(res.response)
    assert (len(got[k(0)]), len(got[k(1)])) == (3, 1)
    assert res.outcomes[k(1)].limited_by == {"response_bytes"}
    assert res.outcomes[k(1)].next_offset == 1
    assert len(res.outcomes[k(1)].remainder.headers) == 1


def test_progress_exemption_one_batch_alone() -> None:
    big = batch(0, 50, payload=5000)
    resp = make_response(
        V, [make_partition(V, 0, big + batch(50, 1)), make_partition(V, 1, batch(0, 1))]
    )
    res = trim_response(resp, ResponseLimits(response_bytes=100, partition_records=10))
    got = delivered(res.response)
    assert got[k(0)] == [big] and got[k(1)] == []
    assert res.outcomes[k(0)].exempt
    assert res.outcomes[k(0)].limited_by == {"response_bytes", "partition_records"}


def test_partition_exemption_leaves_response_budget_for_others() -> None:
    # Kafka: minOneMessage overrides the partition limit; the response budget continues.
    big = batch(0, 5, payload=500)
    resp = make_response(
        V, [make_partition(V, 0, big + batch(5, 1)), make_partition(V, 1, seq(0, 1, 1))]
    )
    res = trim_response(resp, ResponseLimits(response_bytes=10_000, partition_bytes=200))
    got = delivered(res.response)
    assert got[k(0)] == [big] and len(got[k(1)]) == 2


def test_only_first_served_partition_is_exempt() -> None:
    big = batch(0, 5, payload=500)
    resp = make_response(V, [make_partition(V, 0, batch(0, 1)), make_partition(V, 1, big)])
    res = trim_response(resp, ResponseLimits(partition_bytes=200))
    assert len(delivered(res.response)[k(1)]) == 0
    res = trim_response(
        resp, ResponseLimits(partition_bytes=200), order=lambda ks: list(reversed(ks))
    )
    assert delivered(res.response)[k(1)] == [big]
    assert res.serve_order == (k(1), k(0))


def test_record_limits_and_control_batches_count_zero() -> None:
    data = batch(0, 3) + control(3, 7) + batch(4, 2) + batch(6, 1)
    resp = make_response(V, [make_partition(V, 0, data)])
    res = trim_response(resp, ResponseLimits(response_records=5))
    o = res.outcomes[k(0)]
    assert (o.delivered_batches, o.delivered_records, o.next_offset) == (3, 5, 6)
    res = trim_response(resp, ResponseLimits(partition_records=3))
    assert res.outcomes[k(0)].delivered_batches == 2  # control batch rides along for free


def test_error_partitions_pass_through() -> None:
    bad = make_partition(V, 1, b"", error=1, hw=-1)
    resp = make_response(V, [make_partition(V, 0, seq(0, 2, 2)), bad])
    res = trim_response(resp, ResponseLimits(response_bytes=1))
    assert res.response.responses[0].partitions[1] is bad
    assert res.outcomes[k(1)].error_code == 1


def test_metadata_kept_on_trimmed_partitions() -> None:
    pd = make_partition(V, 0, seq(0, 2, 2), hw=77, leader_epoch=4)
    res = trim_response(make_response(V, [pd]), ResponseLimits(response_bytes=1))
    out = res.response.responses[0].partitions[0]
    assert (out.high_watermark, out.last_stable_offset, out.log_start_offset) == (77, 77, 0)
    assert out.current_leader == pd.current_leader


def test_invalid_batches_raise_protocol_error() -> None:
    bad = bytearray(batch(0, 1))
    bad[16] = 3
    with pytest.raises(records.InvalidRecordBatch):
        trim_response(make_response(V, [make_partition(V, 0, bytes(bad))]), ResponseLimits())


@pytest.mark.parametrize("version", [4, 5, 11, 12, 13, 16, 18])
def test_trimmed_response_encodes_and_decodes(version: int) -> None:
    resp = make_response(
        version,
        [
            make_partition(version, 0, seq(0, 2, 3, 1), aborted=[(5, 2)]),
            make_partition(version, 1, seq(0, 4)),
        ],
    )
    res = trim_response(resp, ResponseLimits(response_bytes=len(batch(0, 2)) + 1))
    _cid, decoded = codec.decode_response(1, version, codec.encode_response(res.response, 3))
    assert decoded == res.response
    assert delivered(decoded)[k(0, version)] == [batch(0, 2)]


# --- aborted transactions -------------------------------------------------------


def test_aborted_list_limited_to_delivered_range() -> None:
    data = txn(0, 2, 9) + control(2, 9) + txn(3, 2, 8) + control(5, 8)
    resp = make_response(V, [make_partition(V, 0, data, aborted=[(9, 0), (8, 3)])])
    res = trim_response(resp, ResponseLimits(response_bytes=len(txn(0, 2, 9)) + len(control(2, 9))))
    pd = res.response.responses[0].partitions[0]
    assert [(t.producer_id, t.first_offset) for t in pd.aborted_transactions] == [(9, 0)]
    # The remainder starts after 9's abort marker: 9's entry is closed, 8's is still to come.
    assert res.outcomes[k(0)].remainder.aborted == ((8, 3),)


def test_null_aborted_list_stays_null_and_empty_stays_list() -> None:
    resp = make_response(
        V, [make_partition(V, 0, seq(0, 2, 2)), make_partition(V, 1, seq(0, 1), aborted=[])]
    )
    res = trim_response(resp, ResponseLimits(response_bytes=1))
    p0, p1 = res.response.responses[0].partitions
    assert p0.aborted_transactions is None
    assert p1.aborted_transactions == ()


class JavaReadCommitted:
    """The read_committed record filter of Kafka's Java consumer (CompletedFetch), per response."""

    def __init__(self, abort_markers: set[int]) -> None:
        self.abort_markers = abort_markers  # offsets of control batches that are ABORT markers
        self.consumed: list[int] = []
        self.position = 0

    def consume(self, data: bytes, aborted: Any) -> None:
        queue = sorted(((t.first_offset, t.producer_id) for t in aborted or ()), reverse=True)
        aborted_pids: set[int] = set()
        for h in records.iter_batches(data):
            if h.producer_id != -1:
                while queue and queue[-1][0] <= h.last_offset:
                    aborted_pids.add(queue.pop()[1])
                if h.is_control and h.base_offset in self.abort_markers:
                    aborted_pids.discard(h.producer_id)
                elif h.is_transactional and h.producer_id in aborted_pids:
                    self.position = h.next_offset
                    continue
            if not h.is_control:
                self.consumed.extend(
                    o for o in range(h.base_offset, h.next_offset) if o >= self.position
                )
            self.position = h.next_offset


@st.composite
def transactional_logs(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int]], set[int]]:
    """A log of plain and transactional batches; returns (data, aborted list, abort markers)."""
    open_txn: dict[int, int] = {}
    txns: list[tuple[int, int, int, bool]] = []  # pid, first, marker, aborted
    data = b""
    offset = 0
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["plain", "txn", "end"]))
        pid = draw(st.integers(1, 3))
        count = draw(st.integers(1, 4))
        if kind == "plain":
            data += batch(offset, count)
        elif kind == "txn":
            open_txn.setdefault(pid, offset)
            data += txn(offset, count, pid)
        elif pid in open_txn:
            txns.append((pid, open_txn.pop(pid), offset, draw(st.booleans())))
            data += control(offset, pid)
            count = 1
        else:
            continue
        offset += count
    if not data:
        data, offset = batch(0, 1), 1
    for pid, first in sorted(open_txn.items()):
        txns.append((pid, first, offset, draw(st.booleans())))
        data += control(offset, pid)
        offset += 1
    aborted = sorted((first, pid) for pid, first, _m, ab in txns if ab)
    markers = {m for _p, _f, m, ab in txns if ab}
    return data, [(pid, first) for first, pid in aborted], markers


@settings(max_examples=200, deadline=None)
@given(
    log=transactional_logs(),
    part_bytes=st.integers(1, 400),
    part_records=st.none() | st.integers(1, 6),
)
def test_read_committed_sees_the_same_records_through_trimmed_responses(
    log: tuple[bytes, list[tuple[int, int]], set[int]], part_bytes: int, part_records: int | None
) -> None:
    data, aborted, markers = log
    truth = JavaReadCommitted(markers)
    full = make_partition(V, 0, data, aborted=aborted)
    truth.consume(data, full.aborted_transactions)

    client = JavaReadCommitted(markers)
    limits = ResponseLimits(partition_bytes=part_bytes, partition_records=part_records)
    resp = make_response(V, [full])
    prefix = None
    for _ in range(200):
        res = trim_response(resp, limits, prefixes={k(0): prefix} if prefix else None)
        pd = res.response.responses[0].partitions[0]
        assert pd.records, "progress"
        client.consume(pd.records, pd.aborted_transactions)
        rest = res.outcomes[k(0)].remainder
        if not rest.headers:
            break
        # The next fetch is served from the reuse buffer; upstream has nothing new.
        prefix = Prefix(rest, high_watermark=1000)
        resp = make_response(V, [make_partition(V, 0, b"", aborted=[])])
    assert client.consumed == truth.consumed


# --- prefixes (reuse buffer) ------------------------------------------------------


def test_prefix_goes_first_and_upstream_continues() -> None:
    held, _ = parse_records(seq(0, 2, 2))
    resp = make_response(V, [make_partition(V, 0, seq(4, 3))])
    res = trim_response(resp, ResponseLimits(), prefixes={k(0): Prefix(held, 100)})
    assert b"".join(delivered(res.response)[k(0)]) == seq(0, 2, 2, 3)
    o = res.outcomes[k(0)]
    assert (o.reused_bytes, o.next_offset) == (len(seq(0, 2, 2)), 7)


def test_concat_skips_overlap_and_refuses_straddling_data() -> None:
    held, _ = parse_records(seq(0, 2, 2))
    overlap, _ = parse_records(seq(2, 2, 3))
    assert concat(held, overlap).data == seq(0, 2, 2, 3)
    straddle, _ = parse_records(seq(3, 2))
    assert concat(held, straddle) == held
    assert concat(Run(b"", ()), overlap).data == overlap.data


def test_prefix_for_partition_missing_from_incremental_response() -> None:
    held, _ = parse_records(seq(0, 2, 2))
    for version in (4, 12, 13):
        key = (topic_name_or_id(version), 3)
        resp = make_response(version, [make_partition(version, 0, b"")])
        res = trim_response(resp, ResponseLimits(), prefixes={key: Prefix(held, 9, 9, 0)})
        assert b"".join(delivered(res.response)[key]) == held.data
        pd = res.response.responses[0].partitions[-1]
        assert (pd.partition_index, pd.high_watermark, pd.error_code) == (3, 9, 0)
        # And in a topic the response does not mention at all.
        other = ("other" if version < 13 else topic_name_or_id(13, "x").__class__(int=5), 0)
        res = trim_response(resp, ResponseLimits(), prefixes={other: Prefix(held, 9)})
        assert b"".join(delivered(res.response)[other]) == held.data
        codec.encode_response(res.response, 1)


def test_prefix_ignored_for_error_partition() -> None:
    held, _ = parse_records(seq(0, 2))
    resp = make_response(V, [make_partition(V, 0, b"", error=6)])
    res = trim_response(resp, ResponseLimits(), prefixes={k(0): Prefix(held, 9)})
    assert delivered(res.response)[k(0)] == []


def test_order_must_be_a_permutation() -> None:
    resp = make_response(V, [make_partition(V, 0, seq(0, 1)), make_partition(V, 1, seq(0, 1))])
    with pytest.raises(ValueError):
        trim_response(resp, ResponseLimits(), order=lambda ks: ks[:1])


# --- the property ---------------------------------------------------------------


@st.composite
def partition_sets(draw: st.DrawFn) -> list[tuple[list[tuple[int, int, bool]], int]]:
    """Per partition: batches (count, payload, control) and a partial tail length."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        batches = draw(
            st.lists(st.tuples(st.integers(1, 20), st.integers(0, 300), st.booleans()), max_size=6)
        )
        out.append((batches, draw(st.integers(0, 60))))
    return out


def _build(spec: list[tuple[int, int, bool]], tail: int) -> bytes:
    data = b""
    offset = 0
    for count, payload, is_control in spec:
        data += control(offset, 5) if is_control else batch(offset, count, payload=payload)
        offset += 1 if is_control else count
    if tail:
        data += batch(offset, 3, payload=100)[: min(tail, 60)]
    return data


opt = st.none() | st.integers(1, 2000)


@settings(max_examples=300, deadline=None)
@given(
    parts=partition_sets(),
    version=st.sampled_from([4, 12, 13]),
    rb=opt,
    rr=st.none() | st.integers(1, 60),
    pb=opt,
    pr=st.none() | st.integers(1, 30),
    rotate=st.integers(0, 5),
)
def test_trim_property(
    parts: list[tuple[list[tuple[int, int, bool]], int]],
    version: int,
    rb: int | None,
    rr: int | None,
    pb: int | None,
    pr: int | None,
    rotate: int,
) -> None:
    datas = [_build(spec, tail) for spec, tail in parts]
    resp = make_response(version, [make_partition(version, i, d) for i, d in enumerate(datas)])
    limits = ResponseLimits(
        response_bytes=rb, response_records=rr, partition_bytes=pb, partition_records=pr
    )

    def order(keys: Any) -> list[Any]:
        r = rotate % len(keys) if keys else 0
        return list(keys[r:]) + list(keys[:r])

    res = trim_response(resp, limits, order=order)
    got = delivered(res.response)
    inf = float("inf")
    total_bytes = total_records = total_batches = 0
    first_size = first_records = None
    for i, data in enumerate(datas):
        key = (topic_name_or_id(version), i)
        whole = list(records.iter_batches(data))
        out = got[key]
        # Delivered batches are a byte-identical prefix of upstream's whole batches.
        assert out == [data[h.position : h.end] for h in whole[: len(out)]]
        hs = [records.read_batch_header(b) for b in out]
        nb, nr = sum(h.size for h in hs), sum(h.counted_records for h in hs)
        o = res.outcomes[key]
        assert (o.delivered_bytes, o.delivered_records, o.delivered_batches) == (nb, nr, len(out))
        assert o.next_offset == (hs[-1].next_offset if hs else None)
        assert o.remainder.data == b"".join(data[h.position : h.end] for h in whole[len(out) :])
        if o.exempt:
            assert len(out) == 1 and first_size is None
            first_size, first_records = nb, nr
        else:
            assert nb <= (pb or inf) and nr <= (pr or inf)
        total_bytes, total_records, total_batches = (
            total_bytes + nb,
            total_records + nr,
            total_batches + len(out),
        )
    if total_bytes > (rb or inf):
        assert first_size is not None and total_batches == 1
    if total_records > (rr or inf):
        assert first_records is not None and total_records == first_records
    # Progress: something went out whenever a whole batch was on offer.
    if any(list(records.iter_batches(d)) for d in datas):
        assert total_batches >= 1
        assert res.serve_order and got[res.serve_order[0]]


def test_legacy_message_format_passes_through_unshaped() -> None:
    # A magic v1 message (offset, size, crc, magic=1, attributes, timestamp, key, value).
    import struct

    body = struct.pack(">bbq", 1, 0, 0) + struct.pack(">i", -1) + struct.pack(">i", 3) + b"abc"
    msg = struct.pack(">I", 0) + body
    legacy = struct.pack(">qi", 0, len(msg)) + msg
    assert legacy[16] == 1
    pd = make_partition(V, 0, legacy * 3)
    res = trim_response(
        make_response(V, [pd, make_partition(V, 1, seq(0, 2))]), ResponseLimits(response_bytes=1)
    )
    assert res.response.responses[0].partitions[0] is pd
    o = res.outcomes[k(0)]
    assert not o.shaped and o.delivered_bytes == len(legacy) * 3 and o.next_offset is None
    assert res.outcomes[k(1)].delivered_batches == 1  # the v2 partition is still shaped


def test_split_view_copies_only_what_may_be_kept() -> None:
    """The delivered head is a view of upstream's bytes; the kept tail owns its bytes."""
    data = seq(0, 2, 3, 1)
    partial = batch(6, 2)[:20]  # a trailing batch the broker cut at max_bytes
    run, dropped = parse_records(data + partial)
    assert dropped == 20 and bytes(run.data) == data
    head, tail = run.split_view(1)
    assert isinstance(head.data, memoryview)  # no copy for what goes out now
    assert type(tail.data) is bytes and tail.data == data[head.size :]
    assert [h.base_offset for h in tail.headers] == [2, 5]
    none, rest = run.split_view(0)
    assert none.size == 0 and type(rest.data) is bytes and rest.data == data
    everything, empty = run.split_view(3)
    assert everything is run and empty.size == 0
    whole, _ = parse_records(data)
    assert whole.data is data and whole.split_view(0)[1].data is data


def test_trimmed_response_encodes_views_like_bytes() -> None:
    data = seq(0, 2, 3)
    resp = make_response(V, [make_partition(V, 0, data + batch(5, 4)[:30])])
    res = trim_response(resp, ResponseLimits(response_bytes=len(batch(0, 2)) + 1))
    (pd,) = res.response.responses[0].partitions
    assert bytes(pd.records) == batch(0, 2)
    (outcome,) = res.outcomes.values()
    assert type(outcome.remainder.data) is bytes and outcome.remainder.data == batch(2, 3)
    frame = codec.encode_response(res.response, 1)
    _, decoded = codec.decode_response(1, V, frame)
    assert decoded.responses[0].partitions[0].records == batch(0, 2)


def test_empty_partitions_share_one_outcome_per_key_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition without records gets the outcome the general path would give it, the same
    frozen object each time (not rebuilt per response), and the shared ones stay bounded."""
    from proxy.shaping import trim

    monkeypatch.setattr(trim, "_EMPTY_OUTCOMES", {})
    monkeypatch.setattr(trim, "_EMPTY_OUTCOMES_MAX", 3)
    empty = make_response(V, [make_partition(V, 0, b"", hw=5), make_partition(V, 1, b"")])
    first = trim_response(empty, ResponseLimits(response_records=1))
    second = trim_response(empty, ResponseLimits(response_records=1))
    for i in (0, 1):
        outcome = first.outcomes[k(i)]
        assert outcome is second.outcomes[k(i)]
        assert (outcome.offered_bytes, outcome.delivered_records) == (0, 0)
        assert outcome.next_offset is None and not outcome.had_data
        assert outcome.remainder == Run(b"", (), None)
    listed = make_response(V, [make_partition(V, 0, b"", aborted=[])])
    assert trim_response(listed, ResponseLimits()).outcomes[k(0)].remainder.aborted == ()
    with_aborted = make_response(V, [make_partition(V, 0, b"", aborted=[(7, 3)])])
    outcome = trim_response(with_aborted, ResponseLimits()).outcomes[k(0)]
    assert outcome.remainder.aborted == ((7, 3),)  # its own: never shared
    assert len(trim._EMPTY_OUTCOMES) == 3
    for i in range(2, 6):
        trim_response(make_response(V, [make_partition(V, i, b"")]), ResponseLimits())
        assert 1 <= len(trim._EMPTY_OUTCOMES) <= 3


@pytest.mark.parametrize("version", range(4, 19))
def test_marks_of_gives_the_same_marks_on_its_fast_path(version: int) -> None:
    """From v5 a response partition carries all three marks: after the first, marks_of
    reads them straight (``_CARRIES_MARKS``), with the values the general path reads."""
    import sys

    from proxy.protocol.messages import make
    from proxy.shaping import trim

    cls = sys.modules[codec.response_schema(1, version).__module__].PartitionData
    entries = [
        make(
            cls,
            partition_index=0,
            error_code=0,
            high_watermark=hw,
            last_stable_offset=hw - 1,
            log_start_offset=3,
            aborted_transactions=(),
            records=None,
        )
        for hw in (10, 20)
    ]
    lso = [9, 19] if version >= 4 else [-1, -1]
    log_start = 3 if version >= 5 else -1
    assert [trim.marks_of(e) for e in entries] == [(10, lso[0], log_start), (20, lso[1], log_start)]
    assert (cls in trim._CARRIES_MARKS) == (version >= 5)


# --- an answer made of held data alone ----------------------------------------------------


def _held_only_trim(
    response: Any,
    held_at: list[tuple[int, tuple[int, ...]]],
    prefixes: dict[PartitionKey, Prefix],
    limits: ResponseLimits,
    order: Any,
) -> Any:
    """The general trim of *response*'s held partitions alone, spliced back into it."""
    topics = response.responses
    shown = replaced(
        response,
        responses=tuple(
            replaced(topics[i], partitions=tuple(topics[i].partitions[a] for a in at))
            for i, at in held_at
        ),
    )
    result = trim_response(shown, limits, prefixes=prefixes, order=order)
    whole = list(topics)
    for (i, at), trimmed in zip(held_at, result.response.responses, strict=True):
        parts = list(whole[i].partitions)
        for a, entry in zip(at, trimmed.partitions, strict=True):
            parts[a] = entry
        whole[i] = replaced(whole[i], partitions=tuple(parts))
    return replaced(result, response=replaced(response, responses=tuple(whole)))


@settings(max_examples=150, deadline=None)
@given(
    held=st.lists(
        st.one_of(st.none(), st.lists(st.integers(1, 20), min_size=1, max_size=5)),
        min_size=1,
        max_size=8,
    ),
    aborted=st.sampled_from([None, (), ((5, 0),)]),
    version=st.sampled_from([4, 11, 12, 16]),
    rr=st.none() | st.integers(1, 60),
    pr=st.none() | st.integers(1, 30),
    pb=opt,
    rotate=st.integers(0, 7),
)
def test_a_held_answer_trims_as_the_general_trim_of_its_held_partitions(
    held: list[list[int] | None],
    aborted: tuple[tuple[int, int], ...] | None,
    version: int,
    rr: int | None,
    pr: int | None,
    pb: int | None,
    rotate: int,
) -> None:
    if all(h is None for h in held):
        held = [*held, [3]]
    parts = []
    prefixes: dict[PartitionKey, Prefix] = {}
    for i, counts in enumerate(held):
        parts.append(make_partition(version, i, None, hw=900 + i, aborted=aborted))
        if counts is not None:
            run, _ = parse_records(seq(100, *counts))
            prefixes[k(i, version)] = Prefix(Run(run.data, run.headers, aborted), 900 + i)
    response = make_response(version, parts)
    positions = tuple(i for i, counts in enumerate(held) if counts is not None)
    held_at = [(0, positions)]
    keys = [k(i, version) for i in positions]
    limits = ResponseLimits(response_records=rr, partition_records=pr, partition_bytes=pb)

    def order(ks: Any) -> list[Any]:
        r = rotate % len(ks) if ks else 0
        return list(ks[r:]) + list(ks[:r])

    runs = {key: prefixes[key].run for key in keys}
    serve = order(keys)
    plan = allocate(runs, serve, limits)
    want = _held_only_trim(response, held_at, prefixes, limits, order)
    got = drain(trim_held_in_ranges(response, held_at, keys, runs, serve, plan, every=2))
    assert got == want
    assert [list(o) for o in (got.outcomes, got.watermarks)] == [keys, keys]  # response order
    # An outcome given again for the same run and limits is the very object; the result
    # is the same.
    again = drain(
        trim_held_in_ranges(response, held_at, keys, runs, serve, plan, unserved=got.outcomes.get)
    )
    assert again == want
    for key, outcome in again.outcomes.items():
        assert (outcome is got.outcomes[key]) == (outcome.delivered_batches == 0)
    # ...and never one for another run, other limits, or one with upstream bytes in it
    stale = {
        key: replaced(o, upstream_bytes=1) if n % 2 else replaced(o, limited_by=frozenset({"x"}))
        for n, (key, o) in enumerate(got.outcomes.items())
    }
    assert (
        drain(trim_held_in_ranges(response, held_at, keys, runs, serve, plan, unserved=stale.get))
        == want
    )
