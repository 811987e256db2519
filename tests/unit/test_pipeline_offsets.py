import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.offsets import (
    EARLIEST,
    LATEST,
    OffsetOptionError,
    OffsetRange,
    cap_offsets,
    parse_offsets_option,
    plan_ranges,
    resolve,
)

TPS = [("a", 0), ("a", 1), ("b", 0)]


def test_keywords() -> None:
    assert parse_offsets_option(
        "startingOffsets", None, "earliest", TPS, batch=True
    ) == dict.fromkeys(TPS, EARLIEST)
    assert parse_offsets_option(
        "endingOffsets", "latest", "latest", TPS, batch=True
    ) == dict.fromkeys(TPS, LATEST)


@pytest.mark.parametrize(
    ("name", "value", "batch"),
    [
        ("startingOffsets", "latest", True),  # a batch query starting at latest reads nothing
        ("endingOffsets", "earliest", True),
        ("endingOffsets", '{"a": {"0": -2, "1": 5}, "b": {"0": 1}}', True),
        ("startingOffsets", '{"a": {"0": 1}}', True),  # partitions missing
        ("startingOffsets", '{"zz": {"0": 1}}', True),  # not a partition being read
        ("startingOffsets", "[1, 2]", True),
        ("startingOffsets", "yesterday", False),
        ("startingOffsets", '{"a": {"0": -3, "1": 0}, "b": {"0": 0}}', False),
    ],
)
def test_refusals_name_the_option(name: str, value: str, batch: bool) -> None:
    with pytest.raises(OffsetOptionError, match=name):
        parse_offsets_option(name, value, "earliest", TPS, batch=batch)


def test_json_and_resolution() -> None:
    spec = parse_offsets_option(
        "startingOffsets", '{"a": {"0": 5, "1": -2}, "b": {"0": -1}}', "earliest", TPS, batch=False
    )
    marks = {("a", 0): (2, 10), ("a", 1): (3, 7), ("b", 0): (0, 4)}
    assert resolve(spec, marks) == {("a", 0): 5, ("a", 1): 3, ("b", 0): 4}
    # absolute offsets are clamped into [low, high]
    assert resolve({("a", 0): 50}, marks) == {("a", 0): 10}


def test_plan_skips_empty_ranges() -> None:
    ranges = plan_ranges({("a", 0): 5, ("a", 1): 7}, {("a", 0): 9, ("a", 1): 7})
    assert ranges == [OffsetRange("a", 0, 5, 9)]


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("xyz"), st.integers(0, 5)),
        st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
        min_size=1,
    ),
    st.integers(1, 3000),
)
def test_cap_offsets_respects_budget_and_bounds(spans: dict, budget: int) -> None:
    starts = {tp: min(a, b) for tp, (a, b) in spans.items()}
    latest = {tp: max(a, b) for tp, (a, b) in spans.items()}
    ends = cap_offsets(starts, latest, budget)
    assert set(ends) == set(latest)
    for tp in latest:
        assert starts[tp] <= ends[tp] <= latest[tp]
    total = sum(ends[tp] - starts[tp] for tp in latest)
    backlog = sum(latest[tp] - starts[tp] for tp in latest)
    assert total <= budget
    assert total == backlog or total >= min(budget, backlog) - len(
        latest
    )  # nearly all the budget used
