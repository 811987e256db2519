"""What a process started as one of the project's commands does before its other imports.

kio imports hypothesis when it is installed (strategies for its types; hypothesis then
loads its plugins, pytest among them), and structlog imports rich (console tracebacks).
Both are test tools here (``[test]`` extras), absent from the sidecar image, and neither
command uses what they add.  Where they are installed, in the development environment and
the test suite, those imports were 40 % of a command's start-up: 0.55 of 1.4 CPU-seconds
for ``kafka-fetch-proxy``, measured; each test that starts a proxy or a dev cluster paid
them.  :func:`without_test_tools` marks them absent, so a command starts and behaves as it
does where only its own dependencies are installed.
"""

from __future__ import annotations

import sys

TEST_TOOLS = ("hypothesis", "rich")
"""Optional imports of the proxy's dependencies that only the ``[test]`` extras install."""


def without_test_tools() -> None:
    """Mark :data:`TEST_TOOLS` absent for this process (an ``import`` of one raises
    ImportError), unless one is imported already: only a command calls this, first."""
    for name in TEST_TOOLS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
