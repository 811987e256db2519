"""The benchmark harness works: ``python -m bench.run --smoke`` end to end, tiny sizes.

Checks only the harness (every scenario and arrangement has numbers, the plots and
BENCHMARKS.md are written, the committed BENCHMARKS.md is left alone); never a
timing: the numbers of a smoke run on a busy test machine mean nothing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARRANGEMENTS = {"direct", "haproxy", "proxy"}
SCENARIOS = {"throughput", "latency", "fetch_cpu", "idle_partitions", "shaping", "rss"}

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.slow]


def _digest(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_bench_smoke_run_measures_every_scenario_and_arrangement(tmp_path: Path) -> None:
    committed = _digest(REPO / "BENCHMARKS.md")
    plots = {p.name: p.read_bytes() for p in (REPO / "bench" / "plots").glob("*.png")}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    results = json.loads((out / "results.json").read_text())
    assert set(results["scenarios"]) == SCENARIOS
    for name, scenario in results["scenarios"].items():
        assert scenario["cases"], name
        for case, arrangements in scenario["cases"].items():
            assert set(arrangements) == ARRANGEMENTS, (name, case)
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

    for name in SCENARIOS:
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    report = (out / "BENCHMARKS.md").read_text()
    assert "## Targets" in report and "bench.run --smoke" in report
    # a smoke run publishes nothing
    assert _digest(REPO / "BENCHMARKS.md") == committed
    assert {p.name: p.read_bytes() for p in (REPO / "bench" / "plots").glob("*.png")} == plots
