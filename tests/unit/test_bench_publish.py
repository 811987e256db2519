"""Publishing a benchmark run keeps BENCHMARKS.md's hand-written discussion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def run(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("run")


def test_the_discussion_from_its_mark_on_is_kept(run: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    discussion = f"{run.DISCUSSION_MARK}\n## Discussion\n\nLatency: missed by 0.04 ms.\n"
    page.write_text("# Benchmarks\n\n| old | table |\n\n" + discussion)
    assert run.kept_discussion(page) == discussion


def test_nothing_is_kept_without_the_mark_or_the_file(run: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    assert run.kept_discussion(page) == ""
    page.write_text("# Benchmarks\n\n## Discussion\n\nno mark\n")
    assert run.kept_discussion(page) == ""


@pytest.fixture
def report(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("report")


def test_a_merged_run_replaces_its_targets_rows_in_the_top_table(report: ModuleType) -> None:
    page = "\n".join(
        [
            "# Benchmarks",
            "",
            "## Targets",
            "",
            "| target | case | status | numbers |",
            "|---|---|---|---|",
            "| <= 30 KB RSS per idle connection | 1000 conn | **met** | 0.0 KB per connection |",
            "| uncompressed throughput | uncompressed | **missed** | 0.81x haproxy |",
            "",
            "## Memory per idle connection",
            "",
            "| 1000 conn | proxy | 49 |",
            "",
            "## Sizes",
            "",
        ]
    )
    merged = {
        "target": "<= 30 KB RSS per idle connection",
        "case": "1000 conn",
        "status": "missed",
        "numbers": "50.4 KB per connection",
        "run": "ec66057, 2026-11-26T23:23, 3 rep.",
        "scenario": "rss",
    }
    out = report._replace_target_row(page, merged, "bench/plots")
    rows = [line for line in out.splitlines() if line.startswith("| <= 30 KB")]
    assert rows == [
        "| <= 30 KB RSS per idle connection | 1000 conn | **missed** | 50.4 KB per connection"
        " (merged from ec66057, 2026-11-26T23:23, 3 rep.: see its section) |"
    ]
    # the other target's row and the scenario's own section are left as they were
    assert "| uncompressed throughput | uncompressed | **missed** | 0.81x haproxy |" in out
    assert "| 1000 conn | proxy | 49 |" in out
    other = {**merged, "case": "100 conn"}
    assert report._replace_target_row(page, other, "bench/plots") == page


def test_every_other_repetition_measures_the_arrangements_in_reverse(run: ModuleType) -> None:
    arrangements = ["direct", "haproxy", "proxy"]
    orders = [run.in_turn(arrangements, rep) for rep in range(4)]
    assert orders == [
        ["direct", "haproxy", "proxy"],
        ["proxy", "haproxy", "direct"],
        ["direct", "haproxy", "proxy"],
        ["proxy", "haproxy", "direct"],
    ]
    assert arrangements == ["direct", "haproxy", "proxy"]  # the caller's list is untouched
    # each arrangement's mean place over two repetitions is the same: no one is always last
    places = {a: sum(order.index(a) for order in orders[:2]) for a in arrangements}
    assert len(set(places.values())) == 1
