"""``python -m devbroker`` and the installed ``kafka-devbroker`` command."""

import sys

from proxy.command import without_test_tools


def run() -> int:
    """The command: :func:`devbroker.cli.main`, imported once the test tools are marked
    absent (``proxy.command``)."""
    without_test_tools()
    from devbroker.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
