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

ARRANGEMENTS = ("direct", "haproxy", "trio_relay", "direct_capped", "proxy")
"""In table order; ``trio_relay`` (``bench/trio_relay.py``, the runtime's floor) only in
the scenarios that measure it (``fetch_cpu``, ``latency``), ``direct_capped`` (the
client asking no more per fetch than the proxy's caps give) only in
``shaped_partitions``."""
COLORS = {
    "direct": "#777777",
    "haproxy": "#4c72b0",
    "trio_relay": "#55a868",
    "direct_capped": "#bbbbbb",
    "proxy": "#dd8452",
}


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

    # Issue 17's targets table, row by row, each against direct or haproxy of this run.
    sc = "latency"
    case = "1000 rec/s"
    d50, p50 = (median(results, sc, case, a, "p50_ms") for a in ("direct", "proxy"))
    d99, p99 = (median(results, sc, case, a, "p99_ms") for a in ("direct", "proxy"))
    name = "end-to-end latency added at 1,000 rec/s: <= +0.15 ms at p50, <= +0.5 ms at p99"
    if d50 is None or p50 is None or d99 is None or p99 is None:
        add(name, sc, "not measured", "no 1000 rec/s case in this run")
    else:
        add50, add99 = p50 - d50, p99 - d99
        f50, f99 = (median(results, sc, case, "trio_relay", m) for m in ("p50_ms", "p99_ms"))
        floor = (
            ""
            if f50 is None or f99 is None
            else f"; a bare trio relay p50 {f50 - d50:+.3f}, p99 {f99 - d99:+.3f} ms"
        )
        add(
            name,
            sc,
            _status(add50 <= 0.15 and add99 <= 0.5),
            f"p50 {add50:+.3f} ms ({d50:.3f} -> {p50:.3f}), "
            f"p99 {add99:+.3f} ms ({d99:.3f} -> {p99:.3f}){floor}",
            case,
        )

    case = "10000 rec/s"
    d50, p50 = (median(results, sc, case, a, "p50_ms") for a in ("direct", "proxy"))
    core = median(results, sc, case, "proxy", "relay_core_percent")
    name = "end-to-end p50 at 10,000 rec/s: <= direct + 0.3 ms, proxy <= 30 % of a core"
    if d50 is None or p50 is None or core is None:
        add(name, sc, "not measured", "no 10000 rec/s case in this run")
    else:
        f50 = median(results, sc, case, "trio_relay", "p50_ms")
        fcore = median(results, sc, case, "trio_relay", "relay_core_percent")
        floor = (
            ""
            if f50 is None or fcore is None
            else f"; a bare trio relay p50 {f50 - d50:+.3f} ms, {fcore:.1f} % of a core"
        )
        add(
            name,
            sc,
            _status(p50 - d50 <= 0.3 and core <= 30.0),
            f"p50 {p50 - d50:+.3f} ms ({d50:.3f} -> {p50:.3f}), proxy {core:.1f} % of a core"
            f"{floor}",
            case,
        )

    sc = "fetch_cpu"
    cases = [c for c in results["scenarios"].get(sc, {}).get("cases", {}) if c != "1 conn"]
    name = "CPU per small fetch (100 and 1,000 connections): <= 0.12 ms and <= 5x haproxy's"
    per = {c: median(results, sc, c, "proxy", "relay_cpu_ms_per_fetch") for c in cases}
    hap = {c: median(results, sc, c, "haproxy", "relay_cpu_ms_per_fetch") for c in cases}
    floor = {c: median(results, sc, c, "trio_relay", "relay_cpu_ms_per_fetch") for c in cases}
    if not per or None in per.values() or None in hap.values():
        add(name, sc, "not measured", "no fetch_cpu numbers for 100 or more connections")
    else:
        ok = all((per[c] or 0.0) <= 0.12 and (per[c] or 0.0) <= 5 * (hap[c] or 0.0) for c in cases)
        worst = max(per, key=lambda c: per[c] or 0.0)

        def floor_of(c: str) -> str:
            f = floor[c]
            return "" if f is None else f"; a bare trio relay's {f:.3f}"

        add(
            name,
            sc,
            _status(ok),
            ", ".join(
                f"{c}: {per[c]:.3f} ms = {(per[c] or 0.0) / (hap[c] or float('nan')):.1f}x "
                f"haproxy's {hap[c]:.3f}{floor_of(c)}"
                for c in cases
            ),
            worst,
        )

    case = "1000 conn"
    d, p = (median(results, sc, case, a, "fetches_per_s") for a in ("direct", "proxy"))
    name = "1,000 long-polling connections, default budget: fetches/s >= 0.95x direct"
    if d is None or p is None:
        add(name, sc, "not measured", "no 1000 conn case in this run")
    else:
        add(name, sc, _status(p >= 0.95 * d), f"{p:.0f} = {p / d:.2f}x direct's {d:.0f}", case)

    sc = "throughput"
    case = "uncompressed"
    h = median(results, sc, case, "haproxy", "mb_per_s")
    p = median(results, sc, case, "proxy", "mb_per_s")
    cpu = median(results, sc, case, "proxy", "relay_cpu_s_per_gb")
    name = "uncompressed throughput >= 0.95x haproxy's at <= 0.8 CPU-s per GB"
    if h is None or p is None or cpu is None:
        add(name, sc, "not measured", "no uncompressed throughput numbers", case)
    else:
        add(
            name,
            sc,
            _status(p >= 0.95 * h and cpu <= 0.8),
            f"{p:.1f} MB/s = {p / h:.2f}x haproxy's {h:.1f} MB/s, {cpu:.2f} CPU-s/GB",
            case,
        )

    sc = "idle_partitions"
    case = "1000 partitions"
    pct = median(results, sc, case, "proxy", "relay_core_percent")
    ms = median(results, sc, case, "proxy", "relay_cpu_ms_per_round")
    name = "idle sessionless consumer on 1,000 partitions: <= 2 % of a core"
    if pct is None:
        add(name, sc, "not measured", "no 1000-partition case in this run")
    else:
        per_round = f"{ms:.1f}" if ms is not None else "-"
        add(
            name,
            sc,
            _status(pct <= 2.0),
            f"{pct:.2f} % of a core, {per_round} ms per round",
            case,
        )
    case = "10000 partitions"
    d, p = (median(results, sc, case, a, "rounds_per_s") for a in ("direct", "proxy"))
    name = "idle sessionless consumer on 10,000 partitions: rounds/s >= 0.95x direct"
    if d is None or p is None:
        add(name, sc, "not measured", "no 10000-partition case in this run")
    else:
        add(name, sc, _status(p >= 0.95 * d), f"{p:.2f} = {p / d:.2f}x direct's {d:.2f}", case)

    load = results.get("load_compare")
    name = "load run (200 consumers, 20 producers): end-to-end p50 and p99 within 10 % of direct"
    if not load:
        add(name, "load", "not measured", "no bench.load --arrangement both result given")
    else:
        p50r, p99r = load["e2e_p50_ms"], load["e2e_p99_ms"]
        add(
            name,
            "load",
            _status(bool(load["within_10_percent"])),
            f"p50 {p50r['direct']} -> {p50r['proxy']} ms ({p50r['proxy_over_direct']}x), "
            f"p99 {p99r['direct']} -> {p99r['proxy']} ms ({p99r['proxy_over_direct']}x)",
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
    out += fetch_targets(results)
    return out


def fetch_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 17's targets on its scenarios (g), (h), (i), (j), against direct in the same run.

    Only the scenarios a run has are judged; the others are left out, not "not measured"
    (they are new: a run of the older six says nothing about them)."""
    out: list[dict[str, Any]] = []

    def add(name: str, scenario: str, ok: bool | None, numbers: str, case: str | None) -> None:
        status = "not measured" if ok is None else _status(ok)
        out.append(
            {
                "target": name,
                "scenario": scenario,
                "case": case,
                "status": status,
                "numbers": numbers,
            }
        )

    sc = "shaped_partitions"
    for case, want in (("1000 partitions", 0.7), ("100 partitions", 0.85)):
        if case not in results["scenarios"].get(sc, {}).get("cases", {}):
            continue
        d, p = (median(results, sc, case, a, "mb_per_s") for a in ("direct", "proxy"))
        dcpu, pcpu = (
            median(results, sc, case, a, "broker_cpu_s_per_gb") for a in ("direct", "proxy")
        )
        name = f"shaped consumption ({case}) >= {want}x direct" + (
            ", broker CPU per GB <= 2x direct's" if case == "1000 partitions" else ""
        )
        if d is None or p is None or dcpu is None or pcpu is None:
            add(name, sc, None, "missing numbers", case)
            continue
        ok = p >= want * d and (case != "1000 partitions" or pcpu <= 2 * dcpu)
        capped = median(results, sc, case, "direct_capped", "mb_per_s")
        floor = (
            ""
            if capped is None
            else f"; direct asking the proxy's response sizes itself {capped:.1f} MB/s "
            f"({capped / d:.3f}x direct; the proxy {p / capped:.2f}x that)"
        )
        add(
            name,
            sc,
            ok,
            f"{p:.1f} MB/s = {p / d:.3f}x direct's {d:.1f}; broker {pcpu:.2f} CPU-s/GB "
            f"against {dcpu:.2f} direct ({pcpu / dcpu:.1f}x){floor}",
            case,
        )

    sc = "idle_consumers"
    for case in results["scenarios"].get(sc, {}).get("cases", {}):
        d, p = (median(results, sc, case, a, "ms_per_fetch") for a in ("direct", "proxy"))
        dr, pr = (median(results, sc, case, a, "fetches_per_s") for a in ("direct", "proxy"))
        name = "idle librdkafka consumers, default budget: fetches/s >= 0.95x direct"
        if None in (d, p, dr, pr):
            add(name, sc, None, "missing numbers", case)
            continue
        assert d is not None and p is not None and dr is not None and pr is not None
        add(
            name,
            sc,
            pr >= 0.95 * dr,
            f"{pr:.0f} fetches/s = {pr / dr:.2f}x direct's {dr:.0f}; "
            f"wait added per fetch {p - d:+.1f} ms ({d:.1f} -> {p:.1f} ms)",
            case,
        )

    sc = "budget_starvation"
    cases = list(results["scenarios"].get(sc, {}).get("cases", {}))
    if len(cases) == 2:
        alone, beside = cases
        a = median(results, sc, alone, "proxy", "p99_ms")
        b = median(results, sc, beside, "proxy", "p99_ms")
        db = median(results, sc, beside, "direct", "p99_ms")
        name = "budget starvation: the normal consumer's p99 fetch latency within 5 ms of alone"
        if a is None or b is None:
            add(name, sc, None, "missing numbers", beside)
        else:
            direct = f"; direct beside them {db:.1f} ms" if db is not None else ""
            add(
                name, sc, b - a <= 5.0, f"p99 {a:.1f} ms alone, {b:.1f} ms {beside}{direct}", beside
            )

    sc = "kafka_tools"
    case = "ConsumerPerformance"
    if case in results["scenarios"].get(sc, {}).get("cases", {}):
        d, p = (median(results, sc, case, a, "mb_per_s") for a in ("direct", "proxy"))
        name = "ConsumerPerformance through the proxy >= 0.95x direct"
        if d is None or p is None:
            add(name, sc, None, "missing numbers", case)
        else:
            add(name, sc, p >= 0.95 * d, f"{p:.1f} MB/s = {p / d:.2f}x direct's {d:.1f}", case)
    return out


# -- plots ------------------------------------------------------------------------------

PLOTS: dict[str, tuple[str, ...]] = {
    "throughput": ("mb_per_s", "relay_cpu_s_per_gb"),
    "latency": ("p50_ms", "p99_ms", "p999_ms"),
    "fetch_cpu": ("relay_cpu_ms_per_fetch", "broker_cpu_ms_per_fetch"),
    "idle_partitions": ("upstream_bytes_per_round", "relay_cpu_ms_per_round"),
    "shaping": ("mb_per_s", "upstream_over_delivered", "relay_cpu_s_per_gb"),
    "rss": ("relay_bytes_per_conn",),
    "shaped_partitions": ("mb_per_s", "broker_cpu_s_per_gb", "relay_cpu_s_per_gb"),
    "idle_consumers": ("fetches_per_s", "ms_per_fetch", "relay_cpu_ms_per_fetch"),
    "budget_starvation": ("p50_ms", "p99_ms"),
    "kafka_tools": ("mb_per_s", "p50_ms", "p99_ms"),
}
LOG_SCALE = {"latency", "budget_starvation"}
LOG_SCALE_METRICS = {
    ("idle_partitions", "upstream_bytes_per_round"),
    ("shaped_partitions", "mb_per_s"),
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
                    xs.append(x + (i - (len(ARRANGEMENTS) - 1) / 2) * width)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
                if xs:
                    ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=arr, color=COLORS[arr])
            ax.set_xticks(range(len(cases)), cases, fontsize=8)
            ax.set_title(metric, fontsize=9)
            if scenario in LOG_SCALE or (scenario, metric) in LOG_SCALE_METRICS:
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
        "alternating repetitions (direct, haproxy, proxy, "
        f"{'then the reverse' if meta.get('order') else 'direct'}, ...); "
        "tables give the median and, in parentheses, min-max.",
        "",
        "Three arrangements against the same single Apache Kafka broker, in the same run: "
        "clients connected **direct**ly; through **haproxy** in TCP mode (the broker "
        "advertises haproxy's port on a second listener, so nothing is rewritten); through "
        "**proxy** (`kafka-fetch-proxy run`, defaults unless the scenario says otherwise). "
        "The CPU per small fetch and the latency scenarios also have **trio_relay** "
        "(`bench/trio_relay.py`, at a listener of the broker advertising its port): two trio "
        "tasks per connection copying bytes, the least any relay on the proxy's runtime "
        "does. Shaped consumption against partition count also has **direct_capped**: "
        "direct, with the client asking no more per fetch than the proxy's caps give, "
        'what responses of that size cost with no proxy. "relay" is the haproxy, '
        'trio_relay or proxy process, "broker" the Kafka JVM; CPU is '
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
        lines.append(
            f"| {t['target']} | {t['case'] or '-'} | **{t['status']}** | {t['numbers']}"
            f"{_flame_link(t, plot_dir)} |"
        )
    for scenario, data in results["scenarios"].items():
        lines += ["", *scenario_section(scenario, data, plot_dir, plotted)]
    lines += ["", *sizing(results)]
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


def scenario_section(
    scenario: str,
    data: dict[str, Any],
    plot_dir: str,
    plotted: set[str],
    preface: tuple[str, ...] = (),
) -> list[str]:
    """One scenario's section: title, description, *preface* lines, table, plot."""
    lines = [f"## {data['title']}", "", data["description"], "", *preface]
    if preface:
        lines.append("")
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
    return lines


# -- Sizing ------------------------------------------------------------------------------

MIB = 1 << 20


def run_label(meta: dict[str, Any]) -> str:
    rev = str(meta.get("versions", {}).get("git revision", "?"))
    dirty = " with uncommitted changes" if "uncommitted" in rev else ""
    reps = meta.get("sizes", {}).get("repetitions", "?")
    return f"{rev[:7]}{dirty}, {str(meta.get('started', '?'))[:16]}, {reps} rep."


def combine(base: dict[str, Any] | None, partial: dict[str, Any] | None) -> dict[str, Any]:
    """One results document from a published full run and later partial runs: a
    scenario of *partial* replaces the base's; each scenario keeps the label of its run
    (``"run"``)."""
    out: dict[str, Any] = {"scenarios": {}}
    for doc in (base, partial):
        if doc is None:
            continue
        for name, data in doc["scenarios"].items():
            label = data.get("run") or run_label(doc["meta"])
            out["scenarios"][name] = {**data, "run": label}
    return out


def sizing(results: dict[str, Any]) -> list[str]:
    """The Sizing section: what one proxy costs per unit of work, from a run's medians.

    CPU-s per GB is numerically millicores per MB/s (1 MB/s is 0.001 GB/s); CPU-ms per
    fetch times 1,000 is millicores per 1,000 fetches/s."""
    sc = results["scenarios"]

    def m(scenario: str, case: str, metric: str, arr: str = "proxy") -> float | None:
        return median(results, scenario, case, arr, metric)

    def src(scenario: str, case: str) -> str:
        label = sc.get(scenario, {}).get("run") or run_label(results.get("meta", {}))
        return f"{scenario} / {case} ({label})"

    def biggest(scenario: str) -> tuple[str, int] | None:
        cases = list(sc.get(scenario, {}).get("cases", {}))
        if not cases:
            return None
        counted = [(c, int(c.split()[0])) for c in cases if c.split()[0].isdigit()]
        return max(counted, key=lambda x: x[1]) if counted else None

    rows: list[tuple[str, str, str]] = []
    figures: dict[str, float] = {}

    def row(key: str, what: str, value: float | None, unit: str, fmt: str, source: str) -> None:
        if value is None:
            rows.append((what, "not measured", source))
            return
        figures[key] = value
        rows.append((what, f"{value:{fmt}} {unit}", source))

    for case, key in (("uncompressed", "cpu_mbps"), ("lz4", "cpu_mbps_lz4")):
        v = m("throughput", case, "relay_cpu_s_per_gb")
        h = m("throughput", case, "relay_cpu_s_per_gb", "haproxy")
        note = f" (haproxy {h:.2f})" if h is not None else ""
        row(key, f"CPU per MB/s consumed, {case}", v, f"millicores{note}", ".2f",
            src("throughput", case))  # fmt: skip
    for scenario in ("shaped_partitions", "shaping"):
        for case in sc.get(scenario, {}).get("cases", {}):
            v = m(scenario, case, "relay_cpu_s_per_gb")
            row(f"cpu_mbps_shaped_{case}", f"CPU per MB/s consumed with record caps, {case}",
                v, "millicores", ".1f", src(scenario, case))  # fmt: skip
        if scenario in sc:
            break
    big = biggest("fetch_cpu")
    if big is not None:
        v = m("fetch_cpu", big[0], "relay_cpu_ms_per_fetch")
        row("cpu_kfetch", "CPU per 1,000 fetches/s (small long polls)",
            None if v is None else v * 1000, "millicores", ".0f", src("fetch_cpu", big[0]))  # fmt: skip
    big = biggest("idle_consumers")
    if big is not None:
        v = m("idle_consumers", big[0], "relay_cpu_ms_per_fetch")
        row("cpu_kfetch_consumers", "CPU per 1,000 fetches/s (idle librdkafka consumers)",
            None if v is None else v * 1000, "millicores", ".0f", src("idle_consumers", big[0]))  # fmt: skip
    big = biggest("idle_partitions")
    if big is not None:
        v = m("idle_partitions", big[0], "relay_core_percent")
        row("cpu_idle_sessionless", f"CPU of one idle sessionless consumer of {big[1]:,} partitions",
            None if v is None else v * 10, "millicores", ".0f", src("idle_partitions", big[0]))  # fmt: skip
    big = biggest("rss")
    if big is not None:
        idle = m("rss", big[0], "relay_rss_mb_idle")
        row("rss_idle", "RSS of an idle proxy", None if idle is None else idle * 1e6 / MIB,
            "MiB", ".0f", src("rss", big[0]))  # fmt: skip
        v = m("rss", big[0], "relay_bytes_per_conn")
        row("mib_kconn", "memory per 1,000 connections", None if v is None else v * 1000 / MIB,
            "MiB", ".1f", src("rss", big[0]))  # fmt: skip
    big = biggest("idle_partitions")
    if big is not None:
        v = m("idle_partitions", big[0], "relay_rss_mib_delta")
        row("mib_10k_partitions", "memory per 10,000 session partitions",
            None if v is None else v * 10_000 / big[1], "MiB", ".1f", src("idle_partitions", big[0]))  # fmt: skip

    lines = [
        "## Sizing",
        "",
        "Generated from the medians of the runs named in each row (proxy process, this "
        "machine: see Versions and machine; a faster core lowers the CPU figures). CPU-s per "
        "GB is numerically millicores per MB/s; CPU-ms per fetch x 1,000 is millicores per "
        "1,000 fetches/s. Memory is VmRSS growth, noisy at small sizes.",
        "",
        "| quantity | value | from (scenario / case (run)) |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
    ]
    f = figures
    if {"cpu_mbps", "cpu_kfetch"} <= f.keys():
        cores = (50 * f["cpu_mbps"] + 0.5 * f["cpu_kfetch"]) / 1000
        lines.append(
            f"**Cores.** millicores ~ MB/s consumed x {f['cpu_mbps']:.2f} (lz4-compressed data: "
            f"x {f.get('cpu_mbps_lz4', float('nan')):.2f}) + fetches/s / 1,000 x "
            f"{f['cpu_kfetch']:.0f}. Record caps (`max_records`, `max_partition_bytes`) cost "
            "per response, not per byte: use the capped row for the consumer's partition count. "
            f"Example: 50 MB/s uncompressed and 500 fetches/s need about {cores:.2f} of a core; "
            "leave headroom, since latency grows as the proxy's core fills (End-to-end latency)."
        )
        lines.append("")
    if {"rss_idle", "mib_kconn"} <= f.keys():
        session = f.get("mib_10k_partitions")
        part = f" + session partitions / 10,000 x {session:.1f} MiB" if session is not None else ""
        lines.append(
            f"**Memory.** limit ~ {f['rss_idle']:.0f} MiB (idle) + `memory_budget_bytes` + "
            f"connections / 1,000 x {f['mib_kconn']:.1f} MiB{part} + 32 MiB of "
            "per-request state and allocator heap (README: usually about 13 MiB beyond the "
            "budget at 50 consumers, with a tail measured up to 28 MiB)."
        )
        lines.append("")
    lines.append(budget_advice(results))
    return lines


def budget_advice(results: dict[str, Any]) -> str:
    """How to size ``memory_budget_bytes``, with scenario (h)'s numbers when there are."""
    text = (
        "**Memory budget.** `memory_budget_bytes` (default 128 MiB) bounds the response data "
        "the proxy holds; a fetch's share is at most budget/16 (its partitions' max bytes plus "
        "one batch). Size it for the response data in flight at once: consumers receiving data "
        "at the same time x min(their fetch.max.bytes, budget/16), plus the reuse buffers "
        "(`reuse_buffer_bytes` per connection that trims). A fetch waiting upstream holds "
        "none of it: a response takes its size when its length prefix arrives and gives it "
        "back once written to the client (README, `memory_budget_bytes`), so idle long polls "
        "cost no budget; the idle-consumer and starvation scenarios measure that."
    )
    sc = results["scenarios"].get("idle_consumers", {}).get("cases", {})
    measured = []
    for case in sc:
        d = median(results, "idle_consumers", case, "direct", "fetches_per_s")
        p = median(results, "idle_consumers", case, "proxy", "fetches_per_s")
        dm = median(results, "idle_consumers", case, "direct", "ms_per_fetch")
        pm = median(results, "idle_consumers", case, "proxy", "ms_per_fetch")
        if None not in (d, p, dm, pm):
            assert d is not None and p is not None and dm is not None and pm is not None
            measured.append(
                f"{case}: {p:.0f} fetches/s against {d:.0f} direct, {pm - dm:+.0f} ms per fetch"
            )
    if measured:
        text += (
            " Measured under the default budget (idle consumers): "
            + "; ".join(measured)
            + ". When `kafka_fetch_proxy_memory_budget_waits_total` grows (responses waiting "
            "unread for budget), raise the budget toward the responses in flight at once."
        )
    return text


# -- merging a partial run into the published BENCHMARKS.md --------------------------------


def _section_span(text: str, title: str) -> tuple[int, int] | None:
    """Where *text*'s ``## {title}`` section is: from the newline before its heading to
    the newline before the next ``## `` heading (or the end); None when it has none."""
    head = f"## {title}\n"
    at = text.find("\n" + head)
    if at < 0:
        return None
    end = text.find("\n## ", at + len(head))
    return at, len(text) if end < 0 else end


def _replace_section(text: str, title: str, section: str, before: str) -> str:
    """*text* with its ``## {title}`` section (up to the next ``## ``) replaced by
    *section*, or *section* inserted before the line *before* when there is none."""
    span = _section_span(text, title)
    if span is not None:
        at, end = span
        return text[: at + 1] + section.rstrip("\n") + "\n" + text[end:]
    at = text.find("\n" + before)
    if at < 0:
        return text.rstrip("\n") + "\n\n" + section
    return text[: at + 1] + section.rstrip("\n") + "\n\n" + text[at + 1 :]


def merge_partial(previous: dict[str, Any] | None, results: dict[str, Any]) -> dict[str, Any]:
    """The published partial-run document (``bench/plots/results-partial.json``) with the
    scenarios (and their targets) of *results* added or replaced, each labelled with its run."""
    out = previous or {"scenarios": {}, "targets": []}
    label = run_label(results["meta"])
    for name, data in results["scenarios"].items():
        out["scenarios"][name] = {
            **data,
            "run": label,
            "command": results["meta"]["command"],
            "load": results["meta"].get("machine", {}).get("load average at start", "?"),
        }
    chosen = set(results["scenarios"])
    out["targets"] = [t for t in out["targets"] if t["scenario"] not in chosen] + [
        {**t, "run": label} for t in results["targets"] if t["scenario"] in chosen
    ]
    return out


def merge_markdown(
    text: str,
    partial: dict[str, Any],
    base: dict[str, Any] | None,
    plot_dir: str,
    plotted: set[str],
    scenarios: list[str],
) -> str:
    """The published BENCHMARKS.md with *scenarios*' sections (from *partial*) and the
    Sizing section (from *base* and *partial*) put in or replaced; the rest untouched."""
    for name in scenarios:
        data = partial["scenarios"][name]
        targets = [t for t in partial["targets"] if t["scenario"] == name]
        preface = [
            f"Not part of the run above: measured by `{data['command']}` ({data['run']}, "
            f"load average at its start {data.get('load', '?')}), median and (min-max) of its "
            "repetitions.",
        ]
        if targets:
            preface += ["", "| target | case | status | numbers |", "|---|---|---|---|"]
            preface += [
                f"| {t['target']} | {t['case'] or '-'} | **{t['status']}** | {t['numbers']}"
                f"{_flame_link(t, plot_dir)} |"
                for t in targets
            ]
        section = "\n".join(scenario_section(name, data, plot_dir, plotted, tuple(preface)))
        text = _replace_section(text, data["title"], section + "\n", "## Sizes")
        for t in targets:
            text = _replace_target_row(text, t, plot_dir)
    section = "\n".join(sizing(combine(base, partial)))
    return _replace_section(text, "Sizing", section + "\n", "## Sizes")


def _flame_link(target: dict[str, Any], plot_dir: str) -> str:
    """`` ([flame graph](...))`` for a target whose run made one (a miss), else nothing."""
    graph = target.get("flamegraph")
    return f" ([flame graph]({plot_dir}/{graph}))" if graph else ""


def _replace_target_row(text: str, target: dict[str, Any], plot_dir: str) -> str:
    """*text* with the top Targets table's row of *target* (the same target and case)
    replaced by the merged run's verdict, labelled with that run, so the table at the
    top does not keep a verdict the run below it contradicts.  The row of a target the
    table does not have is left out: the table lists the full run's targets."""
    span = _section_span(text, "Targets")
    if span is None:
        return text
    start, end = span
    prefix = f"| {target['target']} | {target['case'] or '-'} | "
    table = text[start:end].split("\n")
    for i, line in enumerate(table):
        if line.startswith(prefix):
            table[i] = (
                f"{prefix}**{target['status']}** | {target['numbers']} "
                f"(merged from {target['run']}: see its section){_flame_link(target, plot_dir)} |"
            )
    return text[:start] + "\n".join(table) + text[end:]
