"""The proxy's price, measured side by side with direct connections and haproxy.

    .venv/bin/python -m bench.run                       # everything, 3 repetitions (~1 h)
    .venv/bin/python -m bench.run --scenarios latency --repetitions 5
    .venv/bin/python -m bench.run --smoke --out /tmp/b  # tiny sizes, 1 repetition (the test)

One real Apache Kafka broker (``scripts/setup --test`` resolves it), haproxy in TCP
mode (Debian's package, installed with apt-get when missing) and ``kafka-fetch-proxy
run`` as a process, all on 127.0.0.1.  Each case of each scenario is measured in
turn, ``--repetitions`` times, the order reversed every other repetition (direct,
haproxy, proxy, then proxy, haproxy, direct, ...: ``in_turn``), so that what drifts over
a case (the machine, the broker's heap) does not always fall on the same arrangement.

Output: ``bench/results/<timestamp>/`` (``--out`` elsewhere) gets ``results.json``,
one PNG per scenario, ``BENCHMARKS.md``, the processes' logs and, for each missed
target, a py-spy flame graph of the proxy (``--no-flamegraphs``: none).  A complete
non-smoke run also publishes: ``BENCHMARKS.md`` at the repository root (keeping the
hand-written discussion after ``DISCUSSION_MARK``, which names the run it was written
for), and its plots, flame graphs and ``results.json`` in ``bench/plots/``
(``--no-publish``: it does not).  ``--smoke`` never publishes.  A partial run with
``--merge`` publishes only its scenarios' sections (plots, flame graphs) and the Sizing
section into BENCHMARKS.md, each labelled with its run; ``bench/plots/results-partial.json``
keeps them until the next full run.

    .venv/bin/python -m bench.run --scenarios shaped_partitions,kafka_tools --merge

Not a test: it asserts nothing about speed.  Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from .stack import REPO, Stack, use_bench_jvm_opts

T = TypeVar("T")

RESULTS = REPO / "bench" / "results"
PLOTS = REPO / "bench" / "plots"
DISCUSSION_MARK = "<!-- discussion: written by hand; a published run keeps it -->"
"""BENCHMARKS.md's hand-written discussion of the targets starts at this line."""
REQUIREMENTS = REPO / "bench" / "requirements.txt"
PARTIAL = PLOTS / "results-partial.json"
"""Scenarios of partial runs published with ``--merge`` since the last full run."""


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repetition, no publishing")
    p.add_argument("--scenarios", help="comma-separated subset (default: all)")
    p.add_argument("--repetitions", type=int, help="alternating repetitions (default 3)")
    p.add_argument("--out", type=Path, help="output directory (default bench/results/<time>)")
    p.add_argument("--throughput-mb", type=int, help="MB preloaded per throughput topic")
    p.add_argument("--shaping-mb", type=int, help="MB preloaded per shaping topic")
    p.add_argument("--seconds", type=float, help="measured window of latency/fetch/idle runs")
    p.add_argument("--latency-rates", type=_ints, help="records/s, e.g. 1000,10000")
    p.add_argument("--fetch-connections", type=_ints, help="e.g. 1,100,1000")
    p.add_argument("--idle-partitions", type=_ints, help="e.g. 100,1000,10000")
    p.add_argument("--shaping-partitions", type=_ints, help="e.g. 100,1000")
    p.add_argument("--rss-connections", type=int, help="idle connections for the RSS scenario")
    p.add_argument("--shaped-partitions", type=_ints, help="e.g. 100,1000,10000")
    p.add_argument("--shaped-mb", type=int, help="MB preloaded per shaped_partitions topic")
    p.add_argument("--idle-consumers", type=_ints, help="e.g. 100,200")
    p.add_argument("--tools-mb", type=int, help="MB preloaded for ConsumerPerformance")
    p.add_argument("--tools-latency-records", type=int, help="EndToEndLatency's records")
    p.add_argument(
        "--load-compare",
        type=Path,
        help="compare.json of a `bench.load --arrangement both` run, judged as the load-run "
        "target (the load run takes 10 minutes and is run on its own)",
    )
    p.add_argument(
        "--rerender",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: judge the targets of an earlier run's results.json again (with "
        "--load-compare and --load-flamegraph, for the load run made after it) and write its "
        "BENCHMARKS.md beside it; a complete non-smoke run is also published",
    )
    p.add_argument(
        "--load-flamegraph",
        type=Path,
        help="with --rerender: a py-spy flame graph (SVG) of the proxy under the load run, "
        "linked from the load target when it is missed",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="a partial non-smoke run puts its scenarios' sections and the Sizing section "
        "into the published BENCHMARKS.md (labelled with this run), leaving the rest",
    )
    p.add_argument(
        "--flamegraphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="py-spy flame graph of the proxy for each missed target (default: on, off in smoke)",
    )
    p.add_argument(
        "--publish",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a complete non-smoke run writes BENCHMARKS.md and bench/plots/ (default: on)",
    )
    return p


def sizes_from(args: argparse.Namespace) -> Any:
    from .scenarios import SMOKE, Sizes

    sizes = dataclasses.replace(SMOKE) if args.smoke else Sizes()
    overrides = {
        "repetitions": args.repetitions,
        "throughput_mb": args.throughput_mb,
        "shaping_mb": args.shaping_mb,
        "latency_rates": args.latency_rates,
        "fetch_connections": args.fetch_connections,
        "idle_partitions": args.idle_partitions,
        "shaping_partitions": args.shaping_partitions,
        "rss_connections": args.rss_connections,
        "shaped_partitions": args.shaped_partitions,
        "shaped_mb": args.shaped_mb,
        "idle_consumers": args.idle_consumers,
        "tools_mb": args.tools_mb,
        "tools_latency_records": args.tools_latency_records,
    }
    if args.seconds is not None:
        overrides |= {
            "latency_seconds": args.seconds,
            "fetch_seconds": args.seconds,
            "idle_seconds": args.seconds,
            "starvation_seconds": args.seconds,
        }
    return dataclasses.replace(sizes, **{k: v for k, v in overrides.items() if v is not None})


# -- versions ---------------------------------------------------------------------------


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except OSError:
        return "unavailable"
    return (proc.stdout or proc.stderr).strip()


def versions(stack: Stack) -> dict[str, str]:
    import confluent_kafka

    assert stack.cluster is not None
    rev = _run(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    dirty = _run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    exported = REPO / ".revision"  # a `git archive` export: no .git, its commit written here
    if exported.exists() and not (REPO / ".git").exists():
        rev, dirty = exported.read_text().strip() + " (git archive export)", ""
    kcat = re.search(r"Version (\S+).*?librdkafka (\S+)", _run(["kcat", "-V"]), re.S)
    return {
        "git revision": rev + (" (with uncommitted changes)" if dirty else ""),
        "Apache Kafka": stack.cluster.version,
        "broker JVM options": os.environ.get("KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS", ""),
        "kio": importlib.metadata.version("kio"),
        "Python": platform.python_version(),
        "trio": importlib.metadata.version("trio"),
        "librdkafka (confluent-kafka)": (
            f"{confluent_kafka.libversion()[0]} "
            f"(confluent-kafka {importlib.metadata.version('confluent-kafka')})"
        ),
        "kcat": f"{kcat[1]} (librdkafka {kcat[2]})" if kcat else "unknown",
        "haproxy": _run(["haproxy", "-v"]).splitlines()[0],
    }


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "CPU": f"{os.cpu_count()} x {model}",
        "kernel": platform.release(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# -- flame graphs -----------------------------------------------------------------------


def py_spy() -> str:
    """py-spy from PyPI (bench/requirements.txt), installed into the venv on demand."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        print("bench: installing py-spy (pip, bench/requirements.txt)", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True
        )
    return str(exe)


def flamegraph(
    stack: Stack, scenario: Any, case: str, sizes: Any, out: Path, log: Path
) -> Path | None:
    """Re-run *case* through the proxy under ``py-spy record``; the SVG, or None."""
    arr = scenario.arrangements(stack)[-1]
    with log.open("ab") as err:
        spy = subprocess.Popen(
            [
                py_spy(),
                "record",
                "--pid",
                str(arr.relay_pid),
                "--output",
                str(out),
                "--rate",
                "250",
            ],
            stdout=err,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        time.sleep(1.0)
        scenario.measure(stack, arr, case, sizes)
    finally:
        if spy.poll() is None:
            spy.send_signal(signal.SIGINT)  # py-spy writes the SVG on SIGINT
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(10)
    return out if out.exists() else None


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    use_bench_jvm_opts()
    from . import report
    from .fetch_scenarios import SCENARIOS as FETCH_SCENARIOS
    from .scenarios import SCENARIOS as BASE_SCENARIOS

    SCENARIOS = {**BASE_SCENARIOS, **FETCH_SCENARIOS}
    sizes = sizes_from(args)
    chosen = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios {sorted(unknown)}; known: {list(SCENARIOS)}", file=sys.stderr)
        return 2
    if args.rerender is not None:
        return rerender(args, list(SCENARIOS))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / (stamp + ("-smoke" if args.smoke else ""))
    out.mkdir(parents=True, exist_ok=True)
    flamegraphs = args.flamegraphs if args.flamegraphs is not None else not args.smoke
    publish = args.publish and not args.smoke and chosen == list(SCENARIOS)
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *(argv or sys.argv[1:])])

    results: dict[str, Any] = {
        "meta": {
            "command": command,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "finished": None,
            "smoke": args.smoke,
            "sizes": dataclasses.asdict(sizes),
            "order": "reversed every other repetition",  # (``in_turn``; before: always as given)
            "machine": machine(),
            "versions": {},
        },
        "scenarios": {},
        "targets": [],
    }
    if args.load_compare is not None:
        results["load_compare"] = json.loads(args.load_compare.read_text())
    json_path = out / "results.json"

    def save() -> None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")

    work = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        with Stack(work) as stack:
            results["meta"]["versions"] = versions(stack)
            scenarios = {name: SCENARIOS[name]() for name in chosen}
            graphs: dict[tuple[str, str | None], str] = {}
            # One scenario at a time, from its topics to its flame graphs, then its topics
            # go: the broker keeps a file open per partition, and all scenarios' partitions
            # at once (20,000+) pass the open-file limit.
            for name, sc in scenarios.items():
                _log(f"{name}: preparing")
                sc.prepare(stack, sizes)
                entry: dict[str, Any] = {
                    "title": sc.title,
                    "description": sc.description,
                    "cases": {},
                }
                results["scenarios"][name] = entry
                for case in sc.cases(sizes):
                    runs: dict[str, list[dict[str, float | None]]] = {}
                    if case == sc.cases(sizes)[0]:
                        for arr in sc.arrangements(stack):
                            sc.warm_up(stack, arr, sizes)
                    for rep in range(sizes.repetitions):
                        for arr in in_turn(sc.arrangements(stack), rep):
                            numbers = sc.measure(stack, arr, case, sizes)
                            runs.setdefault(arr.name, []).append(numbers)
                            _log(f"{name} / {case} / {arr.name} #{rep + 1}: {_short(numbers)}")
                    entry["cases"][case] = {
                        a: {"runs": r, "summary": report.summarize(r)} for a, r in runs.items()
                    }
                    save()
                for t in report.targets(results) if flamegraphs else []:
                    if t["status"] == "missed" and t["scenario"] == name and t["case"]:
                        svg = out / f"flame-{t['scenario']}-{_slug(t['case'])}.svg"
                        _log(f"flame graph for the missed target {t['target']!r}")
                        got = flamegraph(stack, sc, t["case"], sizes, svg, out / "py-spy.log")
                        if got is not None:
                            graphs[(t["target"], t["case"])] = got.name
                stack.drop_topics()
            results["targets"] = report.targets(results)
            for t in results["targets"]:
                graph = graphs.get((t["target"], t["case"]))
                if graph is not None and t["status"] == "missed":
                    t["flamegraph"] = graph
            results["meta"]["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
            save()
    finally:
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        for log in [*work.glob("*.log"), *work.glob("kafka/node-*/server.log")]:
            shutil.copy(log, logs / log.name)
        shutil.rmtree(work, ignore_errors=True)

    plotted = {p.stem for p in report.plot(results, out)}
    (out / "BENCHMARKS.md").write_text(report.markdown(results, ".", plotted))
    if args.merge and not args.smoke and not publish:
        merge_published(results, out, plotted)
    if publish:
        publish_run(results, out, json_path, plotted)
    for t in results["targets"]:
        _log(f"target {t['status']}: {t['target']} [{t['case'] or '-'}] {t['numbers']}")
    _log(f"results in {out}" + (" (published BENCHMARKS.md, bench/plots/)" if publish else ""))
    return 0


def publish_run(results: dict[str, Any], out: Path, json_path: Path, plotted: set[str]) -> None:
    """A complete run's BENCHMARKS.md at the repository root (keeping the hand-written
    discussion), its plots, flame graphs and ``results.json`` in ``bench/plots/``."""
    from . import report

    PARTIAL.unlink(missing_ok=True)  # every scenario is in the full run now
    PLOTS.mkdir(exist_ok=True)
    for name in plotted:
        shutil.copy(out / f"{name}.png", PLOTS / f"{name}.png")
    for t in results["targets"]:  # the flame graph of each missed target, beside its plot
        if t.get("flamegraph"):
            shutil.copy(out / t["flamegraph"], PLOTS / t["flamegraph"])
    shutil.copy(json_path, PLOTS / "results.json")
    published = REPO / "BENCHMARKS.md"
    discussion = kept_discussion(published)
    published.write_text(
        report.markdown(results, PLOTS.relative_to(REPO).as_posix(), plotted)
        + ("\n" + discussion if discussion else "")
    )


def rerender(args: argparse.Namespace, every_scenario: list[str]) -> int:
    """``--rerender``: the targets of an earlier run judged again, with the load run's
    comparison (``--load-compare``) and its flame graph (``--load-flamegraph``) when given;
    flame graphs of the run's own misses are kept.  Writes BENCHMARKS.md beside the
    results; a complete non-smoke run (every scenario) is published as a run would be."""
    from . import report

    json_path: Path = args.rerender
    out = json_path.parent
    results = json.loads(json_path.read_text())
    if args.load_compare is not None:
        results["load_compare"] = json.loads(args.load_compare.read_text())
    graphs = {
        (t["target"], t["case"]): t["flamegraph"] for t in results["targets"] if t.get("flamegraph")
    }
    results["targets"] = report.targets(results)
    for t in results["targets"]:
        graph = graphs.get((t["target"], t["case"]))
        if graph is None and t["case"]:  # a run stopped before its targets were saved
            name = f"flame-{t['scenario']}-{_slug(t['case'])}.svg"
            graph = name if (out / name).exists() else None
        if graph is not None and t["status"] == "missed":
            t["flamegraph"] = graph
        if t["scenario"] == "load" and t["status"] == "missed" and args.load_flamegraph:
            shutil.copy(args.load_flamegraph, out / "flame-load.svg")
            t["flamegraph"] = "flame-load.svg"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    plotted = {p.stem for p in report.plot(results, out)}
    (out / "BENCHMARKS.md").write_text(report.markdown(results, ".", plotted))
    complete = list(results["scenarios"]) == every_scenario and not results["meta"]["smoke"]
    if args.publish and complete:
        publish_run(results, out, json_path, plotted)
    for t in results["targets"]:
        _log(f"target {t['status']}: {t['target']} [{t['case'] or '-'}] {t['numbers']}")
    _log(
        f"rerendered {json_path}"
        + (" (published BENCHMARKS.md, bench/plots/)" if complete and args.publish else "")
    )
    return 0


def in_turn(arrangements: Sequence[T], rep: int) -> list[T]:
    """The arrangements (or revisions: ``bench.compare``) in the order repetition *rep*
    (from 0) measures them: as given, reversed every other repetition.  Over a case a broker can slow down (its heap fills
    with the delayed fetches of 10,000 partitions: its CPU a round was 100-200 ms in six
    measurements of the idle_partitions scenario and 958 ms in the seventh, 2026-11-28),
    and in the same order every time the last arrangement would always get the slowest
    broker."""
    return list(arrangements) if rep % 2 == 0 else list(reversed(arrangements))


def merge_published(results: dict[str, Any], out: Path, plotted: set[str]) -> None:
    """``--merge``: this partial run's scenario sections, their plots and flame graphs,
    and the Sizing section (from the published full run's ``results.json`` and the
    partial runs so far, ``results-partial.json``) into the published BENCHMARKS.md."""
    from . import report

    PLOTS.mkdir(exist_ok=True)
    for name in plotted:
        shutil.copy(out / f"{name}.png", PLOTS / f"{name}.png")
    for t in results["targets"]:
        if t.get("flamegraph"):
            shutil.copy(out / t["flamegraph"], PLOTS / t["flamegraph"])
    previous = json.loads(PARTIAL.read_text()) if PARTIAL.exists() else None
    partial = report.merge_partial(previous, results)
    PARTIAL.write_text(json.dumps(partial, indent=2) + "\n")
    base_path = PLOTS / "results.json"
    base = json.loads(base_path.read_text()) if base_path.exists() else None
    published = REPO / "BENCHMARKS.md"
    on_disk = {p.stem for p in PLOTS.glob("*.png")}
    published.write_text(
        report.merge_markdown(
            published.read_text() if published.exists() else "",
            partial,
            base,
            PLOTS.relative_to(REPO).as_posix(),
            on_disk,
            list(results["scenarios"]),
        )
    )


def kept_discussion(path: Path) -> str:
    """The hand-written discussion at the end of *path* (from DISCUSSION_MARK on), or ''."""
    if not path.exists():
        return ""
    text = path.read_text()
    at = text.find(DISCUSSION_MARK)
    return "" if at < 0 else text[at:]


def _short(numbers: dict[str, float | None]) -> str:
    return ", ".join(f"{k}={v:.4g}" if v is not None else f"{k}=-" for k, v in numbers.items())


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


_BEGAN = time.monotonic()


def _log(message: str) -> None:
    print(f"bench: [{time.monotonic() - _BEGAN:6.1f} s] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
