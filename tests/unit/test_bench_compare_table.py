"""``bench.compare``'s own logic: the alternating order and the table (no stack, no timing).

The whole tool runs in ``tests/integration/test_bench_compare.py`` (test files need distinct basenames: the suite imports them by name).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture
def compare(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("compare")


def test_revisions_alternate_forward_then_backward(compare: ModuleType) -> None:
    assert list(compare.alternating(3, 2)) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    order = list(compare.alternating(4, 3))
    assert [i for _, i in order] == [0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0]
    # every revision measured once per repetition
    for rep in range(4):
        assert sorted(i for r, i in order if r == rep) == [0, 1, 2]


def test_the_table_gives_medians_ranges_ratios_and_who_was_lowest(compare: ModuleType) -> None:
    runs = [
        [{"cpu": 4.0, "mb": 10.0, "note": "x"}, {"cpu": 6.0, "mb": 12.0}, {"cpu": 5.0, "mb": 11.0}],
        [{"cpu": 2.0, "mb": 20.0}, {"cpu": 7.0, "mb": 21.0}, {"cpu": 2.5, "mb": 22.0}],
    ]
    lines = compare.table(["A", "B"], runs).splitlines()
    assert lines[0] == "| number | A | B | B / A | lowest (times) |"
    assert lines[2] == "| cpu | 5 (4-6) | 2.5 (2-7) | 0.500 | A 1 / B 2 |"
    assert lines[3] == "| mb | 11 (10-12) | 21 (20-22) | 1.909 | A 3 / B 0 |"
    assert len(lines) == 4  # a number that is not a number is left out


def test_a_number_missing_from_a_repetition_is_left_out(compare: ModuleType) -> None:
    runs = [[{"cpu": 1.0, "p": None}], [{"cpu": 2.0, "p": 3.0}]]
    assert [line.split(" | ")[0] for line in compare.table(["A", "B"], runs).splitlines()[2:]] == [
        "| cpu"
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rev", "HEAD", "--rev", "HEAD", "--scenario", "nope"], "unknown scenario"),
        (["--rev", "HEAD", "--scenario", "fetch_cpu"], "--rev twice"),
        (["--rev", "HEAD", "--rev", "HEAD", "--scenario", "rss"], "cannot be compared"),
        (
            ["--rev", "HEAD", "--rev", "HEAD", "--scenario", "fetch_cpu", "--case", "9 conn"],
            "unknown case",
        ),
    ],
)
def test_what_cannot_be_compared_is_refused_before_anything_starts(
    compare: ModuleType, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare.main([*argv, "--smoke"]) == 2
    assert says in capsys.readouterr().err


def test_one_revision_under_two_settings_is_labelled_by_its_arguments(
    compare: ModuleType,
) -> None:
    argv = ["--rev", "HEAD", "--rev", "HEAD", "--args=", "--args=--reuse-buffer-bytes 16777216"]
    args, rest = compare.build_parser().parse_known_args([*argv, "--scenario", "fetch_cpu"])
    assert rest == []
    assert args.extra == ["", "--reuse-buffer-bytes 16777216"]
    assert compare.labels(args.revs, args.extra) == ["HEAD", "HEAD --reuse-buffer-bytes 16777216"]
    assert compare.labels(["A", "B"], None) == ["A", "B"]


def test_arguments_for_some_revisions_only_are_refused(
    compare: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--rev", "A", "--rev", "B", "--args=--max-records 5", "--scenario", "fetch_cpu"]
    assert compare.main([*argv, "--smoke"]) == 2
    assert "--args once per --rev" in capsys.readouterr().err
