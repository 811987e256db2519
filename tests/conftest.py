"""Shared test configuration."""

# -- dev cluster fixtures (tests/support/cluster.py) ---------------------------------

import functools
import inspect
import re
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
from support.kafka import KafkaCluster, clusters_in, running_clusters

__all__ = ["BACKENDS", "upstream_for"]  # defined in tests/support/backends.py

# Property tests are deterministic: the same examples on every run and machine, and no
# example database replaying what an earlier run on this machine happened to find. No
# per-example deadline either: it is a timing assertion, which fails a correct property on a
# loaded machine (speed is measured in bench/, not asserted in tests).
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
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
# Every test that starts or uses real Kafka is marked ``kafka`` (and ``integration``) at
# collection, so ``-m kafka`` selects exactly them (see ``_real_kafka``).  When a test
# fails, the logs of every cluster it used (any KafkaCluster, these or a module's own) are
# kept under var/kafka-logs/<cluster>-<time>/ (see ``_keep_logs``).

KAFKA_FIXTURES = {"kafka": ("4", 1), "kafka3": ("4", 3), "kafka39": ("3.9", 1)}
"""fixture name -> (Kafka line, brokers)."""
KEPT_LOGS = Path(__file__).resolve().parent.parent / "var" / "kafka-logs"
"""Where the logs of a cluster a failing test used are kept."""

_kafka_started: list[str] = []
_kafka_outcomes: dict[str, str] = {}
"""node id -> outcome of every test marked kafka (for the closing summary)."""


def _kafka_cluster(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    version, brokers = KAFKA_FIXTURES[name]
    workdir = tmp_path_factory.mktemp(name)
    cluster = KafkaCluster(brokers, workdir=workdir, version=version, name=name).start()
    _kafka_started.append(
        f"{name}: Apache Kafka {cluster.version}, {brokers} broker(s), "
        f"started in {cluster.start_seconds:.1f} s"
    )
    try:
        yield cluster
    finally:
        cluster.stop()  # copies the logs to cluster.keep_logs_in if a test failed
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


_CALLS = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


@functools.cache
def _fixture_starts_kafka(func: Callable[..., Any]) -> bool:
    """Whether a fixture function yields or constructs a KafkaCluster (a module's own
    cluster, e.g. ``KafkaCluster(3, config=...)``): its return annotation names
    KafkaCluster, or its source calls KafkaCluster or a subclass of it."""
    func = inspect.unwrap(func)
    returns = inspect.signature(func).return_annotation
    if "KafkaCluster" in (returns if isinstance(returns, str) else repr(returns)):
        return True
    try:
        called = set(_CALLS.findall(inspect.getsource(func)))
    except (OSError, TypeError):
        return False
    scope = getattr(func, "__globals__", {})
    return "KafkaCluster" in called or any(
        isinstance(scope.get(name), type) and issubclass(scope[name], KafkaCluster)
        for name in called
    )


def _real_kafka(item: pytest.Item) -> set[str]:
    """The real-Kafka fixtures and backend parameters a test uses (empty: none).

    - a session fixture of KAFKA_FIXTURES among the test's fixtures (directly or through
      other fixtures);
    - a parameter naming one of them (a backend parameter, ``upstream_for``);
    - a module's own fixture that yields or constructs a KafkaCluster, unless the fixture
      is parametrised: then its parameter decides (``"devbroker"`` starts no Kafka).
    """
    names = set(getattr(item, "fixturenames", ())) & set(KAFKA_FIXTURES)
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names |= {v for v in callspec.params.values() if isinstance(v, str) and v in KAFKA_FIXTURES}
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in info.name2fixturedefs.items() if info is not None else ():
        fixturedef = defs[-1]  # the one this test gets (the closest override)
        if fixturedef.params is None and _fixture_starts_kafka(fixturedef.func):
            names.add(name)
    return names


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _real_kafka(item):
            item.add_marker(pytest.mark.kafka)
            item.add_marker(pytest.mark.integration)


def _keep_logs(item: pytest.Item) -> None:
    """Have every cluster the failing *item* used keep its logs.

    The clusters among the test's fixture values (``support.kafka.clusters_in``); for a
    test marked kafka where none is found (a fixture that failed before it returned),
    every cluster running now.  A cluster's logs go to KEPT_LOGS/<name>-<time>/ once, when
    it stops (``KafkaCluster.stop``; at once if it has stopped already), however many of
    its tests failed.
    """
    used = clusters_in(getattr(item, "funcargs", {}).values())
    if not used and item.get_closest_marker("kafka") is not None:
        used = running_clusters()
    running = running_clusters()
    for cluster in used:
        if cluster.keep_logs_in is not None:
            continue
        cluster.keep_logs_in = KEPT_LOGS / f"{cluster.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if not any(c is cluster for c in running):  # stopped already: keep them now
            cluster.copy_logs(cluster.keep_logs_in)
        _kafka_started.append(
            f"{cluster.name}: {item.nodeid} failed; broker logs kept in {cluster.keep_logs_in}"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        _keep_logs(item)
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
