"""Shared test configuration."""

# -- dev cluster fixtures (tests/support/cluster.py) ---------------------------------

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.cluster import ThreadedCluster


@pytest.fixture
def dev_cluster_factory() -> Iterator[Callable[..., ThreadedCluster]]:
    """Start threaded dev clusters (``factory(nodes=3, topics={...})``); all stop at teardown."""
    started: list[ThreadedCluster] = []

    def start(
        nodes: int = 3, topics: dict[str, int] | None = None, **kwargs: Any
    ) -> ThreadedCluster:
        cluster = ThreadedCluster(nodes, topics, **kwargs)
        cluster.__enter__()
        started.append(cluster)
        return cluster

    yield start
    for cluster in reversed(started):
        cluster.close()


@pytest.fixture
def dev_cluster(dev_cluster_factory: Callable[..., ThreadedCluster]) -> ThreadedCluster:
    """A threaded 3-node dev cluster with topic ``orders`` (12 partitions)."""
    return dev_cluster_factory(3, {"orders": 12})
