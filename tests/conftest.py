"""Shared test configuration."""

# -- dev cluster fixtures (tests/support/cluster.py) ---------------------------------

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from support import verifier
from support.backends import BACKENDS, upstream_for
from support.cluster import ThreadedCluster
from support.kafka import KafkaCluster

__all__ = ["BACKENDS", "upstream_for"]  # defined in tests/support/backends.py

# Property tests are deterministic: the same examples on every run and machine, and no
# example database replaying what an earlier run on this machine happened to find.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")


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


# -- real Apache Kafka (tests/support/kafka.py) ---------------------------------------
#
# Session-scoped KRaft clusters, started on first use and stopped by pid at the end.
# Tests that use them (directly, or through a backend parameter "kafka*") are marked
# ``kafka`` at collection, so ``-m kafka`` selects them.  A node's logs are kept under
# var/kafka-logs/ when a test that used the cluster failed; otherwise removed.

KAFKA_FIXTURES = {"kafka": ("4", 1), "kafka3": ("4", 3), "kafka39": ("3.9", 1)}
"""fixture name -> (Kafka line, brokers)."""

_kafka_started: list[str] = []
_failed_fixtures: set[str] = set()
_kafka_outcomes: dict[str, str] = {}
"""node id -> outcome of every test marked kafka (for the closing summary)."""


def _kafka_cluster(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    version, brokers = KAFKA_FIXTURES[name]
    workdir = tmp_path_factory.mktemp(name)
    cluster = KafkaCluster(brokers, workdir=workdir, version=version).start()
    _kafka_started.append(
        f"{name}: Apache Kafka {cluster.version}, {brokers} broker(s), "
        f"started in {cluster.start_seconds:.1f} s"
    )
    try:
        yield cluster
    finally:
        cluster.stop()
        if name in _failed_fixtures:
            keep = Path(__file__).resolve().parent.parent / "var" / "kafka-logs"
            dest = keep / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
            dest.mkdir(parents=True, exist_ok=True)
            for node in cluster.nodes.values():
                for log in ("server.log", "stdout.log", "server.properties"):
                    if (node.dir / log).exists():
                        shutil.copy(node.dir / log, dest / f"node-{node.node_id}-{log}")
            _kafka_started.append(f"{name}: a test failed; broker logs kept in {dest}")
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A single-node Kafka 4.x (combined broker+controller)."""
    yield from _kafka_cluster("kafka", tmp_path_factory)


@pytest.fixture(scope="session")
def kafka3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A 3-node Kafka 4.x cluster (each node broker+controller, replication factor 3)."""
    yield from _kafka_cluster("kafka3", tmp_path_factory)


@pytest.fixture(scope="session")
def kafka39(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A single-node Kafka 3.9.x: the older broker."""
    yield from _kafka_cluster("kafka39", tmp_path_factory)


def _uses_kafka(item: pytest.Item) -> set[str]:
    names = set(getattr(item, "fixturenames", ())) & set(KAFKA_FIXTURES)
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names |= {v for v in callspec.params.values() if isinstance(v, str) and v in KAFKA_FIXTURES}
    return names


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_kafka(item):
            item.add_marker(pytest.mark.kafka)
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        _failed_fixtures.update(_uses_kafka(item))
    if item.get_closest_marker("kafka") is not None:
        if report.failed:
            _kafka_outcomes[item.nodeid] = "failed"
        elif report.when == "call" and item.nodeid not in _kafka_outcomes:
            _kafka_outcomes[item.nodeid] = report.outcome
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if verifier.REPORTS:
        terminalreporter.write_line("faults (tests/integration/test_faults_kafka.py):")
        for line in verifier.summary_table(verifier.REPORTS):
            terminalreporter.write_line(f"  {line}")
    for line in _kafka_started:
        terminalreporter.write_line(f"real Kafka: {line}")
    if _kafka_outcomes:
        counts = {o: list(_kafka_outcomes.values()).count(o) for o in ("passed", "failed")}
        terminalreporter.write_line(
            f"real Kafka: {len(_kafka_outcomes)} tests ran against real Apache Kafka"
            f" (-m kafka): {counts['passed']} passed, {counts['failed']} failed"
        )
