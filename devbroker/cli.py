"""``kafka-devbroker`` (or ``python -m devbroker``): run the dev cluster until Ctrl-C.

    kafka-devbroker --nodes 3 --port 29092 --topic orders:12 --topic x:3

Node i listens on port+i (port 0: free ports).  The first line on stdout is
``bootstrap=HOST:PORT``; one ``node=ID address=HOST:PORT`` line per node follows.
SIGINT and SIGTERM stop it with exit status 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import trio

from proxy import logs

from .cluster import DevCluster


def _topic(spec: str) -> tuple[str, int]:
    name, sep, count = spec.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS, got {spec!r}")
    try:
        partitions = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"partition count of {spec!r} is not a number") from None
    if partitions <= 0:
        raise argparse.ArgumentTypeError(f"partition count of {spec!r} must be positive")
    return name, partitions


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kafka-devbroker",
        description="Run a strict in-memory Kafka cluster (one loopback port per node), "
        "for demos and tests.",
    )
    p.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on and advertise")
    p.add_argument(
        "--port", type=int, default=29092, help="port of node 0; node i uses port+i (0: free ports)"
    )
    p.add_argument(
        "--topic",
        type=_topic,
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create a topic at start (repeatable)",
    )
    p.add_argument(
        "--session-cache-slots",
        type=int,
        default=1000,
        help="fetch session cache slots per node (max.incremental.fetch.session.cache.slots: 8 shards of slots/8 each, as Kafka)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="JSON log lines on stderr at this level and above (default warning)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.nodes <= 0:
        print("--nodes must be positive", file=sys.stderr)
        return 2
    topics = dict(args.topic)
    if len(topics) != len(args.topic):
        print("a topic is given twice", file=sys.stderr)
        return 2
    logs.configure(args.log_level.lower(), sys.stderr)
    try:
        trio.run(_serve, args, topics)
    except (OSError, BaseExceptionGroup) as exc:
        error = _os_error(exc)
        if error is None:
            raise
        print(f"cannot listen: {error}", file=sys.stderr)
        return 1
    return 0


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError (a port in use, ...) behind *exc*, unwrapping trio's exception groups."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _os_error(inner)) is not None:
                return found
    return None


async def _serve(args: argparse.Namespace, topics: dict[str, int]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with DevCluster(
            nodes=args.nodes,
            topics=topics,
            host=args.host,
            port=args.port,
            session_cache_slots=args.session_cache_slots,
        ) as cluster:
            print(f"bootstrap={cluster.bootstrap}", flush=True)
            for node in cluster.nodes:
                print(f"node={node.node_id} address={node.address}", flush=True)
            async for _sig in signals:
                break
