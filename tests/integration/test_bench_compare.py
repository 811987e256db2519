"""``python -m bench.compare`` end to end: a committed revision beside the working tree on
one real broker, tiny sizes.  Checks the tool (both proxies measured, the table printed,
the temporary checkout removed), never a timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.kafka import JVM_OPTS

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _worktrees() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_revision_beside_the_working_tree() -> None:
    before = _worktrees()
    env = {**os.environ, "KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS": " ".join(JVM_OPTS)}
    command = "-m bench.compare --rev HEAD --rev WORKTREE --scenario fetch_cpu --reps 2 --smoke"
    proc = subprocess.run(
        [sys.executable, *command.split(), "--case", "1 conn"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "fetch_cpu / 1 conn (2 alternating repetitions)" in lines
    assert "| number | HEAD | WORKTREE | WORKTREE / HEAD | lowest (times) |" in lines
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    assert {"fetches_per_s", "relay_cpu_ms_per_fetch"} <= set(rows)
    # both revisions' proxies were measured, each twice
    assert proc.stderr.count("compare: 1 conn / HEAD #") == 2
    assert proc.stderr.count("compare: 1 conn / WORKTREE #") == 2
    assert _worktrees() == before  # the checkout of HEAD is gone
