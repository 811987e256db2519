"""The ``kafka-fetch-proxy`` command line.

Each subcommand lives beside its feature and registers itself here through a
``register(subparsers)`` function; this module only dispatches.  The subcommand
modules are imported by name, not looked up from strings, so that the import
contracts (``lint-imports``) see every module the command can load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from proxy.server import cli as serve_cli
from proxy.server import nodezone

# each subcommand module's register(subparsers) -> None; the parser it adds sets
# ``func`` (a callable taking the parsed namespace, returning an exit code).
_REGISTER = (serve_cli.register, nodezone.register)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-fetch-proxy",
        description="A Kafka sidecar proxy that reshapes Fetch traffic.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _REGISTER:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
