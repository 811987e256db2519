"""The observability settings of ``kafka-fetch-proxy run``, read from the validated config.

The keys live in the config schema like every other (``debug_sessions``,
``decision_log``, ``decision_log_sample_rate``, ``decision_log_queue_bytes``, ``instance``,
``metrics_client_id_label_cap``; each also a flag and
a ``KAFKA_FETCH_PROXY_*`` variable); this module turns them into what the
observability code needs, with the schema's defaults, so ``proxy.config`` does
not have to know about them.

``instance`` defaults to the ``HOSTNAME`` environment variable, which container
runtimes set to the container's host name (the pod name in Kubernetes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import config
from .decisionlog import DEFAULT_QUEUE_BYTES, MAX_INSTANCE_CHARS, DecisionLog
from .metrics import Metrics

STDOUT = "-"


@dataclass(frozen=True, slots=True)
class ObserveSettings:
    debug_sessions: bool = False
    decision_log: str | None = None
    """A file path, ``-`` for stdout, or None: no decision log."""
    decision_log_sample_rate: float = 1.0
    instance: str | None = None
    client_id_label_cap: int = 0
    """Client ids admitted as a metrics label (then ``other``); 0: no such label."""
    decision_log_queue_bytes: int = DEFAULT_QUEUE_BYTES

    @classmethod
    def from_settings(
        cls, settings: config.Settings, environ: Mapping[str, str] | None = None
    ) -> ObserveSettings:
        environ = os.environ if environ is None else environ
        raw = settings.raw

        def get(key: str) -> Any:
            return raw.get(key, config.schema()["properties"][key].get("default"))

        target = str(get("decision_log") or "")
        instance = get("instance") or environ.get("HOSTNAME") or None
        return cls(
            debug_sessions=bool(get("debug_sessions")),
            decision_log=target or None,
            decision_log_sample_rate=float(get("decision_log_sample_rate")),
            decision_log_queue_bytes=int(get("decision_log_queue_bytes")),
            instance=instance[:MAX_INSTANCE_CHARS] if instance else None,
            client_id_label_cap=int(get("metrics_client_id_label_cap")),
        )

    def open_decision_log(self, metrics: Metrics | None) -> DecisionLog | None:
        """The configured decision log, opened (OSError if the file cannot be), or None."""
        if self.decision_log is None:
            return None
        return DecisionLog.open(
            self.decision_log,
            sample_rate=self.decision_log_sample_rate,
            queue_bytes=self.decision_log_queue_bytes,
            metrics=metrics,
            instance=self.instance,
        )
