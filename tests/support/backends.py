"""The upstreams a proxy scenario runs against, for module-scoped parametrised fixtures.

    @pytest.fixture(scope="module", params=BACKENDS)
    def stack(request):
        with running(ProxyStack(upstream=upstream_for(request, request.param))) as s:
            yield s

``"devbroker"`` is the in-process dev cluster (``upstream_for`` returns None);
``"kafka"``, ``"kafka3"`` and ``"kafka39"`` name the session fixtures of
tests/conftest.py (real Apache Kafka), so a test parametrised with one of them is
marked ``kafka`` at collection.  Scenarios that stop a broker while consuming use
``BACKENDS_3``: a partition must move to another leader, which needs three nodes
with replication factor 3.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

from .kafka import KafkaCluster
from .stack import ProxyStack

BACKENDS = ("devbroker", "kafka")
"""The two upstreams every proxy integration scenario runs against."""
BACKENDS_3 = ("devbroker", "kafka3")
"""The same, with three real Kafka nodes (replication factor 3)."""

S = TypeVar("S", bound=ProxyStack)


def upstream_for(request: pytest.FixtureRequest, backend: str) -> KafkaCluster | None:
    """The real cluster behind a backend parameter ("kafka", "kafka3", "kafka39"), or None
    for the dev cluster."""
    if backend == "devbroker":
        return None
    cluster = request.getfixturevalue(backend)
    assert isinstance(cluster, KafkaCluster)
    return cluster


@contextmanager
def running(stack: S) -> Iterator[S]:
    """Start *stack*, and stop it when the block ends."""
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
