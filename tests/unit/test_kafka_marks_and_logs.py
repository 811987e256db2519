"""The test run's real-Kafka bookkeeping (tests/conftest.py), without starting Kafka.

- ``-m kafka`` selects exactly the tests that start or use real Kafka: the session
  fixtures, a backend parameter naming one, a module's own fixture that yields or
  constructs a ``KafkaCluster`` (directly or through other fixtures), but not the
  ``"devbroker"`` side of a parametrised fixture nor a test that uses none.
- A failing test keeps the logs of every cluster it used, wherever the cluster was made,
  and only those; the closing summary counts the tests that ran against real Kafka.

The first two cases run pytest in a subprocess on a throwaway test directory with a copy
of tests/conftest.py and tests/support; its clusters are ``KafkaCluster`` with the JVM
replaced (no storage tool, no broker process), over a fake jar cache.  The last checks
``clusters_in``, how the failure hook finds the clusters among a test's fixture values.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from support.kafka import KafkaCluster, clusters_in, running_clusters

TESTS = Path(__file__).resolve().parents[1]
TIMEOUT = 120.0

PYTEST_INI = """\
[pytest]
addopts = --strict-markers -p no:cacheprovider
markers =
    integration: uses real client libraries or processes over loopback
    slow: takes more than a few seconds
    kafka: runs against real Apache Kafka (tests/support/kafka.py)
"""

NO_JVM = '''
from support.kafka import KafkaCluster


class NoJvm(KafkaCluster):
    """A KafkaCluster whose nodes are files only: no storage tool, no broker process."""

    def _storage(self, *args: str) -> str:
        return "fake-cluster-id\\n"

    def _launch(self, node) -> None:
        (node.dir / "server.log").write_text(f"node {node.node_id} says hello\\n")

    def wait_ready(self, timeout: float = 0.0) -> None:
        pass
'''

MARK_DUMP = """
import json


def pytest_collection_finish(session):
    marks = {
        item.nodeid.split("::", 1)[1]: sorted(
            {m.name for m in item.iter_markers()} & {"kafka", "integration"}
        )
        for item in session.items
    }
    with open("marks.json", "w") as out:
        json.dump(marks, out)
"""

MARKS = """
import pytest
from collections.abc import Iterator
from support.kafka import KafkaCluster


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory) -> Iterator[KafkaCluster]:
    raise AssertionError("never set up: collection only")


@pytest.fixture
def constructs(tmp_path):
    cluster = KafkaCluster(1, workdir=tmp_path)
    yield cluster


@pytest.fixture
def wraps(own_cluster):
    return own_cluster


@pytest.fixture(params=["devbroker", "kafka"])
def backend(request, tmp_path):
    if request.param == "devbroker":
        return None
    return KafkaCluster(1, workdir=tmp_path)


def test_plain(tmp_path): pass
def test_session(kafka39): pass
def test_own(own_cluster): pass
def test_constructs(constructs): pass
def test_wraps(wraps): pass
def test_backend(backend): pass
@pytest.mark.parametrize("upstream", ["devbroker", "kafka3"])
def test_param(upstream): pass
"""

KEEP = """
import types

import pytest
from nojvm import NoJvm


@pytest.fixture(scope="module")
def used(tmp_path_factory):
    cluster = NoJvm(1, workdir=tmp_path_factory.mktemp("used")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def unused(tmp_path_factory):
    cluster = NoJvm(2, workdir=tmp_path_factory.mktemp("unused")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def stack(used):
    return types.SimpleNamespace(kafka=used)  # as a ProxyStack holds its upstream


def test_unused_passes(unused): pass
def test_used_passes(used): pass
def test_used_fails_through_a_stack(stack):
    assert False, "deliberate: 'unused' is running, but this test did not use it"
def test_other_fails(stack):
    assert False, "deliberate: the same cluster again, its logs are kept once"
"""


def run_pytest(tmp_path: Path, modules: dict[str, str], *args: str) -> tuple[int, str, Path]:
    """pytest on a throwaway tests/ with *modules*; (exit code, output, repository dir)."""
    repo = tmp_path / "repo"
    tests = repo / "tests"
    tests.mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    (tests / "support").symlink_to(TESTS / "support")
    (repo / "pytest.ini").write_text(PYTEST_INI)
    (tests / "nojvm.py").write_text(NO_JVM)
    (tests / "markdump.py").write_text(MARK_DUMP)
    for name, text in modules.items():
        (tests / name).write_text(textwrap.dedent(text))
    lib = tmp_path / "cache" / "jvm" / "kafka-4" / "lib"
    lib.mkdir(parents=True)
    (lib / "kafka_2.13-4.4.0.jar").write_bytes(b"")
    env = {
        **os.environ,
        "KAFKA_FETCH_PROXY_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": str(tests),  # for ``-p markdump``
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args, "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, repo


def test_kafka_marks_exactly_the_tests_that_use_real_kafka(tmp_path: Path) -> None:
    code, out, repo = run_pytest(
        tmp_path, {"test_marks.py": MARKS}, "--collect-only", "-p", "markdump"
    )
    assert code == 0, out
    marks = json.loads((repo / "marks.json").read_text())
    kafka = ["integration", "kafka"]
    assert marks == {
        "test_plain": [],
        "test_session": kafka,
        "test_own": kafka,
        "test_constructs": kafka,
        "test_wraps": kafka,
        "test_backend[devbroker]": [],
        "test_backend[kafka]": kafka,
        "test_param[devbroker]": [],
        "test_param[kafka3]": kafka,
    }


def test_a_failing_test_keeps_the_logs_of_the_clusters_it_used(tmp_path: Path) -> None:
    code, out, repo = run_pytest(tmp_path, {"test_keep.py": KEEP})
    assert code == 1, out
    kept = repo / "var" / "kafka-logs"
    dirs = [d.name for d in kept.iterdir()]
    assert len(dirs) == 1 and re.fullmatch(r"used0-\d{8}-\d{6}", dirs[0]), dirs
    used = kept / dirs[0]
    assert sorted(f.name for f in used.iterdir()) == [
        "node-1-server.log",
        "node-1-server.properties",
    ]
    assert (used / "node-1-server.log").read_text() == "node 1 says hello\n"
    assert "node.id=1" in (used / "node-1-server.properties").read_text()
    assert (
        "real Kafka: used0: tests/test_keep.py::test_used_fails_through_a_stack failed; "
        f"broker logs kept in {used}"
    ) in out, out
    assert "test_other_fails failed;" not in out  # kept once, named by the first failure
    assert "real Kafka: 4 tests ran against real Apache Kafka (-m kafka): 2 passed, 2 failed" in (
        out
    ), out


def test_clusters_in_finds_clusters_behind_other_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "cache" / "jvm" / "kafka-4" / "lib"
    lib.mkdir(parents=True)
    (lib / "kafka_2.13-4.4.0.jar").write_bytes(b"")
    monkeypatch.setenv("KAFKA_FETCH_PROXY_CACHE", str(tmp_path / "cache"))
    a = KafkaCluster(1, workdir=tmp_path / "a")
    b = KafkaCluster(1, workdir=tmp_path / "b")
    c = KafkaCluster(1, workdir=tmp_path / "c")
    assert a.name == "a"
    stack = types.SimpleNamespace(kafka=a, other=None)
    pair = (types.SimpleNamespace(create=b.create_topic), {"x": stack})
    assert clusters_in([stack]) == [a]
    assert clusters_in(pair) == [b, a]
    assert clusters_in([a, a, stack]) == [a]  # each once
    deep = types.SimpleNamespace(inner=types.SimpleNamespace(inner=types.SimpleNamespace(kafka=c)))
    assert clusters_in([deep]) == []  # three steps away: beyond the default depth
    assert clusters_in([deep], depth=3) == [c]
    assert clusters_in([1, "kafka", None, os]) == []
    assert not any(x in running_clusters() for x in (a, b, c))  # never started
