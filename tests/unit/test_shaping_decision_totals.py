"""A shaping decision's totals are the sums over every partition's outcome.

``ShapingDecision.from_trim`` skips, in its one pass, the outcomes of partitions that
had nothing on offer and nothing from upstream (most of a sessionless fetch's): for
random responses (empty partitions, data, errors, partial batches, legacy data) its
totals must be those of the plain sums over all outcomes.
"""

from __future__ import annotations

import random

import pytest
from support.fetch_model import batch, make_partition, make_response

from proxy.shaping.decision import ShapingDecision
from proxy.shaping.limits import Limits, ResponseLimits
from proxy.shaping.trim import trim_response

V = 12


def legacy_message_set() -> bytes:
    """A magic-1 message set (no v2 header): passed through unshaped."""
    body = bytes([0, 0, 0, 0, 1, 0]) + bytes(16)
    return (0).to_bytes(8, "big") + len(body).to_bytes(4, "big") + body + bytes(4)


@pytest.mark.parametrize("seed", range(60))
def test_totals_are_the_sums_over_every_outcome(seed: int) -> None:
    rng = random.Random(seed)
    parts = []
    for p in range(rng.randint(1, 40)):
        kind = rng.random()
        if kind < 0.5:
            parts.append(make_partition(V, p, b"" if rng.random() < 0.5 else None))
        elif kind < 0.6:
            parts.append(make_partition(V, p, None, error=6))
        elif kind < 0.65:
            parts.append(make_partition(V, p, legacy_message_set()))
        elif kind < 0.7:  # only the start of a batch: nothing on offer, bytes dropped
            parts.append(make_partition(V, p, batch(0, 5)[: rng.randint(1, 30)]))
        else:
            data = b"".join(batch(i * 5, 5, payload=rng.randint(1, 400)) for i in range(3))
            if rng.random() < 0.3:
                data += batch(15, 5)[: rng.randint(1, 30)]  # a partial trailing batch
            parts.append(make_partition(V, p, data))
    limits = ResponseLimits(
        response_bytes=rng.choice((None, 500, 5000)),
        response_records=rng.choice((None, 7, 40)),
        partition_bytes=rng.choice((None, 300, 3000)),
    )
    result = trim_response(make_response(V, parts), limits)
    d = ShapingDecision.from_trim(
        result,
        api_version=V,
        requested_max_bytes=1 << 20,
        upstream_max_bytes=1 << 20,
        limits=Limits(),
    )
    outs = list(result.outcomes.values())
    assert d.partitions == len(outs)
    assert d.delivered_bytes == sum(o.delivered_bytes for o in outs)
    assert d.delivered_records == sum(o.delivered_records for o in outs)
    assert d.upstream_bytes == sum(o.upstream_bytes for o in outs)
    assert d.upstream_records == sum(o.upstream_records for o in outs)
    assert d.reused_bytes == sum(o.reused_bytes for o in outs)
    assert d.dropped_partial_bytes == sum(o.dropped_partial_bytes for o in outs)
    assert d.partitions_served == sum(1 for o in outs if o.delivered_batches)
    assert d.unshaped_partitions == sum(1 for o in outs if not o.shaped)
    assert d.progress_exemption == any(o.exempt for o in outs)
    assert d.partitions_with_data == sum(1 for o in outs if o.had_data)
    assert d.partitions_trimmed == sum(1 for o in outs if o.had_data and o.remainder.headers)
    assert d.trimmed_bytes == sum(o.remainder.size for o in outs if o.had_data)
