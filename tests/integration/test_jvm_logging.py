"""The JVM programs the tests run leave a log to read when a test fails.

Each broker line writes its ``server.log`` (its resolved jars include an slf4j binding:
log4j2 for Kafka 4, reload4j for 3.9, as their distributions ship), and the Java test
client prints its library's log on stderr (slf4j-simple, bound to the slf4j-api that
kafka-clients brings).  Without a binding slf4j falls back to its no-op logger and
prints only a warning about it, and the log of a failing run is lost.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from support import clients
from support.kafka import KafkaCluster
from support.loopback import free_port

pytestmark = pytest.mark.integration

NO_BINDING = ("SLF4J: Failed to load class", "SLF4J: No SLF4J providers", "NOP logger")
"""What slf4j prints when it has no binding (1.7: StaticLoggerBinder; 2.x: providers)."""
TIMEOUT = 60.0


@pytest.mark.parametrize("line", ["kafka", "kafka39"])
def test_every_broker_line_writes_its_server_log(request: pytest.FixtureRequest, line: str) -> None:
    cluster = request.getfixturevalue(line)
    assert isinstance(cluster, KafkaCluster)
    for node in cluster.nodes.values():
        log = node.log.read_text(errors="replace")
        assert f"Kafka version: {cluster.version}" in log, node.tail()
        assert "Kafka Server started" in log, node.tail()
        stdout = (node.dir / "stdout.log").read_text(errors="replace")
        assert not any(s in stdout for s in NO_BINDING), stdout[-2000:]


def test_the_java_client_logs_on_stderr() -> None:
    """A consumer whose bootstrap address does not answer: kafka-clients logs its failed
    connections (WARN, the level the tests run it at) through slf4j-simple on stderr."""
    port = free_port()  # nothing listens there
    args = ["--bootstrap", f"127.0.0.1:{port}", "--client-id", "logcheck", "--timeout", "3"]
    proc = subprocess.Popen(
        [*clients.java_command(), *args, clients.assign("nosuch", 1, 1)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:  # overran (or interrupted): stop it by its pid
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
    stderr = err.decode(errors="replace")
    assert proc.returncode != 0, "the client reached a broker where none listens"
    assert "WARN org.apache.kafka.clients.NetworkClient" in stderr, stderr[-3000:]
    assert f"127.0.0.1:{port}" in stderr, stderr[-3000:]
    assert not any(s in stderr for s in NO_BINDING), stderr[-3000:]
