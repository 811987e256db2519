"""Hostile clients cannot stall, exhaust or lock out the others (issue 19's "Done when").

The lean run of ``bench/attacks.py``: the harness starts the dev cluster and, for each
attack, a ``kafka-fetch-proxy run`` process with default settings in front of it, then
watches it from outside while one attack runs at reduced but still meaningful size.  For
each attack, every criterion must hold over the attack's window:

- the proxy's own ApiVersions round trip for another client stays under 100 ms at p99;
- the proxy's RSS stays under ``memory_budget_bytes`` + 64 MiB;
- every ``/healthz`` answer (a new connection each 0.2 s) is 200;
- a consumer on another connection keeps receiving records (no gap over 2 s);

and for the rows about state kept after its owner left, the RSS still held a few
seconds after the attack stays under 64 MiB; for the rows about connections that lock
others out, every new connection during the attack (one each 0.5 s) is served.  The full-size run and its numbers are in
RELIABILITY.md ("Hostile clients").

The suite asserts every criterion but the first: a p99 in milliseconds is a speed target,
which belongs to the benchmark (``python -m bench.attacks``, whose table judges it), not
to a test that a loaded CI machine could fail with a correct proxy.  The round trips still
have to be answered: the prober's samples must exist, and every ``/healthz`` answer must
be 200 within its 2 s timeout.

Rows here: every row of ``bench/attacks.py``, at its lean size.  Five were added as each
came to pass: three sessionless Fetches of 30,000 partitions in a row (refused from their
bytes by ``max_fetch_partitions``; before, each held the event loop for seconds), 20 idle
sockets on the HTTP port (before, ``/healthz`` answered 503 while they were open), 8
connections each sending 64 MiB of an unfinished Produce (before, a closed one's 64 MiB
stayed resident while the pool let the next one in: RSS over the bound), 1,000 sockets
that send nothing, and a leak of 1,500 at 500 a second (before, the newcomers beyond
``max_connections`` were refused until ``first_request_timeout_seconds`` closed the silent
ones).  The other five (an admitted Fetch of many partitions, nine large Fetches at once,
pipelined Fetches, abandoned fetch sessions, state kept by closed connections) joined
once every row passed in the full-size runs of RELIABILITY.md ("Hostile clients"); their
lean run takes about 50 s more.

One harness process runs the attacks (about 90 s: each attack's proxy starts while the one
before settles); it is started in its own process group and the whole group is killed if
it overruns its absolute timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ATTACKS = (
    "big-fetch",
    "admitted-fetch",
    "nine-big-fetches",
    "unfinished-frames",
    "pipelined-fetches",
    "abandoned-sessions",
    "closed-state",
    "http-idle",
    "idle-connections",
    "connection-leak",
)
"""Every row of bench/attacks.py's table."""
TIMEOUT = 240.0
TIMED = frozenset({"rtt_p99"})
"""Criteria that are speed targets: judged by bench/attacks.py, not asserted here."""

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("attacks") / "lean.json"
    argv = [sys.executable, "-m", "bench.attacks", "--size", "lean", "--out", str(out)]
    proc = subprocess.Popen(
        [*argv, "--only", ",".join(ATTACKS)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its proxy, dev cluster and attack workers share its group
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=10)
        pytest.fail(f"the attack harness overran {TIMEOUT:.0f} s:\n{output.decode()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = output.decode(errors="replace")
    assert out.exists(), f"the harness wrote no results (exit {proc.returncode}):\n{text[-3000:]}"
    done = {r["attack"]: r for r in json.loads(out.read_text())["results"]}
    assert set(done) == set(ATTACKS), f"attacks without results:\n{text[-3000:]}"
    return done


@pytest.mark.parametrize("attack", ATTACKS)
def test_under_attack_the_proxy_keeps_serving_the_others(
    results: dict[str, dict[str, Any]], attack: str
) -> None:
    r = results[attack]
    assert r["rtt"]["answered"] > 0, f"{attack}: the ApiVersions prober got no answer"
    failed = [name for name, ok in r["criteria"].items() if not ok and name not in TIMED]
    summary = json.dumps({k: r[k] for k in ("rtt", "rss", "healthz", "victim", "worker")})
    assert not failed, f"{attack}: {failed} failed ({r['row']}): {summary}"
