"""Shared test configuration."""

# -- dev cluster fixtures (tests/support/cluster.py) ---------------------------------

import functools
import importlib
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings
from support import verifier
from support.backends import BACKENDS, upstream_for
from support.cluster import ThreadedCluster
from support.kafka import KafkaCluster, clusters_in, running_clusters

__all__ = ["BACKENDS", "upstream_for"]  # defined in tests/support/backends.py

# -- bench/ (a directory of the repository, not an installed package) ------------------


@pytest.fixture
def bench_module(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Imports ``bench.<name>`` from the repository (its directory put on the path)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    return lambda name: importlib.import_module(f"bench.{name}")


# -- Spark (pipeline/) ------------------------------------------------------------------
#
# Every Spark JVM a test starts (PySpark's driver, a standalone cluster's executors) reads
# tests/support/spark-conf/spark-defaults.conf: lean JIT and GC options, as the brokers'.
# A driver JVM is shared by the tests of one worker that leave it running (the fleet
# report's, xdist group ``spark``); it is stopped by its pid when the worker's session ends.
SPARK_CONF_DIR = Path(__file__).resolve().parent / "support" / "spark-conf"
os.environ.setdefault("SPARK_CONF_DIR", str(SPARK_CONF_DIR))


def _stop_spark_driver() -> None:
    """Stop the driver JVM PySpark started in this process, if any (by its pid)."""
    if "pyspark" in sys.modules:
        from support.spark_cluster import stop_driver

        stop_driver()


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


# -- parallel runs (pytest-xdist; scripts/test) ---------------------------------------
#
# scripts/test runs the suite in two pytest invocations:
#
# 1. ``-n 3 --dist loadgroup -m "not alone"``: three workers.  Session and module fixtures
#    are per worker, so every test that uses one of the session clusters gets that
#    cluster's ``xdist_group`` (each cluster starts on one worker only), and every test
#    that uses a module-scoped fixture (a module's own cluster, a Spark session, a bench
#    run, a parametrised backend) gets its module's group (the fixture is built once).
#    The groups are handed out longest first (SLOW_FIRST, from the durations of a full
#    run: a group that starts late would end the run alone), and the single tests fill in.
# 2. ``-m alone``: the tests whose assertions are measurements (the proxy's RSS, whether it
#    keeps serving its other clients under attack or under load, this process's
#    allocations with tracemalloc), one at a time with nothing else of the suite running.
#
# A plain ``pytest`` (no ``-n``) runs everything in one process in collection order, as
# before: the groups are only marks then.
#
# xdist's own loadgroup reads ``xdist_group`` marks into node id suffixes, which pytest 9.2
# no longer takes (xdist 3.8 sets ``item._nodeid``; every test became its own group and each
# worker started every cluster).  So the groups travel beside the node ids instead: each
# worker writes {node id: group} to the file named by GROUPS_ENV, and ``--dist loadgroup``
# uses GroupScheduling, which reads that file for its work units.

ALONE = (
    "tests/integration/test_hostile_clients.py::",
    "tests/integration/test_load_short.py::",
    "tests/integration/test_shaping_budget_clients.py::test_fifty_consumers_under_a_64_mib_budget",
    # 600 loopback connections in a burst: beside other tests, their ephemeral ports can take
    # one a cluster just chose for a broker (a Kafka node once failed to bind 127.0.0.1:53513)
    "tests/integration/test_proxy_cli.py::test_sigterm_while_hundreds_of_connections_close",
)
"""Node id prefixes of the tests marked ``alone`` (see above); so is every test whose
function starts ``tracemalloc``: it traces every thread of the process, xdist's too."""

SLOW_FIRST = (
    "kafka",
    "kafka#2",
    "tests/integration/test_sasl_reauth_kafka.py",  # two minutes, mostly waiting: early
    "spark",
    "tests/integration/test_bench_smoke.py",
    "kafka3",
    "tests/integration/test_rack_aware_kafka.py",
    "tests/integration/test_faults_kafka.py",
    "kafka39",
    "tests/integration/test_security_kafka.py",
    "tests/unit/test_readers.py",
    "tests/integration/",
)
"""Groups and node id prefixes, longest work first: the order xdist hands them out in.
The rest keeps collection order after them."""

_MODULE_SCOPES = ("module", "package", "class")

KAFKA_SECOND_WORKER = (
    "tests/integration/test_pipeline_spark.py::",
    "tests/integration/test_differential.py::",
    "tests/integration/test_shaping_fairness_clients.py::",
    "tests/integration/test_fetch_sessions_clients.py::",
    "tests/integration/test_fetch_ahead_clients.py::",
)
"""The tests of the ``kafka`` cluster that go in group ``kafka#2``: the ``kafka`` group was
the suite's longest, all on one worker, so these modules (a Spark job, module clusters
of their own, long client runs) get a second worker and a second single-node cluster
(some 6 s to start) instead of waiting behind the others."""


@functools.cache
def _module_mentions(path: str, text: str) -> bool:
    """Whether the source file *path* contains *text* (read once per file)."""
    try:
        return text in Path(path).read_text()
    except OSError:
        return True  # unknown: let the caller look at the function itself


def _traces_allocations(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    if function is None:
        return False
    # Most modules never start tracemalloc: one look at the file instead of the source of
    # each of their tests (inspect.getsource for 3,300 tests was 5 s of every collection).
    filename = getattr(getattr(function, "__code__", None), "co_filename", None)
    if filename is not None and not _module_mentions(filename, "tracemalloc.start("):
        return False
    try:
        return "tracemalloc.start(" in inspect.getsource(function)
    except (OSError, TypeError):
        return False


def _xdist_group(item: pytest.Item, clusters: set[str]) -> str | None:
    """The worker group of *item*: the session cluster it uses, else its module if it uses
    a module-scoped fixture, else none (xdist places it on any worker)."""
    session = sorted(clusters & set(KAFKA_FIXTURES))
    if session == ["kafka"] and item.nodeid.startswith(KAFKA_SECOND_WORKER):
        return "kafka#2"
    if session:
        return "+".join(session)
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        if defs[-1].scope in _MODULE_SCOPES:
            return item.nodeid.split("::", 1)[0]
    return None


def _slow_rank(item: pytest.Item) -> int:
    mark = item.get_closest_marker("xdist_group")
    group = mark.args[0] if mark is not None else None
    path = item.nodeid.split("::", 1)[0]
    for rank, key in enumerate(SLOW_FIRST):
        if group == key or ((group is None or "/" in group) and path.startswith(key)):
            return rank
    return len(SLOW_FIRST)


class _SlowFirst:
    """On xdist's workers only: a plain run keeps each module's tests together."""

    @pytest.hookimpl(trylast=True)  # after pytest's own fixture-driven reordering
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if _worker(config) is not None:
            items[:] = sorted(items, key=_slow_rank)  # stable: keeps order within a rank


GROUPS_ENV = "PYTEST_WORKER_GROUPS_DIR"
"""Set by the xdist controller: the directory where each worker writes <worker>.json.  Not
KAFKA_FETCH_PROXY_*: every proxy a test starts inherits it, and would refuse it."""


def _worker(config: pytest.Config) -> str | None:
    """This process's xdist worker id (gw0, gw1, ...), None outside xdist's workers (a pytest
    a test starts in a subprocess inherits PYTEST_XDIST_WORKER, not ``workerinput``)."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


def _write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder, worker = os.environ.get(GROUPS_ENV), _worker(config)
    if folder is None or worker is None:
        return
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0])
    tmp = Path(folder) / f".{worker}.json"
    tmp.write_text(json.dumps(groups))
    tmp.replace(Path(folder) / f"{worker}.json")  # whole or absent for the controller


class _Controller:
    """The xdist controller's side of the groups (see "parallel runs" above)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.spent: dict[str, float] = {}
        """node id -> seconds its setup, call and teardown took"""
        self.worker: dict[str, str] = {}
        """node id -> the worker that ran it"""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.spent[report.nodeid] = self.spent.get(report.nodeid, 0.0) + report.duration
        node = getattr(report, "node", None)  # xdist's WorkerController
        gateway = getattr(node, "gateway", None)
        if gateway is not None:
            self.worker[report.nodeid] = str(gateway.id)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Each worker's groups, longest first, with the seconds their tests took: the
        data for SLOW_FIRST, and where the run's longest worker spent its time."""
        written = sorted(self.folder.glob("gw*.json"))
        groups: dict[str, str] = json.loads(written[0].read_text()) if written else {}
        per: dict[tuple[str, str], list[float]] = {}
        for nodeid, seconds in self.spent.items():
            key = (self.worker.get(nodeid, "?"), groups.get(nodeid, "(no group)"))
            per.setdefault(key, []).append(seconds)
        totals: dict[str, float] = {}
        for (worker, _), times in per.items():
            totals[worker] = totals.get(worker, 0.0) + sum(times)
        for worker in sorted(totals):
            terminalreporter.write_line(f"worker {worker}: tests took {totals[worker]:.0f} s")
            mine = sorted(
                ((sum(t), len(t), g) for (w, g), t in per.items() if w == worker), reverse=True
            )
            for seconds, count, group in mine[:8]:
                terminalreporter.write_line(f"  {seconds:7.1f} s {count:5d} tests  {group}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadGroupScheduling

        folder = self.folder

        class GroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
            """Work units: the groups the workers wrote, else each test alone; handed out
            in collection order (tests/conftest.py sorted it longest first)."""

            groups: dict[str, str] | None = None

            def schedule(self) -> None:
                if self.groups is None and self.collection_is_completed:
                    written = sorted(folder.glob("gw*.json"))
                    self.groups = json.loads(written[0].read_text()) if written else {}
                self.config.option.loadscopereorder = False
                super().schedule()

            def _split_scope(self, nodeid: str) -> str:
                group = (self.groups or {}).get(nodeid)
                return group if group is not None else str(super()._split_scope(nodeid))

        return GroupScheduling(config, log)

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    # Registered here (not only in pyproject.toml) so that a copy of this conftest under
    # another ini (tests/unit/test_kafka_marks_and_logs.py) keeps --strict-markers happy.
    config.addinivalue_line(
        "markers",
        "alone: asserts a memory or service measurement; scripts/test runs these after "
        "the parallel run, one at a time",
    )
    if not config.pluginmanager.has_plugin("xdist"):
        config.addinivalue_line("markers", "xdist_group(name): tests run on one xdist worker")
    config.pluginmanager.register(_SlowFirst(), "kafka-fetch-proxy-slow-first")
    if getattr(config.option, "numprocesses", None) and _worker(config) is None:
        folder = Path(tempfile.mkdtemp(prefix="kafka-fetch-proxy-groups-"))
        os.environ[GROUPS_ENV] = str(folder)  # the workers (started later) inherit it
        config.pluginmanager.register(_Controller(folder), "kafka-fetch-proxy-groups")


@pytest.hookimpl(tryfirst=True)  # the groups before xdist reads them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        clusters = _real_kafka(item)
        if clusters:
            item.add_marker(pytest.mark.kafka)
            item.add_marker(pytest.mark.integration)
        if item.nodeid.startswith(ALONE) or _traces_allocations(item):
            item.add_marker(pytest.mark.alone)
        group = _xdist_group(item, clusters)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    _write_groups(config, items)


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
        worker = _worker(item.config)  # gw0, gw1, ... under xdist
        name = cluster.name if worker is None else f"{cluster.name}-{worker}"
        cluster.keep_logs_in = KEPT_LOGS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if not any(c is cluster for c in running):  # stopped already: keep them now
            cluster.copy_logs(cluster.keep_logs_in)
        _kafka_started.append(
            f"{cluster.name}: {item.nodeid} failed; broker logs kept in {cluster.keep_logs_in}"
        )


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """On an xdist worker, stop each session cluster that the next test does not use.

    A worker runs a cluster's group in one stretch (``--dist loadgroup``, "parallel runs"
    above), so after it a running broker only idles until the worker's session ends (about
    2 CPU-seconds a minute per broker, measured).  pytest tears the fixture down as at the
    session's end (its dependents first) and sets it up again if a later test of this
    worker asks for it.  A plain run keeps every cluster to its end: there the tests of
    several clusters alternate in collection order.
    """
    result = yield
    if nextitem is None or _worker(item.config) is None:
        return result
    wanted = _real_kafka(nextitem)
    for name in KAFKA_FIXTURES:
        if name in wanted:
            continue
        for fixturedef in item.session._fixturemanager.getfixturedefs(name, item) or ():
            if fixturedef.scope == "session" and fixturedef.cached_result is not None:
                fixturedef.finish(item._request)  # type: ignore[attr-defined]
    return result


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_spark_driver()


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
