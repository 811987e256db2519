"""The benchmark harness works: ``python -m bench.run --smoke`` end to end, tiny sizes.

Checks only the harness (every scenario and arrangement has numbers, the plots and
BENCHMARKS.md are written, the committed BENCHMARKS.md is left alone); never a
timing: the numbers of a smoke run on a busy test machine mean nothing.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.kafka import JVM_OPTS

REPO = Path(__file__).resolve().parents[2]
ARRANGEMENTS = {"direct", "haproxy", "proxy"}
WITH_TRIO_RELAY = {"fetch_cpu", "latency"}
"""The scenarios that also measure the bare trio relay (bench/trio_relay.py)."""
WITH_DIRECT_CAPPED = {"shaped_partitions"}
"""The scenarios that also read directly with the proxy's response sizes."""
SCENARIOS = {"throughput", "latency", "fetch_cpu", "idle_partitions", "shaping", "rss"}
FETCH_SCENARIOS = {"shaped_partitions", "idle_consumers", "budget_starvation", "kafka_tools"}
"""Issue 17's scenarios (bench/fetch_scenarios.py), in the same smoke run."""

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]

LEAN_JVMS = {
    "KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS": " ".join(JVM_OPTS),
    "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1",
}
"""The smoke run's JVMs as the suite's (tests/support/kafka.py): the broker with the
suite's options instead of the bench's full-JIT ones (bench/stack.py), Kafka's tools with
the client compiler only.  A smoke run checks the harness, never a number, and a full JIT
costs it about 40 CPU-seconds (99 -> 61 measured)."""


def _digest(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


@dataclass
class SmokeRun:
    out: Path
    results: dict[str, Any]
    committed: bytes | None
    """BENCHMARKS.md before the run"""
    plots: dict[str, bytes]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """One ``bench.run --smoke`` (one broker, every scenario) shared by the tests below."""
    committed = _digest(REPO / "BENCHMARKS.md")
    plots = {p.name: p.read_bytes() for p in (REPO / "bench" / "plots").glob("*.png")}
    out = tmp_path_factory.mktemp("bench") / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, **LEAN_JVMS},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return SmokeRun(out, json.loads((out / "results.json").read_text()), committed, plots)


def _runs(smoke: SmokeRun, scenario: str) -> dict[str, dict[str, dict[str, float | None]]]:
    """{case: {arrangement: the one run's numbers}} of a scenario."""
    cases = smoke.results["scenarios"][scenario]["cases"]
    return {c: {a: d["runs"][0] for a, d in arrs.items()} for c, arrs in cases.items()}


def test_bench_smoke_run_measures_every_scenario_and_arrangement(smoke: SmokeRun) -> None:
    committed, plots, out, results = smoke.committed, smoke.plots, smoke.out, smoke.results
    assert set(results["scenarios"]) == SCENARIOS | FETCH_SCENARIOS
    for name, scenario in results["scenarios"].items():
        assert scenario["cases"], name
        for case, arrangements in scenario["cases"].items():
            expected = (
                ARRANGEMENTS
                | ({"trio_relay"} if name in WITH_TRIO_RELAY else set())
                | ({"direct_capped"} if name in WITH_DIRECT_CAPPED else set())
            )
            assert set(arrangements) == expected, (name, case)
            for arr, data in arrangements.items():
                (run,) = data["runs"]  # --smoke: one repetition
                numbers = [v for v in run.values() if v is not None]
                assert numbers, (name, case, arr)
                assert all(isinstance(v, int | float) and math.isfinite(v) for v in numbers)
            # the proxy's own process is measured in every scenario
            assert any(
                k.startswith("relay") and v is not None
                for k, v in arrangements["proxy"]["runs"][0].items()
            ), (name, case)
    assert {t["status"] for t in results["targets"]} <= {"met", "missed", "not measured"}
    assert all(v for v in results["meta"]["versions"].values())

    for name in SCENARIOS | FETCH_SCENARIOS:
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    report = (out / "BENCHMARKS.md").read_text()
    assert "## Targets" in report and "bench.run --smoke" in report
    assert "## Sizing" in report and "| memory per 1,000 connections |" in report
    # a smoke run publishes nothing
    assert _digest(REPO / "BENCHMARKS.md") == committed
    assert {p.name: p.read_bytes() for p in (REPO / "bench" / "plots").glob("*.png")} == plots


def test_shaped_partitions_smoke(smoke: SmokeRun) -> None:
    """(g): every arrangement read the whole topic; the shaping proxy says what it fetched."""
    for case, arrs in _runs(smoke, "shaped_partitions").items():
        for arr, run in arrs.items():
            assert run["mb_per_s"] and run["mb_per_s"] > 0, (case, arr)
            assert run["broker_cpu_s_per_gb"] is not None, (case, arr)
        # the proxy's own counters: it delivered what it fetched, give or take trimming
        assert arrs["proxy"]["upstream_over_delivered"] is not None
        assert arrs["proxy"]["upstream_over_delivered"] >= 1.0
        assert arrs["direct"]["relay_cpu_s_per_gb"] is None
        assert arrs["direct_capped"]["relay_cpu_s_per_gb"] is None
    names = {t["target"] for t in smoke.results["targets"] if t["scenario"] == "shaped_partitions"}
    assert not names  # the smoke size has neither 100 nor 1,000 partitions: nothing judged


def test_idle_consumers_smoke(smoke: SmokeRun) -> None:
    """(h): librdkafka's fetch counts came in for every consumer, in every arrangement."""
    (case,) = _runs(smoke, "idle_consumers")
    assert case == "3 consumers"
    for arr, run in _runs(smoke, "idle_consumers")[case].items():
        assert run["fetches_per_s"] and run["fetches_per_s"] > 0, arr
        assert run["ms_per_fetch"] and run["max_ms_per_fetch"] >= run["ms_per_fetch"] > 0, arr
        assert (run["budget_waits_per_s"] is None) == (arr != "proxy"), arr
    (target,) = [t for t in smoke.results["targets"] if t["scenario"] == "idle_consumers"]
    assert target["status"] in ("met", "missed") and "wait added per fetch" in target["numbers"]


def test_budget_starvation_smoke(smoke: SmokeRun) -> None:
    """(i): the normal consumer alone and beside the long polls, with its latency quantiles."""
    runs = _runs(smoke, "budget_starvation")
    assert list(runs) == ["alone", "beside 3 long polls"]
    for case, arrs in runs.items():
        for arr, run in arrs.items():
            assert run["fetches_per_s"] is not None, (case, arr)
            assert run["max_ms"] >= run["p99_ms"] >= run["p50_ms"] > 0, (case, arr)
            assert (run["hog_fetches_per_s"] is None) == (case == "alone"), (case, arr)
    (target,) = [t for t in smoke.results["targets"] if t["scenario"] == "budget_starvation"]
    assert target["status"] in ("met", "missed") and target["case"] == "beside 3 long polls"


def test_kafka_tools_smoke(smoke: SmokeRun) -> None:
    """(j): Kafka's ConsumerPerformance read every preloaded record and EndToEndLatency
    printed its percentiles, direct, through haproxy and through the proxy."""
    runs = _runs(smoke, "kafka_tools")
    records = smoke.results["meta"]["sizes"]["tools_mb"] * 1_000_000 // 1024
    for arr, run in runs["ConsumerPerformance"].items():
        assert run["records"] == records, arr
        assert run["mb_per_s"] and run["mb_per_s"] > 0, arr
    for arr, run in runs["EndToEndLatency"].items():
        assert run["p999_ms"] >= run["p99_ms"] >= run["p50_ms"] >= 0, arr
        assert run["avg_ms"] > 0, arr
    (target,) = [t for t in smoke.results["targets"] if t["scenario"] == "kafka_tools"]
    assert target["status"] in ("met", "missed")


def _bench(module: str) -> Any:
    """``bench.<module>`` (bench/ is not installed: it is imported from the checkout)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"bench.{module}")


def _doc(scenario: str, title: str, value: float) -> dict[str, Any]:
    """A results document of one scenario, one case, the proxy arrangement."""
    summary = {"relay_cpu_s_per_gb": {"median": value, "min": value, "max": value}}
    return {
        "meta": {
            "command": f"bench.run --scenarios {scenario}",
            "started": "2026-11-25T18:00:00",
            "sizes": {"repetitions": 1},
            "versions": {"git revision": "abcdef0123"},
        },
        "scenarios": {
            scenario: {
                "title": title,
                "description": "d",
                "cases": {"uncompressed": {"proxy": {"runs": [], "summary": summary}}},
            }
        },
        "targets": [],
    }


def test_merge_replaces_only_the_partial_runs_sections_and_writes_sizing() -> None:
    """``--merge``: a partial run's section replaces the one of the same title, the others
    and the hand-written discussion stay, and Sizing takes each figure from the newest run."""
    report = _bench("report")
    published = (
        "# Benchmarks\n\n## Consumer throughput\n\nold table\n\n## Other\n\nkept\n\n"
        "## Sizes\n\nsizes\n\n<!-- discussion -->\n## Discussion\n\nby hand\n"
    )
    base = _doc("throughput", "Consumer throughput", 1.72)
    partial = report.merge_partial(None, _doc("throughput", "Consumer throughput", 0.8))
    text = report.merge_markdown(published, partial, base, "bench/plots", set(), ["throughput"])
    assert "old table" not in text and "kept" in text and "by hand" in text
    assert text.count("## Consumer throughput") == 1
    assert "Not part of the run above" in text and "abcdef0" in text
    sizing = text[text.index("## Sizing") : text.index("## Sizes")]
    assert "| CPU per MB/s consumed, uncompressed | 0.80 millicores" in sizing
    # merging again replaces, never duplicates
    again = report.merge_markdown(text, partial, base, "bench/plots", set(), ["throughput"])
    assert again == text


def test_a_merged_miss_links_its_flame_graph_in_both_tables() -> None:
    """A partial run's missed target keeps its flame graph: linked from its row in the
    scenario's section and from the row it replaces in the Targets table at the top."""
    report = _bench("report")
    row = "| T | uncompressed | "
    published = (
        "# Benchmarks\n\n## Targets\n\n| target | case | status | numbers |\n|---|---|---|---|\n"
        f"{row}**missed** | old |\n\n## Consumer throughput\n\nold table\n\n"
        "## Sizes\n\nsizes\n"
    )
    doc = _doc("throughput", "Consumer throughput", 0.8)
    target = {"scenario": "throughput", "target": "T", "case": "uncompressed", "numbers": "new"}
    doc["targets"] = [{**target, "status": "missed", "flamegraph": "flame-t.svg"}]
    partial = report.merge_partial(None, doc)
    text = report.merge_markdown(published, partial, None, "bench/plots", set(), ["throughput"])
    link = "([flame graph](bench/plots/flame-t.svg))"
    rows = [line for line in text.split("\n") if line.startswith(row)]
    assert len(rows) == 2 and all(line.endswith(f"{link} |") for line in rows)
    assert "old |" not in text
    # a target met (no flame graph) gets no link
    doc["targets"] = [{**target, "status": "met"}]
    text = report.merge_markdown(
        published, report.merge_partial(None, doc), None, "bench/plots", set(), ["throughput"]
    )
    assert "flame graph" not in text


def test_load_compare_reads_proxy_over_direct() -> None:
    """``bench.load --arrangement both``: latency through the proxy over direct's, and the
    10 % criterion on p50 and p99."""
    compare = _bench("load").compare

    def summary(p50: float, p99: float) -> dict[str, Any]:
        steady = {"e2e_p50_ms": p50, "e2e_p99_ms": p99, "consumed_rps": 100.0}
        return {
            "steady": {**steady, "produced_rps": 100.0},
            "by_library": {"java": steady},
        }

    got = compare({"direct": summary(100.0, 200.0), "proxy": summary(105.0, 230.0)})
    assert got["e2e_p50_ms"] == {"direct": 100.0, "proxy": 105.0, "proxy_over_direct": 1.05}
    assert got["e2e_p99_ms"]["proxy_over_direct"] == 1.15
    assert got["by_library"]["java"]["e2e_p99_ms"]["proxy_over_direct"] == 1.15
    assert got["within_10_percent"] is False
