"""From the runs of a benchmark to medians, the performance targets, PNG plots and BENCHMARKS.md.

The results document (``results.json``)::

    {"meta": {...command, versions, sizes, machine...},
     "scenarios": {name: {"title": ..., "cases": {case: {arrangement: {
         "runs": [{metric: value}, ...],
         "summary": {metric: {"median": m, "min": lo, "max": hi}}}}}}},
     "targets": [{"target": ..., "status": "met" | "missed" | "not measured", ...}]}
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ARRANGEMENTS = ("direct", "haproxy", "proxy")
COLORS = {"direct": "#777777", "haproxy": "#4c72b0", "proxy": "#dd8452"}


def summarize(runs: list[dict[str, float | None]]) -> dict[str, dict[str, float] | None]:
    out: dict[str, dict[str, float] | None] = {}
    for metric in runs[0] if runs else {}:
        values = [r[metric] for r in runs if r.get(metric) is not None]
        out[metric] = (
            {
                "median": statistics.median(values),  # type: ignore[type-var]
                "min": min(values),  # type: ignore[type-var]
                "max": max(values),  # type: ignore[type-var]
            }
            if values
            else None
        )
    return out


def median(
    results: dict[str, Any], scenario: str, case: str, arr: str, metric: str
) -> float | None:
    try:
        entry = results["scenarios"][scenario]["cases"][case][arr]["summary"][metric]
    except KeyError:
        return None
    return None if entry is None else float(entry["median"])


# -- targets ----------------------------------------------------------------------------


def _status(ok: bool) -> str:
    return "met" if ok else "missed"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The performance targets, each met/missed with its numbers (or not measured)."""
    out: list[dict[str, Any]] = []

    def add(name: str, scenario: str, status: str, numbers: str, case: str | None = None) -> None:
        out.append(
            {
                "target": name,
                "scenario": scenario,
                "case": case,
                "status": status,
                "numbers": numbers,
            }
        )

    case = "1000 rec/s"
    d50, p50 = (median(results, "latency", case, a, "p50_ms") for a in ("direct", "proxy"))
    d99, p99 = (median(results, "latency", case, a, "p99_ms") for a in ("direct", "proxy"))
    name = "latency added over direct at 1,000 rec/s: <= 0.3 ms at p50, <= 1 ms at p99"
    if None in (d50, p50, d99, p99):
        add(name, "latency", "not measured", "no 1000 rec/s case in this run")
    else:
        assert d50 is not None and p50 is not None and d99 is not None and p99 is not None
        add50, add99 = p50 - d50, p99 - d99
        add(
            name,
            "latency",
            _status(add50 <= 0.3 and add99 <= 1.0),
            f"p50 {add50:+.3f} ms ({d50:.3f} -> {p50:.3f}), "
            f"p99 {add99:+.3f} ms ({d99:.3f} -> {p99:.3f})",
            case,
        )

    cases = results["scenarios"].get("fetch_cpu", {}).get("cases", {})
    name = "proxy CPU <= 0.25 ms per small fetch"
    per = {c: median(results, "fetch_cpu", c, "proxy", "relay_cpu_ms_per_fetch") for c in cases}
    if not per or None in per.values():
        add(name, "fetch_cpu", "not measured", "no fetch_cpu numbers")
    else:
        worst = max(per, key=lambda c: per[c] or 0.0)
        add(
            name,
            "fetch_cpu",
            _status(all((v or 0.0) <= 0.25 for v in per.values())),
            ", ".join(f"{c}: {v:.3f} ms" for c, v in per.items() if v is not None),
            worst,
        )

    name = "consumer throughput >= 0.9x haproxy's at <= 1.5 CPU-s per GB"
    cases = results["scenarios"].get("throughput", {}).get("cases", {})
    for c in cases:
        h = median(results, "throughput", c, "haproxy", "mb_per_s")
        p = median(results, "throughput", c, "proxy", "mb_per_s")
        cpu = median(results, "throughput", c, "proxy", "relay_cpu_s_per_gb")
        if h is None or p is None or cpu is None:
            add(f"{name} ({c})", "throughput", "not measured", "missing numbers", c)
            continue
        add(
            f"{name} ({c})",
            "throughput",
            _status(p >= 0.9 * h and cpu <= 1.5),
            f"{p:.1f} MB/s = {p / h:.2f}x haproxy's {h:.1f} MB/s, {cpu:.2f} CPU-s/GB",
            c,
        )
    if not cases:
        add(name, "throughput", "not measured", "no throughput numbers")

    name = "idle sessionless consumer on 1,000 partitions: <= 5 % of a core"
    c = "1000 partitions"
    pct = median(results, "idle_partitions", c, "proxy", "relay_core_percent")
    ms = median(results, "idle_partitions", c, "proxy", "relay_cpu_ms_per_round")
    if pct is None:
        add(name, "idle_partitions", "not measured", "no 1000-partition case in this run")
    else:
        add(
            name,
            "idle_partitions",
            _status(pct <= 5.0),
            f"{pct:.2f} % of a core, {ms if ms is not None else float('nan'):.1f} ms per round",
            c,
        )

    name = "<= 30 KB (30,000 bytes) RSS per idle connection"
    cases = results["scenarios"].get("rss", {}).get("cases", {})
    for c in cases:
        b = median(results, "rss", c, "proxy", "relay_bytes_per_conn")
        h = median(results, "rss", c, "haproxy", "relay_bytes_per_conn")
        if b is None:
            add(name, "rss", "not measured", "missing numbers", c)
            continue
        hs = f"; haproxy {h / 1000:.1f} KB" if h is not None else ""
        add(name, "rss", _status(b <= 30_000), f"{b / 1000:.1f} KB per connection{hs}", c)
    if not cases:
        add(name, "rss", "not measured", "no rss numbers")
    return out


# -- plots ------------------------------------------------------------------------------

PLOTS: dict[str, tuple[str, ...]] = {
    "throughput": ("mb_per_s", "relay_cpu_s_per_gb"),
    "latency": ("p50_ms", "p99_ms", "p999_ms"),
    "fetch_cpu": ("relay_cpu_ms_per_fetch", "broker_cpu_ms_per_fetch"),
    "idle_partitions": ("upstream_bytes_per_round", "relay_cpu_ms_per_round"),
    "shaping": ("mb_per_s", "upstream_over_delivered", "relay_cpu_s_per_gb"),
    "rss": ("relay_bytes_per_conn",),
}


def plot(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG per scenario: per metric, grouped bars per case, medians with min-max whiskers."""
    written: list[Path] = []
    for scenario, data in results["scenarios"].items():
        metrics = PLOTS.get(scenario, ())
        cases = list(data["cases"])
        if not metrics or not cases:
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8), squeeze=False)
        for ax, metric in zip(axes[0], metrics, strict=True):
            width = 0.8 / len(ARRANGEMENTS)
            for i, arr in enumerate(ARRANGEMENTS):
                xs, ys, lo, hi = [], [], [], []
                for x, case in enumerate(cases):
                    s = data["cases"][case].get(arr, {}).get("summary", {}).get(metric)
                    if s is None:
                        continue
                    xs.append(x + (i - 1) * width)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
                if xs:
                    ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=arr, color=COLORS[arr])
            ax.set_xticks(range(len(cases)), cases, fontsize=8)
            ax.set_title(metric, fontsize=9)
            if scenario == "latency" or metric == "upstream_bytes_per_round":
                ax.set_yscale("log")
            ax.grid(axis="y", alpha=0.3)
        handles = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        fig.legend(handles.values(), handles.keys(), fontsize=8, loc="upper right")
        fig.suptitle(data["title"], fontsize=10)
        fig.tight_layout()
        path = out_dir / f"{scenario}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# -- BENCHMARKS.md ------------------------------------------------------------------------


def _fmt(s: dict[str, float] | None) -> str:
    if s is None:
        return "-"

    def g(v: float) -> str:
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"

    if s["min"] == s["max"]:
        return g(s["median"])
    return f"{g(s['median'])} ({g(s['min'])}-{g(s['max'])})"


def markdown(results: dict[str, Any], plot_dir: str, plotted: set[str]) -> str:
    """BENCHMARKS.md; plots and flame graphs are referenced under ``{plot_dir}/``."""
    meta = results["meta"]
    lines = [
        "# Benchmarks: the proxy's price",
        "",
        "The tables are generated by `bench/run.py`: do not edit them, re-run the command. "
        "The discussion at the end is written by hand for the run it names.",
        "",
        f"Command: `{meta['command']}`  ",
        f"Run: {meta['started']} to {meta['finished']}, {meta['sizes']['repetitions']} "
        "alternating repetitions (direct, haproxy, proxy, direct, ...); "
        "tables give the median and, in parentheses, min-max.",
        "",
        "Three arrangements against the same single Apache Kafka broker, in the same run: "
        "clients connected **direct**ly; through **haproxy** in TCP mode (the broker "
        "advertises haproxy's port on a second listener, so nothing is rewritten); through "
        "**proxy** (`kafka-fetch-proxy run`, defaults unless the scenario says otherwise). "
        '"relay" is the haproxy or proxy process, "broker" the Kafka JVM; CPU is '
        "the process's CPU time (utime+stime, read in ns from its CPU-time clock).",
        "",
        "## Versions and machine",
        "",
        "| | |",
        "|---|---|",
    ]
    for key, value in meta["versions"].items():
        lines.append(f"| {key} | {value} |")
    for key, value in meta["machine"].items():
        lines.append(f"| {key} | {value} |")
    lines += ["", "## Targets", "", "| target | case | status | numbers |", "|---|---|---|---|"]
    for t in results["targets"]:
        graph = t.get("flamegraph")
        flame = f" ([flame graph]({plot_dir}/{graph}))" if graph else ""
        lines.append(
            f"| {t['target']} | {t['case'] or '-'} | **{t['status']}** | {t['numbers']}{flame} |"
        )
    for scenario, data in results["scenarios"].items():
        lines += ["", f"## {data['title']}", "", data["description"], ""]
        metrics: list[str] = []
        for case in data["cases"].values():
            for arr in case.values():
                for m in arr["summary"]:
                    if m not in metrics:
                        metrics.append(m)
        lines.append("| case | arrangement | " + " | ".join(metrics) + " |")
        lines.append("|---|---|" + "---|" * len(metrics))
        for case_name, case in data["cases"].items():
            for arr_name in ARRANGEMENTS:
                if arr_name not in case:
                    continue
                summary = case[arr_name]["summary"]
                cells = " | ".join(_fmt(summary.get(m)) for m in metrics)
                lines.append(f"| {case_name} | {arr_name} | {cells} |")
        if scenario in plotted:
            lines += ["", f"![{scenario}]({plot_dir}/{scenario}.png)"]
    lines += [
        "",
        "## Sizes",
        "",
        "```json",
        json.dumps(meta["sizes"], indent=2),
        "```",
        "",
    ]
    return "\n".join(lines)
