"""The ``kafka-fetch-proxy`` command line.

Each subcommand lives beside its feature and registers itself here through a
``register(subparsers)`` function; this module only dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand modules, each exposing register(subparsers) -> None; the parser it
# adds sets ``func`` (a callable taking the parsed namespace, returning an exit code).
_SUBCOMMAND_MODULES: tuple[str, ...] = ("proxy.server.cli", "proxy.server.nodezone")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-fetch-proxy",
        description="A Kafka sidecar proxy that reshapes Fetch traffic.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
