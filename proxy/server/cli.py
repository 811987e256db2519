"""``kafka-fetch-proxy run`` and ``kafka-fetch-proxy check-config``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from typing import Any

import structlog
import trio

from .. import config, logs
from ..fetchpath import FetchPathConfig, InvalidFetchConfig
from .allocator import LARGE_BUFFER_BYTES, fix_mmap_threshold
from .proxy import Proxy
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
    effective = dataclasses.asdict(settings)
    effective.pop("raw")
    print(json.dumps({"ok": True, "settings": effective}, sort_keys=True, default=str))
    return 0


def _run(args: argparse.Namespace) -> int:
    settings = _load(args)
    if settings is None:
        return 2
    logs.configure(settings.log_level)
    # Large buffers mapped and unmapped as they come and go: RSS follows the budget.
    log.info("allocator_policy", reason=fix_mmap_threshold(), limit_bytes=LARGE_BUFFER_BYTES)
    observe = _observe_settings(settings)
    metrics = _metrics(observe)
    try:
        # opened before the proxy starts, closed after it stops; Proxy.decision_log
        decision_log = observe.open_decision_log(metrics) if observe is not None else None
    except OSError as exc:
        log.error("startup_failed", error=f"{type(exc).__name__}: {exc}")
        print(f"kafka-fetch-proxy: cannot open the decision log: {exc}", file=sys.stderr)
        return 1
    try:
        trio.run(_serve, settings, metrics, observe, decision_log, args)
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # e.g. the listen address is taken
        log.error("startup_failed", error=f"{type(exc).__name__}: {exc}")
        print(f"kafka-fetch-proxy: cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        if decision_log is not None:
            decision_log.close()
    return 0


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
    proxy.bind()  # fails here, outside any nursery, when the address is taken
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            config_file = getattr(args, "config", None)
            if reloader is not None and config_file:  # watching before anyone is told we run
                await nursery.start(watch_file, config_file, lambda: reloader.reload("file"))
            assert proxy.bootstrap is not None
            print(f"bootstrap={proxy.bootstrap}", flush=True)
            if settings.metrics_listen is not None and proxy.metrics is not None:
                port = await nursery.start(
                    _serve_metrics, proxy, settings.metrics_listen, debug_sessions
                )
                endpoint = config.HostPort(settings.metrics_listen.host, port)
                print(f"metrics=http://{endpoint}/metrics", flush=True)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    if reloader is not None:
                        reloader.reload("SIGHUP")
                    continue
                log.info("shutdown", reason=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
    if proxy.fetch_path is not None:
        budget = proxy.fetch_path.budget
        log.info(
            "memory_budget_summary",
            limit_bytes=proxy.fetch_path.config.memory_budget_bytes,
            peak_bytes=budget.peak,
            overshoot_bytes=budget.overshoot_bytes,
            count=proxy.fetch_path.fetch_waits,
        )


def _metrics(observe: Any = None) -> Any:
    try:
        from ..observe.metrics import Metrics
    except ImportError:  # the observability module is optional for the relay
        return None
    cap = observe.client_id_label_cap if observe is not None else 0
    return Metrics(client_id_label_cap=cap)


def _observe_settings(settings: config.Settings) -> Any:
    try:
        from ..observe.settings import ObserveSettings
    except ImportError:  # the observability module is optional for the relay
        return None
    return ObserveSettings.from_settings(settings)


async def _serve_metrics(
    proxy: Proxy,
    address: config.HostPort,
    debug_sessions: bool = False,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    from ..observe.http import ObserveApp, Readiness, serve_http

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
    await serve_http(app, address.host, address.port, task_status=task_status)
