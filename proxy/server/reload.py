"""Reloading the configuration without a restart: on SIGHUP and when the config file changes.

The file watch polls the file's modification time and size (no extra
dependency; ``interval`` seconds apart).  A reload re-reads everything (file,
environment, flags, in the usual precedence), validates it as at start, and
applies what a running proxy can change in place: the fetch limits, policies,
the upstream-sessions switch, the reuse-buffer size and the memory budget
(``proxy.fetchpath.FetchPath.reload``).  Live connections use them from their
next fetch.  Other keys (listeners, TLS, upstream addresses, ...) need a
restart: a reload that changes them says so in its log line and keeps the old
values.  An invalid configuration is refused: the old one stays, the failure
is logged with each error and counted (``config_reload_failures_total``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import structlog
import trio

from .. import config
from ..config import FetchPathConfig, InvalidFetchConfig
from ..fetchpath import FetchPath

log = structlog.get_logger("proxy.server")

RELOADABLE_KEYS = frozenset(
    {
        "max_response_bytes",
        "max_partition_bytes",
        "max_records",
        "max_partition_records",
        "memory_budget_bytes",
        "reuse_buffer_bytes",
        "max_upstream_wait_ms",
        "run_ahead",
        "max_partitions_in_flight",
        "max_fetch_partitions",
        "rack",
        "policies",
        "fetch_sessions",
    }
)


class Reloader:
    """Re-reads the settings with *load* and applies the reloadable part to *fetch_path*."""

    def __init__(
        self,
        load: Callable[[], config.Settings],
        fetch_path: FetchPath,
        current: config.Settings,
        *,
        metrics: Any | None = None,
    ) -> None:
        self.load = load
        self.fetch_path = fetch_path
        self.current = current
        self.metrics = metrics

    def reload(self, trigger: str) -> bool:
        """One reload attempt; True when the new configuration was applied."""
        try:
            settings = self.load()
            new = FetchPathConfig.from_raw(settings.raw)
        except (config.ConfigError, InvalidFetchConfig) as exc:
            errors = exc.errors if isinstance(exc, config.ConfigError) else [str(exc)]
            log.error("config_reload_failed", reason=trigger, error="; ".join(errors))
            if self.metrics is not None:
                self.metrics.config_reloaded(ok=False)
            return False
        old_raw, new_raw = dict(self.current.raw), dict(settings.raw)
        changed = sorted(
            k for k in old_raw.keys() | new_raw.keys() if old_raw.get(k) != new_raw.get(k)
        )
        self.fetch_path.reload(new)
        restart = [k for k in changed if k not in RELOADABLE_KEYS]
        applied = [k for k in changed if k in RELOADABLE_KEYS]
        self.current = settings
        log.info("config_reloaded", reason=trigger, config_keys=applied, restart_keys=restart)
        if self.metrics is not None:
            self.metrics.config_reloaded(ok=True)
        return True


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


async def watch_file(
    path: str,
    on_change: Callable[[], object],
    *,
    interval: float = 1.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call *on_change()* whenever *path*'s modification time or size changes."""
    last = _stamp(path)
    task_status.started()
    while True:
        await trio.sleep(interval)
        now = _stamp(path)
        if now != last:
            last = now
            if now is not None:  # a file being replaced: wait until it is back
                on_change()
