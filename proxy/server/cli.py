"""``kafka-fetch-proxy run`` and ``kafka-fetch-proxy check-config``."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog
import trio

from .. import config, logs
from ..config import FetchPathConfig, InvalidFetchConfig
from ..shaping.budget import BUDGET_FLOOR, MemoryBudget, max_fetch_bytes
from ..shaping.policy import overridden
from .allocator import HEAP_TRIM_SECONDS, LARGE_BUFFER_BYTES, fix_mmap_threshold, heap_trimmer
from .proxy import ListenError, Proxy
from .reload import Reloader, watch_file

log = structlog.get_logger("proxy.server")


def register(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run",
        help="run the proxy",
        description="Run the proxy in front of a Kafka cluster. Every setting is a flag, an "
        "environment variable and a config file key (flags > env > file > defaults).",
    )
    config.add_arguments(run)
    run.set_defaults(func=_run)
    check = subparsers.add_parser(
        "check-config",
        help="validate the configuration without starting",
        description="Validate the configuration (file, environment and flags) and print it.",
    )
    config.add_arguments(check)
    check.set_defaults(func=_check)


def _load(args: argparse.Namespace) -> config.Settings | None:
    try:
        settings = config.from_args(args, os.environ)
        FetchPathConfig.from_raw(settings.raw)  # policies: unique names
    except config.ConfigError as exc:
        print(f"kafka-fetch-proxy: {exc}", file=sys.stderr)
        return None
    except InvalidFetchConfig as exc:
        print(f"kafka-fetch-proxy: invalid configuration:\n  {exc}", file=sys.stderr)
        return None
    return settings


def _check(args: argparse.Namespace) -> int:
    settings = _load(args)
    if settings is None:
        return 2
    print(json.dumps(check_report(settings), indent=2, sort_keys=True, default=str))
    return 0


def check_report(
    settings: config.Settings, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What ``check-config`` prints: every setting, where it came from, and what it means.

    ``settings`` holds every key of the schema (defaults filled in), ``sources``
    where each came from; ``effective`` spells out what the fetch path and the
    decision log will do with them: the global limits, each policy with what it
    matches, the limits a matching client gets and whether the proxy's rack replaces
    the client's own (``rack_override``), the memory budget and its
    per-fetch grant, and the decision log's target, sample rate and instance.
    """
    values, sources = config.effective(settings)
    fetch = FetchPathConfig.from_raw(settings.raw)
    budget = fetch.memory_budget_bytes
    effective: dict[str, Any] = {
        "limits": fetch.limits.as_dict(),
        "policies": [
            {
                "name": p.name,
                "matches": {"client_id": p.client_id or "*", "listener": p.listener or "*"},
                "limits": overridden(fetch.limits, p.limits).as_dict(),
                "rack_override": p.rack_override,
            }
            for p in fetch.policies
        ],
        "fetch_sessions": fetch.fetch_sessions,
        "reuse_buffer_bytes": fetch.reuse_buffer_bytes,
        "max_upstream_wait_ms": fetch.max_upstream_wait_ms,
        "run_ahead": fetch.run_ahead,
        "memory_budget": (
            {"budget_bytes": None, "meaning": "no budget: fetches never wait"}
            if budget is None
            else {
                "budget_bytes": budget,
                "max_fetch_grant_bytes": max_fetch_bytes(
                    MemoryBudget(budget, floor=min(BUDGET_FLOOR, budget))
                ),
            }
        ),
    }
    effective["listeners"] = listeners(settings)
    effective["rack"] = {
        "rack": settings.rack or None,
        "source": sources["rack"],
        "meaning": (
            f"Fetch v11+ sent upstream carry rack id {settings.rack!r} when the client sets none"
            if settings.rack
            else "off: no rack id is added to fetches"
        ),
        "cross_zone_price_per_gb": settings.cross_zone_price_per_gb,
    }
    observe = _observe_settings(settings, environ)
    if observe is not None:
        effective["decision_log"] = {
            "target": observe.decision_log or "off",
            "sample_rate": observe.decision_log_sample_rate,
            "instance": observe.instance,
        }
    return {"ok": True, "settings": values, "sources": sources, "effective": effective}


def listeners(settings: config.Settings) -> dict[str, Any]:
    """The addresses the proxy will listen on, and whether each stays on loopback.

    The bootstrap listener binds ``listen``; every broker listener binds the same
    host (``broker_port_base`` + node id, or ``broker_ports``); the HTTP endpoint
    binds ``metrics_listen``.  A listener on loopback is reachable only from the
    same network namespace (the pod); any other address from every network that
    reaches that address (0.0.0.0, ``::``: all of them).
    """
    host = settings.listen.host
    metrics = settings.metrics_listen
    return {
        "bootstrap": str(settings.listen),
        "brokers": {
            "host": host,
            "port_base": settings.broker_port_base,
            "ports": {str(n): p for n, p in sorted(settings.broker_ports.items())},
        },
        "metrics": None if metrics is None else str(metrics),
        "kafka_on_loopback_only": _is_loopback(host),
        "metrics_on_loopback_only": None if metrics is None else _is_loopback(metrics.host),
    }


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: whatever it resolves to, not known to be loopback
        return False


def _run(args: argparse.Namespace) -> int:
    settings = _load(args)
    if settings is None:
        return 2
    logs.configure(settings.log_level)
    # Large buffers mapped and unmapped as they come and go: RSS follows the budget.
    log.info("allocator_policy", reason=fix_mmap_threshold(), limit_bytes=LARGE_BUFFER_BYTES)
    # which brokers share it follows in rack_brokers, once discovery has their Metadata
    rack_from = settings.sources.get("rack", "")
    log.info(
        "rack_configured",
        rack=settings.rack or None,
        setting="rack_file" if rack_from.startswith("rack_file ") else "rack",
    )
    observe = _observe_settings(settings)
    metrics = _metrics(observe)
    try:
        # opened before the proxy starts, closed after it stops; Proxy.decision_log
        decision_log = observe.open_decision_log(metrics) if observe is not None else None
    except OSError as exc:
        log.error("startup_failed", setting="decision_log", error=f"{type(exc).__name__}: {exc}")
        print(
            f"kafka-fetch-proxy: cannot open the decision log (setting decision_log): {exc}",
            file=sys.stderr,
        )
        return 1  # deploy/README.md documents 1 for this one
    try:
        trio.run(_serve, settings, metrics, observe, decision_log, args)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        failure = _startup_failure(exc)
        if failure is None:
            raise
        if isinstance(failure, ListenError):
            log.error("startup_failed", **failure.log_fields())
        else:  # e.g. a TLS file that cannot be read
            log.error("startup_failed", error=f"{type(failure).__name__}: {failure}")
        print(f"kafka-fetch-proxy: cannot start: {failure}", file=sys.stderr)
        return 2
    finally:
        if decision_log is not None:
            decision_log.close()
    return 0


def _startup_failure(exc: BaseException) -> OSError | None:
    """The OSError (e.g. a ListenError) that stopped the proxy, found inside trio's groups.

    None when anything else is in the group too: that is a bug, and its traceback shows.
    """
    while isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(OSError)
        if matched is None or rest is not None:
            return None
        exc = matched.exceptions[0]
    return exc if isinstance(exc, OSError) else None


async def _serve(
    settings: config.Settings,
    metrics: Any = None,
    observe: Any = None,
    decision_log: Any = None,
    args: argparse.Namespace | None = None,
) -> None:
    proxy = Proxy(settings, metrics=metrics, decision_log=decision_log)
    reloader = None
    if args is not None and proxy.fetch_path is not None:
        reloader = Reloader(
            lambda: config.from_args(args, os.environ), proxy.fetch_path, settings, metrics=metrics
        )
    debug_sessions = observe is not None and observe.debug_sessions
    # Both listeners bind here, outside any nursery: a taken address is a ListenError
    # naming its setting, raised before anything is printed.
    proxy.bind()
    metrics_listeners = None
    if settings.metrics_listen is not None and proxy.metrics is not None:
        metrics_listeners = await _open_metrics_listeners(settings.metrics_listen)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            trim = heap_trimmer()
            release = None if proxy.fetch_path is None else proxy.fetch_path.release_idle
            if trim is not None or release is not None:
                nursery.start_soon(_trim_heap, trim, release)
            nursery.start_soon(
                collect_periodically,
                gc.collect,
                FULL_COLLECTION_SECONDS,
                FULL_COLLECTION_MAX_SECONDS,
            )
            config_file = getattr(args, "config", None)
            if reloader is not None and config_file:  # watching before anyone is told we run
                await nursery.start(watch_file, config_file, lambda: reloader.reload("file"))
            assert proxy.bootstrap is not None
            freeze_startup_heap()
            only_young_collections()
            print(f"bootstrap={proxy.bootstrap}", flush=True)
            if settings.metrics_listen is not None and metrics_listeners is not None:
                port = await nursery.start(_serve_metrics, proxy, metrics_listeners, debug_sessions)
                endpoint = config.HostPort(settings.metrics_listen.host, port)
                print(f"metrics=http://{endpoint}/metrics", flush=True)
            stopping = False
            async for signum in signals:
                if signum == signal.SIGHUP:
                    if reloader is not None:
                        reloader.reload("SIGHUP")
                    continue
                if stopping:  # a second SIGTERM or SIGINT: stop now
                    log.warning("shutdown_cut", reason=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
                stopping = True
                grace = settings.shutdown_grace_seconds
                log.info("shutdown", reason=signal.Signals(signum).name, grace_seconds=grace)
                nursery.start_soon(_drain, proxy, grace, nursery.cancel_scope)
    if proxy.fetch_path is not None:
        log.info(
            "memory_budget_summary",
            **budget_summary(
                proxy.fetch_path.config.memory_budget_bytes,
                proxy.fetch_path.budget,
                proxy.fetch_path.fetch_waits,
            ),
        )


def freeze_startup_heap() -> None:
    """Put what start-up allocated out of the cycle collector's reach (``gc.freeze``).

    Modules, kio's message classes, the metrics registry: objects that live as long
    as the process.  Left in the oldest generation, every full collection walks all
    of them again (tens of milliseconds of CPU), and the allocations of a scrape or
    of a new connection trigger one now and then, a cost that showed up as an idle
    long-polling connection's CPU per fetch jumping from ~1.8 to ~6-7 ms in some
    measured windows (bench fetch_cpu, 1 connection).  Frozen, they are still freed
    by reference counting; a full collection walks only what serving allocated.
    """
    gc.collect()
    gc.freeze()


FULL_COLLECTION_SECONDS = 60.0
"""How often the server runs a full collection of the cycle collector (``only_young_collections``)
while collections find cyclic garbage."""
FULL_COLLECTION_MAX_SECONDS = 600.0
"""The longest wait between two full collections: while they find nothing, the wait doubles
up to this (``collect_periodically``)."""
_NEVER = 2**31 - 1


def only_young_collections() -> None:
    """Leave the cycle collector only its young generations; a full collection runs every
    ``FULL_COLLECTION_SECONDS`` instead (``collect_periodically``).

    A full collection walks every object the collector tracks, and per-partition state is
    tracked objects (NamedTuple keys and parameters, session entries, kio entities: about
    twenty per partition of a fetch session).  CPython starts one whenever the objects that
    survived two young collections grow by a quarter, so building fetch sessions started
    them over and over: 63 full collections of 35-150 ms (about 5 s of the loop) while 20
    sessions of 10,000 partitions came and went (bench/attacks ``abandoned-sessions``, lean,
    the proxy's collections timed with ``gc.callbacks``); 3 with this.  The young
    generations keep their thresholds (a pause there walks at most a few thousand objects),
    and nothing here relies on the collector to free memory: state is freed by reference
    counting when its owner goes (the retention rows of RELIABILITY.md), cycles are rare,
    and they wait at most a minute.
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)


@contextmanager
def collector_as_served() -> Iterator[None]:
    """The server's collector policy (``freeze_startup_heap``, ``only_young_collections``)
    for a measurement run in process (``bench.fetch_micro``, ``bench.edge_micro``), undone at
    exit: what was frozen goes back to the collector
    and the thresholds are restored.  Without it, CPython's automatic full collections
    walk the measurement's whole heap, which the server never does: at 100 connections
    in ``bench.edge_micro`` they were about a third of the CPU a 1-record fetch took."""
    thresholds = gc.get_threshold()
    freeze_startup_heap()
    only_young_collections()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


async def collect_periodically(
    collect: Callable[[], object], seconds: float, longest: float | None = None
) -> None:
    """Run *collect* (``gc.collect``: a full collection, which returns the unreachable
    objects it found) after *seconds*, then again and again.

    A full collection walks every tracked object with the loop stopped: at 1,000
    long-polling connections (bench fetch_cpu), 177 and 213 ms for some 340,000 objects,
    and both found nothing (the connections' state is freed by reference counting).  So while collections find nothing the wait doubles, up to *longest*
    (None: always *seconds*); one that finds something brings it back to *seconds*.
    Cyclic garbage made after a quiet spell waits up to *longest*.
    """
    wait = seconds
    while True:
        await trio.sleep(wait)
        found = collect()
        if longest is None or (isinstance(found, int) and found > 0):
            wait = seconds
        else:
            wait = min(longest, wait * 2)


async def _trim_heap(trim: Callable[[], None] | None, release: Callable[[], int] | None) -> None:
    """Every ``HEAP_TRIM_SECONDS``, let go of the large frame bodies and record copies nothing
    took since the last time (``FetchPath.release_idle``), and give the heap's free pages
    back."""
    while True:
        await trio.sleep(HEAP_TRIM_SECONDS)
        if release is not None:
            release()
        if trim is not None:
            trim()


async def _drain(proxy: Proxy, grace: float, stop: trio.CancelScope) -> None:
    """Listeners closed, in-flight requests answered (at most ``grace`` seconds), then stop."""
    began = trio.current_time()
    with trio.move_on_after(grace) as cut:
        await proxy.drain()
    seconds = round(trio.current_time() - began, 3)
    if cut.cancelled_caught:
        log.warning(
            "shutdown_grace_expired",
            grace_seconds=grace,
            seconds=seconds,
            connections=len(proxy.live),
            in_flight=sum(live.relay.in_flight for live in proxy.live.values()),
        )
    else:
        log.info("drained", seconds=seconds)
    stop.cancel()


def budget_summary(limit: int | None, budget: MemoryBudget, waits: int) -> dict[str, Any]:
    """The fields of the ``memory_budget_summary`` line written at shutdown.

    ``peak_bytes`` is the most the budget ever had reserved at once: responses
    taken from their length prefix until written (a fetch waiting upstream holds
    nothing) and the reuse buffers.  It bounds the response data held, it is not
    bytes received.  Without a budget (a ``FetchPathConfig`` with none; the command
    always has one) nothing is refused, so only the wait count is given.
    """
    if limit is None:
        return {"limit_bytes": None, "count": waits}
    return {
        "limit_bytes": limit,
        "peak_bytes": budget.peak,
        "overshoot_bytes": budget.overshoot_bytes,
        "count": waits,
    }


def _metrics(observe: Any = None) -> Any:
    try:
        from ..observe.metrics import Metrics
    except ImportError:  # the observability module is optional for the relay
        return None
    cap = observe.client_id_label_cap if observe is not None else 0
    return Metrics(client_id_label_cap=cap)


def _observe_settings(settings: config.Settings, environ: Mapping[str, str] | None = None) -> Any:
    try:
        from ..observe.settings import ObserveSettings
    except ImportError:  # the observability module is optional for the relay
        return None
    return ObserveSettings.from_settings(settings, environ)


async def _open_metrics_listeners(address: config.HostPort) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(address.port, host=address.host)
    except OSError as exc:
        raise ListenError("metrics_listen", address, exc) from exc


async def _serve_metrics(
    proxy: Proxy,
    listeners: list[trio.SocketListener],
    debug_sessions: bool = False,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    from ..observe.http import ObserveApp, Readiness, serve_http_listeners

    def readiness() -> Readiness:
        ready, checks = proxy.readiness()
        return Readiness(ready, checks)

    assert proxy.metrics is not None
    app = ObserveApp(
        proxy.metrics.registry,
        readiness,
        debug_sessions=proxy.debug_sessions if debug_sessions else None,
        refresh=proxy.refresh_metrics,
    )
    await serve_http_listeners(app, listeners, task_status=task_status)
