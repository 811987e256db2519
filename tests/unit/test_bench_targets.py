"""bench.report judges issue 17's targets table: each row met or missed at its threshold,
against direct or haproxy of the same run, and "not measured" when the run lacks it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def report(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("report")


def _results(
    report: ModuleType, cases: dict[tuple[str, str, str], dict[str, float]]
) -> dict[str, Any]:
    out: dict[str, Any] = {"scenarios": {}}
    for (scenario, case, arrangement), numbers in cases.items():
        entry = out["scenarios"].setdefault(scenario, {"cases": {}})["cases"]
        entry.setdefault(case, {})[arrangement] = {"summary": report.summarize([numbers])}
    return out


def _status(report: ModuleType, results: dict[str, Any], prefix: str) -> str:
    (row,) = [t for t in report.targets(results) if t["target"].startswith(prefix)]
    return str(row["status"])


def test_added_latency_at_1000_rec_s_is_judged_at_issue_17s_thresholds(report: ModuleType) -> None:
    def run(p50: float, p99: float) -> dict[str, Any]:
        return _results(
            report,
            {
                ("latency", "1000 rec/s", "direct"): {"p50_ms": 0.2, "p99_ms": 1.0},
                ("latency", "1000 rec/s", "proxy"): {"p50_ms": p50, "p99_ms": p99},
            },
        )

    prefix = "end-to-end latency added at 1,000 rec/s"
    assert _status(report, run(0.34, 1.49), prefix) == "met"
    assert _status(report, run(0.36, 1.49), prefix) == "missed"
    assert _status(report, run(0.34, 1.51), prefix) == "missed"
    assert _status(report, _results(report, {}), prefix) == "not measured"


def test_cpu_per_fetch_needs_both_the_absolute_and_the_haproxy_ratio(report: ModuleType) -> None:
    def run(proxy_ms: float, haproxy_ms: float) -> dict[str, Any]:
        cases: dict[tuple[str, str, str], dict[str, float]] = {}
        for case in ("1 conn", "100 conn", "1000 conn"):
            cases["fetch_cpu", case, "proxy"] = {"relay_cpu_ms_per_fetch": proxy_ms}
            cases["fetch_cpu", case, "haproxy"] = {"relay_cpu_ms_per_fetch": haproxy_ms}
        # one connection is not in the target: its cost is not judged
        cases["fetch_cpu", "1 conn", "proxy"] = {"relay_cpu_ms_per_fetch": 9.0}
        return _results(report, cases)

    prefix = "CPU per small fetch"
    assert _status(report, run(0.10, 0.024), prefix) == "met"
    assert _status(report, run(0.13, 0.03), prefix) == "missed"  # over 0.12 ms
    assert _status(report, run(0.10, 0.019), prefix) == "missed"  # over 5x haproxy's


def test_cpu_per_fetch_names_the_bare_trio_relays_cost_when_measured(report: ModuleType) -> None:
    cases: dict[tuple[str, str, str], dict[str, float]] = {}
    for case in ("100 conn", "1000 conn"):
        cases["fetch_cpu", case, "proxy"] = {"relay_cpu_ms_per_fetch": 0.4}
        cases["fetch_cpu", case, "haproxy"] = {"relay_cpu_ms_per_fetch": 0.025}
    (row,) = [t for t in report.targets(_results(report, cases)) if "small fetch" in t["target"]]
    assert "trio relay" not in row["numbers"]  # not measured: not named
    cases["fetch_cpu", "100 conn", "trio_relay"] = {"relay_cpu_ms_per_fetch": 0.161}
    (row,) = [t for t in report.targets(_results(report, cases)) if "small fetch" in t["target"]]
    assert "100 conn: 0.400 ms = 16.0x haproxy's 0.025; a bare trio relay's 0.161" in row["numbers"]
    assert row["status"] == "missed"  # the floor is context, not a threshold


def test_latency_rows_name_the_bare_trio_relays_when_measured(report: ModuleType) -> None:
    cases = {
        ("latency", "1000 rec/s", "direct"): {"p50_ms": 0.3, "p99_ms": 1.0},
        ("latency", "1000 rec/s", "proxy"): {"p50_ms": 1.0, "p99_ms": 3.0},
        ("latency", "10000 rec/s", "direct"): {"p50_ms": 0.5, "relay_core_percent": 0.0},
        ("latency", "10000 rec/s", "proxy"): {"p50_ms": 9.0, "relay_core_percent": 70.0},
    }

    def rows() -> list[str]:
        return [
            str(t["numbers"])
            for t in report.targets(_results(report, cases))
            if t["scenario"] == "latency"
        ]

    assert all("trio relay" not in r for r in rows())
    cases["latency", "1000 rec/s", "trio_relay"] = {"p50_ms": 0.4, "p99_ms": 1.3}
    cases["latency", "10000 rec/s", "trio_relay"] = {"p50_ms": 0.7, "relay_core_percent": 25.0}
    one, ten = rows()
    assert one.endswith("; a bare trio relay p50 +0.100, p99 +0.300 ms")
    assert ten.endswith("; a bare trio relay p50 +0.200 ms, 25.0 % of a core")


def test_idle_rounds_at_10000_partitions_and_the_load_run(report: ModuleType) -> None:
    results = _results(
        report,
        {
            ("idle_partitions", "10000 partitions", "direct"): {"rounds_per_s": 1.8},
            ("idle_partitions", "10000 partitions", "proxy"): {"rounds_per_s": 1.72},
        },
    )
    assert _status(report, results, "idle sessionless consumer on 10,000") == "met"
    assert _status(report, results, "load run") == "not measured"
    pair = {"direct": 450.0, "proxy": 500.0, "proxy_over_direct": 1.11}
    results["load_compare"] = {
        "e2e_p50_ms": pair,
        "e2e_p99_ms": pair,
        "within_10_percent": False,
    }
    assert _status(report, results, "load run") == "missed"


def test_rerender_judges_a_finished_run_again_with_the_load_run_and_keeps_its_flame_graphs(
    bench_module: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """``bench.run --rerender``: the load run (10 minutes, run on its own after the full
    run) joins the targets of an earlier run without measuring again; the run's own
    flame graphs stay linked, the load run's is copied beside them."""
    run = bench_module("run")
    import json

    results = json.loads((REPO / "bench" / "plots" / "results.json").read_text())
    judged = bench_module("report").targets(results)
    results["targets"] = [{**t, "flamegraph": "flame-kept.svg"} for t in judged]
    (tmp_path / "results.json").write_text(json.dumps(results))
    pair = {"direct": 450.0, "proxy": 500.0, "proxy_over_direct": 1.11}
    compare = {"e2e_p50_ms": pair, "e2e_p99_ms": pair, "within_10_percent": False}
    (tmp_path / "compare.json").write_text(json.dumps(compare))
    (tmp_path / "load.svg").write_text("<svg/>")
    argv = ["--rerender", str(tmp_path / "results.json"), "--no-publish"]
    argv += ["--load-compare", str(tmp_path / "compare.json")]
    argv += ["--load-flamegraph", str(tmp_path / "load.svg")]
    assert run.main(argv) == 0

    again = json.loads((tmp_path / "results.json").read_text())
    (load,) = [t for t in again["targets"] if t["scenario"] == "load"]
    assert load["status"] == "missed" and load["flamegraph"] == "flame-load.svg"
    assert (tmp_path / "flame-load.svg").read_text() == "<svg/>"
    missed = [t for t in again["targets"] if t["status"] == "missed" and t["scenario"] != "load"]
    assert missed and all(t.get("flamegraph") == "flame-kept.svg" for t in missed)
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "p50 450.0 -> 500.0 ms (1.11x)" in text and "(./flame-load.svg)" in text


def test_shaped_rows_name_a_direct_read_at_the_proxys_response_sizes(report: ModuleType) -> None:
    cases = {
        ("shaped_partitions", "1000 partitions", "direct"): {
            "mb_per_s": 400.0,
            "broker_cpu_s_per_gb": 1.0,
        },
        ("shaped_partitions", "1000 partitions", "proxy"): {
            "mb_per_s": 48.0,
            "broker_cpu_s_per_gb": 1.7,
        },
    }

    def row() -> dict[str, Any]:
        (out,) = [t for t in report.targets(_results(report, cases)) if "1000 part" in t["target"]]
        return out

    assert "response sizes" not in row()["numbers"]  # not measured: not named
    assert row()["status"] == "missed"
    cases["shaped_partitions", "1000 partitions", "direct_capped"] = {
        "mb_per_s": 80.0,
        "broker_cpu_s_per_gb": 10.0,
    }
    assert row()["numbers"] == (
        "48.0 MB/s = 0.120x direct's 400.0; broker 1.70 CPU-s/GB against 1.00 direct (1.7x); "
        "direct asking the proxy's response sizes itself 80.0 MB/s (0.200x direct; the proxy "
        "0.60x that)"
    )
    assert row()["status"] == "missed"  # the floor is context, not a threshold
    cases["shaped_partitions", "1000 partitions", "proxy"]["mb_per_s"] = 280.0
    assert row()["status"] == "met"


def test_a_capped_direct_read_asks_what_the_proxys_caps_let_through(
    bench_module: Callable[[str], ModuleType],
) -> None:
    scenarios = bench_module("scenarios")
    fetch_scenarios = bench_module("fetch_scenarios")
    sizes = scenarios.Sizes()
    assert fetch_scenarios.capped_kcat_options(sizes) == (
        "-X", "fetch.message.max.bytes=65536",
        "-X", "fetch.max.bytes=512000",
        "-X", "message.max.bytes=512000",
    )  # fmt: skip
    with pytest.raises(ValueError, match="no --max-records"):
        fetch_scenarios.capped_kcat_options(
            scenarios.Sizes(shaping_args=("--max-partition-bytes", "65536"))
        )
