"""The long fuzz run: every target for N inputs, then a table of what was found.

    .venv/bin/python -m tests.fuzz.run                      # 1,000,000 inputs per target
    .venv/bin/python -m tests.fuzz.run --inputs 20000 --targets framing,relay --engine mutate

Each target runs in its own worker process (``--worker``), one after the other
(``--jobs`` to run several at once).  The engine is atheris (coverage-guided
libFuzzer, instrumenting the ``proxy`` package) when it is installed, else a
plain deterministic mutation loop (``tests/fuzz/mutate.py``) over the seeds of
``tests/fuzz/seeds.py``, generated from kio at start.  An input is a finding when
it ends in anything but a value or the project's ProtocolError, breaks an
invariant, runs longer than ``--timeout`` seconds, or makes the worker exceed
its memory limit (address space: 2 GiB above the worker's size at start).

Findings go to ``var/fuzz/<target>/`` (gitignored): one ``finding-<sig>.bin``
(the input) and ``.txt`` (label and traceback) per distinct signature.
Reproduce one with ``--replay <target> <file>``.  The closing lines are a table:
target, engine, inputs, findings, seconds; the exit status is 1 when anything
was found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import random
import resource
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "var" / "fuzz"
DEFAULT_INPUTS = 1_000_000
TARGET_NAMES = (
    "framing",
    "request",
    "response",
    "rewrite",
    "records",
    "relay",
    "session_broker",
    "session_client",
)
MEMORY_HEADROOM = 2 * 1024**3


def _have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


class Recorder:
    """Counts inputs and saves one input per distinct finding signature."""

    def __init__(self, target: str, out: Path, engine: str, limit: int) -> None:
        self.target = target
        self.out = out
        self.engine = engine
        self.limit = limit
        self.inputs = 0
        self.failing = 0
        self.findings: dict[str, str] = {}
        self.started = time.monotonic()
        self.slowest = 0.0

    def record(self, data: bytes, label: str, exc: BaseException | None) -> None:
        self.failing += 1
        tb = traceback.extract_tb(exc.__traceback__) if exc is not None else []
        ours = [f for f in tb if "/proxy/" in f.filename or "/tests/fuzz/" in f.filename]
        where = f"{os.path.relpath(ours[-1].filename, ROOT)}:{ours[-1].lineno}" if ours else "?"
        signature = hashlib.sha1(f"{label}|{where}".encode()).hexdigest()[:12]
        if signature in self.findings:
            return
        self.findings[signature] = f"{label} at {where}"
        (self.out / f"finding-{signature}.bin").write_bytes(data)
        text = f"target: {self.target}\nlabel: {label}\nwhere: {where}\ninput: {data!r}\n\n"
        if exc is not None:
            text += "".join(traceback.format_exception(exc))
        (self.out / f"finding-{signature}.txt").write_text(text)

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "engine": self.engine,
            "inputs": self.inputs,
            "failing_inputs": self.failing,
            "findings": self.findings,
            "seconds": round(time.monotonic() - self.started, 1),
            "slowest_input_seconds": round(self.slowest, 3),
        }

    def save(self) -> None:
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary(), indent=1))
        tmp.replace(self.out / "summary.json")


def _limit_memory() -> None:
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, resource.RLIM_INFINITY))


def worker(target: str, inputs: int, engine: str, seed: int, timeout: float, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(target, out, engine, inputs)
    if engine == "atheris":
        _atheris_worker(recorder, target, inputs, seed, timeout, out)
    else:
        _mutation_worker(recorder, target, inputs, seed, timeout)
    recorder.save()


def _mutation_worker(
    recorder: Recorder, target: str, inputs: int, seed: int, timeout: float
) -> None:
    from . import mutate, seeds, targets

    fn = targets.TARGETS[target]
    pool = list(seeds.seeds(target)) or [b""]
    rng = random.Random(seed)
    _limit_memory()
    previous = b""
    # The input being run, kept where the parent can read it if the process dies (an abort
    # in native code cannot be caught here).
    current = (recorder.out / "current-input").open(
        "r+b" if (recorder.out / "current-input").exists() else "w+b"
    )
    current.truncate(4 + mutate.MAX_SIZE)
    slot = mmap.mmap(current.fileno(), 4 + mutate.MAX_SIZE)
    for n in range(inputs):
        base = pool[rng.randrange(len(pool))]
        if n < len(pool):
            data = pool[n]  # every seed once, unmutated
        elif previous and rng.random() < 0.3:
            data = mutate.mutate(previous, rng, base)  # stack mutations
        else:
            data = mutate.mutate(base, rng, pool[rng.randrange(len(pool))])
        previous = data
        slot[4 : 4 + len(data)] = data
        slot[:4] = len(data).to_bytes(4, "big")
        started = time.monotonic()
        try:
            with targets.time_budget(timeout):
                fn(data)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            label = targets.classify(exc)
            if label is not None:
                recorder.record(data, label, exc)
                previous = b""
        recorder.slowest = max(recorder.slowest, time.monotonic() - started)
        recorder.inputs += 1
        if recorder.inputs % 1000 == 0:
            recorder.save()
    slot[:4] = b"\0\0\0\0"
    slot.close()
    current.close()


def _atheris_worker(
    recorder: Recorder, target: str, inputs: int, seed: int, timeout: float, out: Path
) -> None:
    import atheris

    with atheris.instrument_imports(include=["proxy"]):
        from . import seeds, targets

    fn = targets.TARGETS[target]
    corpus_dir = out / "corpus"
    shutil.rmtree(corpus_dir, ignore_errors=True)  # regenerated from kio on every run
    corpus_dir.mkdir()
    for i, data in enumerate(seeds.seeds(target)):
        (corpus_dir / f"seed-{i:04d}").write_bytes(data)

    def one_input(data: bytes) -> None:
        started = time.monotonic()
        try:
            fn(data)
        except Exception as exc:
            label = targets.classify(exc)
            if label is not None:
                recorder.record(data, label, exc)
        elapsed = time.monotonic() - started
        recorder.slowest = max(recorder.slowest, elapsed)
        if elapsed > timeout:
            recorder.record(data, "hang", None)
        recorder.inputs += 1
        if recorder.inputs % 5000 == 0 or recorder.inputs >= inputs:
            recorder.save()

    recorder.save()
    atheris.Setup(
        [
            sys.argv[0],
            f"-runs={inputs}",
            f"-seed={seed or 1}",
            f"-timeout={max(1, int(timeout))}",
            "-rss_limit_mb=2048",
            "-max_len=65536",
            f"-artifact_prefix={out}/",
            "-print_final_stats=1",
            str(corpus_dir),
        ],
        one_input,
    )
    atheris.Fuzz()  # libFuzzer exits the process when the runs are done


def _run_target(args: argparse.Namespace, target: str, engine: str) -> subprocess.Popen[bytes]:
    out = args.out / target
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("summary.json",):
        (out / stale).unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "tests.fuzz.run",
        "--worker",
        target,
        "--inputs",
        str(args.inputs),
        "--engine",
        engine,
        "--seed",
        str(args.seed),
        "--timeout",
        str(args.timeout),
        "--out",
        str(args.out),
    ]
    log = (out / "worker.log").open("wb")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _collect(
    args: argparse.Namespace, target: str, engine: str, code: int, secs: float
) -> dict[str, Any]:
    out = args.out / target
    try:
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {"target": target, "engine": engine, "inputs": 0, "findings": {}}
    summary["seconds"] = round(secs, 1)
    findings = dict(summary.get("findings", {}))
    if code != 0:
        # The worker died (an abort in native code, or libFuzzer stopped on a crash, timeout
        # or out-of-memory with its own artifact in out/): keep the input it was running.
        current = out / "current-input"
        if current.exists():
            raw = current.read_bytes()
            size = int.from_bytes(raw[:4], "big")
            if size:
                (out / f"crash-exit{code}.bin").write_bytes(raw[4 : 4 + size])
        artifacts = sorted(
            p.name
            for p in out.iterdir()
            if p.name.split("-")[0] in ("crash", "timeout", "oom", "leak")
        )
        findings[f"exit-{code}"] = (
            f"worker exited with status {code}; artifacts: {artifacts or 'none'}; see {out / 'worker.log'}"
        )
    summary["findings"] = findings
    return summary


MAX_RESTARTS = 20


def _finish_target(
    args: argparse.Namespace, name: str, engine: str, proc: subprocess.Popen[bytes], started: float
) -> dict[str, Any]:
    """Wait for a target's worker; when it dies (a native abort), note it and go on with the rest."""
    total: dict[str, Any] = {"target": name, "engine": engine, "inputs": 0, "findings": {}}
    wanted = args.inputs
    for restart in range(MAX_RESTARTS + 1):
        code = proc.wait()
        result = _collect(args, name, engine, code, 0.0)
        total["inputs"] += result["inputs"]
        for sig, what in result["findings"].items():
            total["findings"].setdefault(sig, what)
        crash = args.out / name / f"crash-exit{code}.bin"
        if code == 0 or total["inputs"] >= wanted or restart == MAX_RESTARTS:
            break
        if crash.exists():
            crash.rename(args.out / name / f"crash-exit{code}-{restart}.bin")
        rest = argparse.Namespace(
            **{**vars(args), "inputs": wanted - total["inputs"], "seed": args.seed + restart + 1}
        )
        proc = _run_target(rest, name, engine)
    total["seconds"] = round(time.monotonic() - started, 1)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--inputs", type=int, default=DEFAULT_INPUTS, help="inputs per target (default 1,000,000)"
    )
    parser.add_argument(
        "--targets", default=",".join(TARGET_NAMES), help="comma-separated; default all"
    )
    parser.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds one input may take")
    parser.add_argument("--jobs", type=int, default=1, help="targets run at once (default 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--replay", nargs=2, metavar=("TARGET", "FILE"), help="run one saved input")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()

    if args.replay:
        from . import targets

        name, path = args.replay
        targets.TARGETS[name](Path(path).read_bytes())
        print(f"{name}: {path} handled (a value or a ProtocolError)")
        return 0
    if args.worker:
        worker(
            args.worker, args.inputs, args.engine, args.seed, args.timeout, args.out / args.worker
        )
        return 0

    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGET_NAMES]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGET_NAMES)}")
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _have_atheris() else "mutate"
    for name in names:
        for old in (args.out / name).glob("*"):
            if old.name.startswith(("finding-", "crash-", "timeout-", "oom-")):
                old.unlink()
    print(
        f"fuzzing {len(names)} target(s), {args.inputs:,} inputs each, engine {engine}; findings in {args.out}",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    queue = list(names)
    running: list[tuple[str, subprocess.Popen[bytes], float]] = []
    while queue or running:
        while queue and len(running) < max(1, args.jobs):
            name = queue.pop(0)
            running.append((name, _run_target(args, name, engine), time.monotonic()))
        name, proc, started = running.pop(0)
        result = _finish_target(args, name, engine, proc, started)
        results.append(result)
        print(
            f"  {name}: {result['inputs']:,} inputs, {len(result['findings'])} finding(s), {result['seconds']} s",
            flush=True,
        )

    print()
    print(f"{'target':<16}{'engine':<9}{'inputs':>12}{'findings':>10}{'seconds':>10}")
    for r in results:
        print(
            f"{r['target']:<16}{r['engine']:<9}{r['inputs']:>12,}{len(r['findings']):>10}{r['seconds']:>10.1f}"
        )
    found = [(r["target"], sig, what) for r in results for sig, what in r["findings"].items()]
    if not found:
        print("no findings")
        return 0
    for target, sig, what in found:
        print(f"FINDING {target} {sig}: {what}")
    print(
        f"inputs saved in {args.out}/<target>/finding-<sig>.bin (replay: --replay <target> <file>)"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
