"""``kafka-devbroker`` (or ``python -m devbroker``): run the dev cluster until Ctrl-C.

    kafka-devbroker --nodes 3 --port 29092 --topic orders:12 --topic x:3

Node i listens on port+i (port 0: free ports).  The first line on stdout is
``bootstrap=HOST:PORT``; one ``node=ID address=HOST:PORT`` line per node follows.
SIGINT and SIGTERM stop it with exit status 0.  Once the cluster is up, what start-up
made is frozen out of the cycle collector's reach, which then runs its young
generations only, and a full collection a minute, as the proxy's server does.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from collections.abc import Sequence

import trio

from proxy import logs

from .cluster import DevCluster

FULL_COLLECTION_SECONDS = 60.0
"""How often the dev cluster runs a full collection of the cycle collector (``_collect_young``)."""
_NEVER = 2**31 - 1


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
        async with (
            trio.open_nursery() as nursery,
            DevCluster(
                nodes=args.nodes,
                topics=topics,
                host=args.host,
                port=args.port,
                session_cache_slots=args.session_cache_slots,
            ) as cluster,
        ):
            _collect_young()
            nursery.start_soon(_collect_periodically, FULL_COLLECTION_SECONDS)
            print(f"bootstrap={cluster.bootstrap}", flush=True)
            for node in cluster.nodes:
                print(f"node={node.node_id} address={node.address}", flush=True)
            async for _sig in signals:
                break
            nursery.cancel_scope.cancel()


def _collect_young() -> None:
    """The cycle collector as the proxy's server runs it (``proxy.server.cli``).

    What start-up made (the topics: about ten objects per partition, a million for
    100,000 partitions, alive as long as the process) is frozen out of the collector's
    reach, and the collector is left its young generations: a full collection walks
    every tracked object, and a large fetch (a few objects per partition until it is
    answered) or a fetch session (one per partition while it lives) started them a few
    times per fetch, each holding the loop for up to a second before the freeze, and
    tens to hundreds of milliseconds after it.  A full collection runs every
    ``FULL_COLLECTION_SECONDS`` instead; state is freed by reference counting anyway.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)


async def _collect_periodically(seconds: float) -> None:
    while True:
        await trio.sleep(seconds)
        gc.collect()
