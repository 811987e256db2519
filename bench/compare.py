"""Revisions of the proxy side by side on one stack: one scenario's cases, alternating.

    .venv/bin/python -m bench.compare --rev 3548cac --rev WORKTREE --scenario fetch_cpu
    .venv/bin/python -m bench.compare --rev HEAD~3 --rev HEAD --scenario shaped_partitions \\
        --case "1000 partitions" --reps 5 --shaped-partitions 1000 --shaped-mb 32
    .venv/bin/python -m bench.compare --rev HEAD --rev HEAD --args= \\
        --args="--reuse-buffer-bytes 16777216" --scenario shaped_partitions

``bench.run`` sets the proxy beside direct connections and haproxy in one run; this sets
revisions of the proxy beside each other, which is how to judge a change on a machine
whose speed moves by up to 1.5x within an hour (BENCHMARKS.md): the two figures of one
revision taken an hour apart can differ more than two revisions taken a minute apart.

One Kafka broker (``bench.stack``), the scenario prepared once (its topics), then one
proxy process per revision, each running that revision's ``proxy`` package from a
checkout with the arguments the scenario gives its proxy (``Scenario.proxy_args``).
Each case is measured ``--reps`` times per revision in alternating order (A B, B A, ...).
Printed per case and number: each revision's median and range, the median over the
first revision's, and in how many repetitions each revision's figure was the lowest.
Whether lower is better depends on the number (CPU: yes; MB/s: no).

``--args`` (once per ``--rev``, written ``--args="..."``) adds proxy arguments to one
revision's proxy: one revision under two settings.

``WORKTREE`` is the working tree as it is, uncommitted changes included.  Any other
revision is checked out with ``git worktree add --detach`` in a temporary directory and
removed at the end.  Every revision runs on this environment's packages: compare
revisions whose dependencies are the same.  Scenarios that start a proxy of their own in
each repetition (``rss``, ``idle_partitions``) cannot be compared this way.  Every other
option is ``bench.run``'s sizes (``--smoke``, ``--shaped-mb``, ``--fetch-connections``...).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .run import in_turn
from .stack import REPO, Arrangement, Stack, start_proxy, use_bench_jvm_opts

WORKTREE = "WORKTREE"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description="Revisions of the proxy side by side on one stack (see the module docstring).",
    )
    p.add_argument(
        "--rev",
        dest="revs",
        action="append",
        required=True,
        help=f"a git revision, or {WORKTREE} for the working tree; twice or more",
    )
    p.add_argument("--scenario", required=True, help="one of bench.run's scenarios")
    p.add_argument(
        "--case", dest="cases", action="append", help="only this case (repeatable; default all)"
    )
    p.add_argument("--reps", type=int, default=5, help="repetitions per revision (default 5)")
    p.add_argument(
        "--args",
        dest="extra",
        action="append",
        help="proxy arguments for the revision of the same rank, after the scenario's "
        '(once per --rev when given; "" for none): one revision under two settings',
    )
    return p


def labels(revs: Sequence[str], extra: Sequence[str] | None) -> list[str]:
    """What the table calls each revision: the revision, and its --args when it has some."""
    if not extra:
        return list(revs)
    return [f"{rev} {args}".strip() for rev, args in zip(revs, extra, strict=True)]


@contextlib.contextmanager
def checkouts(revs: Sequence[str], into: Path) -> Iterator[list[Path]]:
    """A directory per revision: the repository for ``WORKTREE``, else a detached worktree
    under *into*, removed (and pruned) when the block ends."""
    made: list[Path] = []
    trees: list[Path] = []
    try:
        for i, rev in enumerate(revs):
            if rev == WORKTREE:
                trees.append(REPO)
                continue
            path = into / f"rev{i}"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev],
                check=True,
                stdin=subprocess.DEVNULL,
            )
            made.append(path)
            trees.append(path)
        for tree in trees:
            _check_runs_from(tree)
        yield trees
    finally:
        for path in made:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                check=False,
                stdin=subprocess.DEVNULL,
            )
        if made:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "prune"], check=False, stdin=subprocess.DEVNULL
            )


def _check_runs_from(tree: Path) -> None:
    """Refuse a checkout whose ``proxy`` would not be the one imported (``start_proxy``'s
    launch: ``-m`` from the checkout, the checkout first on the path)."""
    found = subprocess.run(
        [sys.executable, "-c", "import proxy; print(proxy.__file__)"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout.strip()
    if Path(found).resolve().parent != (tree / "proxy").resolve():
        raise RuntimeError(f"{tree}: its proxy would not run (python imports {found})")


def alternating(reps: int, n: int) -> Iterator[tuple[int, int]]:
    """(repetition, revision index) in the order measured: forward, then backward, ..."""
    for rep in range(reps):
        for i in in_turn(range(n), rep):
            yield rep, i


def table(revs: Sequence[str], runs: Sequence[Sequence[dict[str, Any]]]) -> str:
    """One row per number the scenario measured: each revision's median (min-max), the
    median over the first revision's, and how often each revision's figure was the lowest."""
    keys: list[str] = []
    for numbers in (n for rev_runs in runs for n in rev_runs):
        keys += [k for k, v in numbers.items() if isinstance(v, int | float) and k not in keys]
    head = ["number", *revs, *(f"{r} / {revs[0]}" for r in revs[1:]), "lowest (times)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        series = [[n.get(key) for n in rev_runs] for rev_runs in runs]
        if any(v is None for s in series for v in s):
            continue
        medians = [statistics.median(s) for s in series]
        cells = [
            f"{_fmt(m)} ({_fmt(min(s))}-{_fmt(max(s))})"
            for m, s in zip(medians, series, strict=True)
        ]
        ratios = [f"{m / medians[0]:.3f}" if medians[0] else "-" for m in medians[1:]]
        lowest = [0] * len(revs)
        for rep in zip(*series, strict=False):
            lowest[min(range(len(rep)), key=lambda i: rep[i])] += 1
        counts = " / ".join(f"{r} {c}" for r, c in zip(revs, lowest, strict=True))
        lines.append("| " + " | ".join([key, *cells, *ratios, counts]) + " |")
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def main(argv: list[str] | None = None, out: Any = print) -> int:
    from . import run
    from .fetch_scenarios import SCENARIOS as FETCH_SCENARIOS
    from .scenarios import SCENARIOS as BASE_SCENARIOS

    args, rest = build_parser().parse_known_args(argv)
    sizes = run.sizes_from(run.build_parser().parse_args(rest))
    scenarios = {**BASE_SCENARIOS, **FETCH_SCENARIOS}
    if args.scenario not in scenarios:
        print(f"unknown scenario {args.scenario!r}; known: {list(scenarios)}", file=sys.stderr)
        return 2
    if len(args.revs) < 2 or args.reps < 1:
        print("--rev twice or more, and --reps 1 or more", file=sys.stderr)
        return 2
    if args.extra is not None and len(args.extra) != len(args.revs):
        print(f"--args once per --rev: {len(args.revs)} of them", file=sys.stderr)
        return 2
    names = labels(args.revs, args.extra)
    scenario = scenarios[args.scenario]()
    if scenario.own_proxies:
        print(
            f"{args.scenario} starts a proxy of its own in each repetition: it cannot be "
            "compared across revisions",
            file=sys.stderr,
        )
        return 2
    cases = scenario.cases(sizes)
    unknown = set(args.cases or ()) - set(cases)
    if unknown:
        print(f"unknown case(s) {sorted(unknown)}; known: {cases}", file=sys.stderr)
        return 2
    chosen = [c for c in cases if not args.cases or c in args.cases]
    use_bench_jvm_opts()
    with (
        tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp,
        checkouts(args.revs, Path(tmp)) as trees,
        Stack(Path(tmp) / "stack") as stack,
    ):
        assert stack.cluster is not None
        scenario.prepare(stack, sizes)
        arrangements: list[Arrangement] = []
        for i, tree in enumerate(trees):
            proxy = start_proxy(
                stack.cluster.nodes[1].address,
                Path(tmp) / f"proxy-rev{i}.stderr.log",
                (*scenario.proxy_args(sizes), *shlex.split(args.extra[i] if args.extra else "")),
                tree=tree,
            )
            stack.proxies.append(proxy)  # stopped with the stack, whatever happens
            arrangements.append(Arrangement("proxy", proxy.bootstrap, proxy.proc.pid, proxy))
        for arr in arrangements:
            scenario.warm_up(stack, arr, sizes)
        for case in chosen:
            runs: list[list[dict[str, Any]]] = [[] for _ in trees]
            for rep, i in alternating(args.reps, len(trees)):
                numbers = scenario.measure(stack, arrangements[i], case, sizes)
                runs[i].append(numbers)
                print(f"compare: {case} / {names[i]} #{rep + 1}: {numbers}", file=sys.stderr)
            out(f"\n{args.scenario} / {case} ({args.reps} alternating repetitions)\n")
            out(table(names, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
