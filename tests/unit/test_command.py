"""The commands start without the test tools their dependencies would import (``proxy.command``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs a command's entry point as the installed script does, then lists which of the
# modules of interest the process imported (printed at exit, after argparse's --help).
_PROBE = """
import atexit, sys
names = ("hypothesis", "rich", "kio", "structlog", "trio")
atexit.register(lambda: print("imported:", *[n for n in names if sys.modules.get(n) is not None]))
from {package}.__main__ import run
sys.argv = ["{command}", "--help"]
sys.exit(run())
"""


@pytest.mark.parametrize(
    ("package", "command"), [("proxy", "kafka-fetch-proxy"), ("devbroker", "kafka-devbroker")]
)
def test_a_command_imports_its_dependencies_but_not_the_test_tools(
    package: str, command: str
) -> None:
    import hypothesis  # noqa: F401  (installed here: what the command must not import)
    import rich  # noqa: F401

    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(package=package, command=command)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("imported:")]
    assert line.split()[1:] == ["kio", "structlog", "trio"]
