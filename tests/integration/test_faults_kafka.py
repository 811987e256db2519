"""Faults under continuous production, with real clients, through the proxy, against real Kafka.

Each fault runs a fresh topic of 6 partitions (replication factor 3) and a
``tests.support.verifier.Verifier``: one idempotent confluent-kafka producer
(acks=all) and consumers through the proxy, one assigning every partition
(exactly once, in order) and a group of two auto-committing members
(at-least-once, no gap).  The module starts its own 3-node KRaft cluster, since
faults change it, configured so that each fault does what it says:

``broker.session.timeout.ms=6000``, ``broker.heartbeat.interval.ms=500``
    a broker stopped for 4 s keeps its leaderships (the responses are late, the
    broker is not gone); one stopped until the controller fences it loses them.
``max.incremental.fetch.session.cache.slots=8``
    Kafka shards the cache in 8: one fetch session per shard on each broker, so
    consumers through the proxy compete with the followers' (privileged)
    sessions, which evict theirs (every fault runs with this small cache).

The clients' request timeout is 3 s (``verifier.CLIENT_TIMEOUT_MS``).  Each
fault's report (produced, acknowledged, received, lost, duplicated, what the
proxy counted) is printed and written to ``var/faults/<fault>.json``;
``var/faults/summary.json`` collects them for RELIABILITY.md, and the run ends with
a table of them (``verifier.summary_table``, printed by ``tests/conftest.py``).  The long run:
``KAFKA_FETCH_PROXY_FAULT_RECORDS=50000`` (records per fault, default 1500) and
``KAFKA_FETCH_PROXY_FAULT_RATE`` (records a second, default 150).

The last two tests stop a ``kafka-fetch-proxy run`` process with SIGTERM: the
listeners close first, a request in flight is answered, and the process exits 0
within ``shutdown_grace_seconds`` (or cuts what is left when the grace runs out).
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import verifier
from support.fetch_messages import fetch_body, partition_body
from support.kafka import KafkaCluster
from support.loopback import free_port
from support.procs import CLI, REPO, read_lines
from support.rawclient import PeerClosed, RawClient, make_request
from support.stack import ProxyStack

from proxy.observe.metrics import Metrics

# ``kafka`` comes from tests/conftest.py for the tests that use ``cluster`` (the dev cluster
# test below runs no Kafka).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6
BROKER_CONFIG = {
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "500",
    "max.incremental.fetch.session.cache.slots": "8",
}
SHORT_PAUSE_S = 4.0
"""Longer than the clients' 3 s request timeout, shorter than the 6 s broker session."""
FENCE_TIMEOUT_S = 30.0
OUT = REPO / "var" / "faults"
PROXY_SETTINGS: dict[str, Any] = {"connect_timeout_seconds": 10}
RESULTS = verifier.REPORTS
"""This run's reports (the closing table of the test run prints them)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    c = KafkaCluster(3, workdir=tmp_path_factory.mktemp("faults"), config=BROKER_CONFIG)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        if RESULTS:
            OUT.mkdir(parents=True, exist_ok=True)
            summary = {"kafka": c.version, "broker_config": BROKER_CONFIG, "faults": RESULTS}
            (OUT / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))


def _proxy_counts(metrics: Metrics) -> dict[str, float]:
    """The proxy's non-zero counters about connections and fetch sessions."""
    wanted = (
        "kafka_fetch_proxy_client_connections_closed_total",
        "kafka_fetch_proxy_broker_connections_closed_total",
        "kafka_fetch_proxy_broker_connect_failures_total",
        "kafka_fetch_proxy_fetch_session_resets_total",
        "kafka_fetch_proxy_fetch_session_evictions_total",
        "kafka_fetch_proxy_client_connections_accepted_total",
    )
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name in wanted and s.value:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name.removeprefix('kafka_fetch_proxy_')}{{{labels}}}"] = s.value
    return out


def _record(fault: str, staged: str, report: dict[str, Any], proxy: dict[str, Any]) -> None:
    report = {"fault": fault, "staged": staged, **report, "proxy": proxy}
    RESULTS[fault] = report
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{fault}.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    print(f"\n=== {fault}: {staged}\n{json.dumps(report, indent=2, sort_keys=True)}")
    verifier.check(report)


def _stack(cluster: KafkaCluster) -> tuple[ProxyStack, Metrics]:
    metrics = Metrics()
    return ProxyStack(PROXY_SETTINGS, upstream=cluster, metrics=metrics).start(), metrics


def _wait_leader_moves(cluster: KafkaCluster, topic: str, partition: int, old: int) -> float:
    """Until the controller has moved the partition's leadership off ``old``; seconds taken."""
    began = time.monotonic()
    while (leader := cluster.leader_of(topic, partition)) == old:
        assert time.monotonic() - began < FENCE_TIMEOUT_S, f"node {old} still leads"
        time.sleep(0.2)  # polling the controller's metadata, bounded above
    return round(time.monotonic() - began, 3) if leader != old else 0.0


# -- the faults under production -------------------------------------------------------


def test_leader_killed_and_restarted(cluster: KafkaCluster) -> None:
    stack, metrics = _stack(cluster)
    try:
        topic = stack.create_topic(PARTITIONS, prefix="killed")
        v = verifier.Verifier(stack.bootstrap, topic, PARTITIONS, name="leader-killed").start()
        v.wait_flowing()
        victim = cluster.leader_of(topic, 0)
        v.mark(f"node {victim} SIGKILLed")
        cluster.stop_broker(victim, kill=True)
        v.wait_progress()  # the other replicas lead now: records flow with the node down
        v.mark(f"node {victim} restarting")
        cluster.start_broker(victim)
        v.mark(f"node {victim} back")
        v.wait_progress()
        report = v.finish()
    finally:
        stack.stop()
    _record(
        "leader-killed",
        f"SIGKILL of node {victim} (leader of partition 0) mid-consumption, restarted",
        report,
        _proxy_counts(metrics),
    )


def test_broker_paused_past_client_timeout(cluster: KafkaCluster) -> None:
    stack, metrics = _stack(cluster)
    try:
        topic = stack.create_topic(PARTITIONS, prefix="paused")
        v = verifier.Verifier(stack.bootstrap, topic, PARTITIONS, name="broker-paused").start()
        v.wait_flowing()
        victim = cluster.leader_of(topic, 0)
        v.mark(f"node {victim} SIGSTOPped")
        cluster.pause_broker(victim)
        try:
            fenced_after = _wait_leader_moves(cluster, topic, 0, victim)
        finally:
            cluster.resume_broker(victim)
        v.mark(f"node {victim} SIGCONTed")
        v.wait_progress()
        report = v.finish()
    finally:
        stack.stop()
    report["paused_seconds"] = fenced_after
    _record(
        "broker-paused",
        f"SIGSTOP of node {victim} (leader of partition 0) until the controller fenced it"
        f" ({fenced_after:.1f} s, client request timeout"
        f" {verifier.CLIENT_TIMEOUT_MS / 1000:.0f} s), then SIGCONT",
        report,
        _proxy_counts(metrics),
    )


def _upstream_sessions(stack: ProxyStack) -> dict[str, int]:
    """Upstream fetch connections of the proxy with and without a broker session."""
    rows = stack.run_sync(stack.proxy.debug_sessions)["sessions"]
    fetching = [r for r in rows if r["partitions"] > 0]
    held = sum(1 for r in fetching if r["session_id"] != 0)
    return {"fetching": len(fetching), "with_session": held, "without": len(fetching) - held}


PATIENT_CLIENTS = {"socket.timeout.ms": 30_000, "request.timeout.ms": 30_000}
"""The cache-full case stages no delay, so its clients get a request timeout that no loaded
test machine reaches (``request.timeout.ms`` is the producer's; the consumers ignore it).
With the faults' 3 s (``verifier.CLIENT_TIMEOUT_MS``) it failed three times in loaded full
suite runs: the 13 librdkafka clients and the proxy share one process, and beside two other
test workers a new broker connection took 1-3 s to be relayed.  A consumer whose first
requests on a new connection (ApiVersions, ListOffsets) timed out closed it and started
again, and got no record in 60 s while the others consumed; librdkafka logs such timeouts
below the test's log level, so the runs showed only the connections' churn."""


def test_fetch_session_cache_full(cluster: KafkaCluster) -> None:
    """12 consumers through the proxy (12 upstream sessions per broker) against 8 slots.

    Kafka does not evict a consumer's session for another consumer's of the same
    size (nor any younger than 120 s): the sessions that find their shard taken
    are refused (session id 0), and the proxy fetches those in full."""
    stack, metrics = _stack(cluster)
    try:
        topic = stack.create_topic(PARTITIONS, prefix="cachefull")
        v = verifier.Verifier(
            stack.bootstrap,
            topic,
            PARTITIONS,
            assign=10,
            group=2,
            name="session-cache-full",
            config=PATIENT_CLIENTS,
        ).start()
        v.wait_flowing()
        v.wait_progress()  # every upstream connection has had its answer to a full fetch
        v.mark("every consumer fetching")
        sessions = _upstream_sessions(stack)
        report = v.finish()
    finally:
        stack.stop()
    _record(
        "session-cache-full",
        "12 consumers (10 assign, 2 group) through the proxy; Kafka's session cache of 8 slots"
        " (8 shards of 1) per broker, followers' sessions included",
        report,
        {**_proxy_counts(metrics), "upstream_sessions": sessions},
    )
    assert sessions["without"] > 0, f"Kafka refused no session: {sessions}"


EVICTIONS = 3


def test_every_fetch_session_evicted_dev_cluster() -> None:
    """Every upstream session evicted, three times, under production (the dev cluster's
    hook: Kafka evicts a consumer's session only for a follower's or a bigger one)."""
    metrics = Metrics()
    stack = ProxyStack(PROXY_SETTINGS, metrics=metrics).start()
    try:
        topic = stack.create_topic(PARTITIONS, prefix="evicted")
        v = verifier.Verifier(stack.bootstrap, topic, PARTITIONS, name="sessions-evicted").start()
        v.wait_flowing()
        for n in range(1, EVICTIONS + 1):
            v.mark(f"every fetch session evicted ({n})")
            stack.evict_upstream_sessions()
            v.wait_progress()
        report = v.finish()
    finally:
        stack.stop()
    counts = _proxy_counts(metrics)
    _record(
        "sessions-evicted",
        f"every fetch session on every node of the dev cluster evicted {EVICTIONS} times"
        " (DevCluster.evict_fetch_sessions) while producing and consuming",
        report,
        counts,
    )
    not_found = sum(
        n for k, n in counts.items() if "session_id_not_found" in k and "side=upstream" in k
    )
    assert not_found >= EVICTIONS, f"the proxy met fewer evictions than staged: {counts}"


def test_responses_delayed_past_client_timeout(cluster: KafkaCluster) -> None:
    """SIGSTOP for 4 s: every response of the node arrives after the clients' 3 s timeout.

    Real Kafka, not the dev cluster's delay hook: a stopped broker answers every
    request it had read once it runs again (late), the proxy has no request
    timeout of its own (it keeps its upstream connections), and 4 s is below the
    6 s broker session, so the controller moves nothing: a delay, not a failure."""
    stack, metrics = _stack(cluster)
    try:
        topic = stack.create_topic(PARTITIONS, prefix="delayed")
        v = verifier.Verifier(stack.bootstrap, topic, PARTITIONS, name="responses-delayed").start()
        v.wait_flowing()
        victim = cluster.leader_of(topic, 0)
        v.mark(f"node {victim} SIGSTOPped")
        cluster.pause_broker(victim)
        try:
            time.sleep(SHORT_PAUSE_S)  # the fault itself: this long without any answer
        finally:
            cluster.resume_broker(victim)
        v.mark(f"node {victim} SIGCONTed")
        v.wait_progress()
        leader_after = cluster.leader_of(topic, 0)
        report = v.finish()
    finally:
        stack.stop()
    report["leadership_moved"] = leader_after != victim
    _record(
        "responses-delayed",
        f"SIGSTOP of node {victim} (leader of partition 0) for {SHORT_PAUSE_S:.0f} s: longer"
        f" than the clients' {verifier.CLIENT_TIMEOUT_MS / 1000:.0f} s timeout, shorter than"
        " the 6 s broker session (no failover) and the proxy's timeouts",
        report,
        _proxy_counts(metrics),
    )
    assert not report["leadership_moved"], "the pause turned into a failover"


def _proxy_args(
    cluster: KafkaCluster, listen: int, ports: dict[int, int], *extra: str
) -> list[str]:
    return [
        *CLI,
        "run",
        "--upstream",
        cluster.bootstrap,
        "--listen",
        f"127.0.0.1:{listen}",
        "--broker-ports",
        ",".join(f"{n}={p}" for n, p in sorted(ports.items())),
        "--metrics-listen",
        "127.0.0.1:0",
        *extra,
    ]


class ProxyProcess:
    """``kafka-fetch-proxy run`` with its JSON log lines readable as events."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.log: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.lines = read_lines(self.proc, ("bootstrap", "metrics"), 30)
        except BaseException:
            self.kill()
            raise

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            try:
                event = json.loads(raw)
            except ValueError:
                event = {"event": "text", "line": raw.decode(errors="replace")}
            self.log.append(event)
            self.events.put(event)

    def wait_event(self, name: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {name} {fields} log line within {timeout} s")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event.get("event") == name and all(event.get(k) == v for k, v in fields.items()):
                return event

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def test_proxy_killed_and_restarted(cluster: KafkaCluster) -> None:
    listen = free_port()
    ports = {n: free_port() for n in cluster.nodes}
    args = _proxy_args(cluster, listen, ports)
    first = ProxyProcess(args)
    second: ProxyProcess | None = None
    try:
        topic = cluster.new_topic(PARTITIONS, prefix="restarted")
        v = verifier.Verifier(
            f"127.0.0.1:{listen}", topic, PARTITIONS, name="proxy-restarted"
        ).start()
        v.wait_flowing()
        v.mark("proxy SIGKILLed")
        first.kill()
        second = ProxyProcess(args)
        v.mark("proxy started again")
        v.wait_progress()
        report = v.finish()
    finally:
        first.kill()
        if second is not None:
            second.kill()
    _record(
        "proxy-restarted",
        "the kafka-fetch-proxy process SIGKILLed mid-run and started again on the same ports",
        report,
        {
            "warnings_after_restart": sorted(
                {
                    str(e.get("event"))
                    for e in (second.log if second else [])
                    if e.get("level") == "warning"
                }
            )
        },
    )


# -- SIGTERM: drain within the grace period --------------------------------------------


def _fetch_request(topic: str, max_wait_ms: int) -> Any:
    topic_body = {"topic": topic, "partitions": [partition_body(0, 0, 1048576)]}
    return make_request(1, 12, fetch_body([topic_body], max_wait=max_wait_ms, max_bytes=1048576))


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _long_poll(cluster: KafkaCluster, grace: float, max_wait_ms: int) -> dict[str, Any]:
    """A proxy process; a long-poll Fetch in flight and an idle connection; then SIGTERM."""
    topic = cluster.new_topic(1, prefix="drain")
    leader = cluster.leader_of(topic, 0)
    listen = free_port()
    ports = {n: free_port() for n in cluster.nodes}
    proxy = ProxyProcess(
        _proxy_args(
            cluster,
            listen,
            ports,
            "--shutdown-grace-seconds",
            str(grace),
            # The long poll must really wait upstream for max_wait_ms: without this the
            # proxy's cap (max_upstream_wait_ms, 500 ms) answers it before any grace ends.
            "--max-upstream-wait-ms",
            str(max_wait_ms),
            "--log-level",
            "debug",
        )
    )
    deadline = time.monotonic() + 60
    try:
        proxy.wait_event("upstream_discovered")  # the broker listeners are bound
        idle = RawClient(("127.0.0.1", listen), deadline=deadline)
        idle.call(18, 3, {"client_software_name": "idle", "client_software_version": "1"})
        busy = RawClient(("127.0.0.1", ports[leader]), deadline=deadline)
        cid = busy.send(_fetch_request(topic, max_wait_ms))
        proxy.wait_event("request", api_key=1, correlation_id=cid)  # read by the proxy
        sent_at = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        proxy.wait_event("listeners_closed")
        out: dict[str, Any] = {
            "refused": [_refused(listen), *(_refused(p) for p in ports.values())],
            "idle_closed": idle.is_closed_by_peer(),
        }
        try:
            response = busy.receive(1, 12, cid)
            out["answered_after"] = time.monotonic() - sent_at
            out["error_codes"] = [
                int(p.error_code) for t in response.responses for p in t.partitions
            ]
        except (PeerClosed, ConnectionResetError):
            out["cut_after"] = time.monotonic() - sent_at
        out["exit_code"] = proxy.proc.wait(grace + 10)
        out["exited_after"] = time.monotonic() - sent_at
        proxy.kill()
        out["events"] = [e.get("event") for e in proxy.log]
        out["log"] = proxy.log
        return out
    finally:
        proxy.kill()


def test_sigterm_drains_in_flight_requests(cluster: KafkaCluster) -> None:
    grace = 10.0
    out = _long_poll(cluster, grace, max_wait_ms=3000)
    assert out["refused"] == [True] * 4, "a listener still accepted after SIGTERM"
    assert out["idle_closed"]
    assert "answered_after" in out, f"the long poll was cut: {out['events']}"
    assert out["error_codes"] == [0]
    assert out["exit_code"] == 0
    assert out["answered_after"] <= out["exited_after"] < grace
    events = out["events"]
    assert events.index("shutdown") < events.index("listeners_closed") < events.index("drained")
    assert "shutdown_grace_expired" not in events
    RESULTS["sigterm-drain"] = {
        "fault": "sigterm-drain",
        "staged": "SIGTERM with a 3 s long-poll Fetch in flight and an idle connection",
        "answered_after_seconds": round(out["answered_after"], 3),
        "exited_after_seconds": round(out["exited_after"], 3),
        "grace_seconds": grace,
        "exit_code": out["exit_code"],
    }


def test_sigterm_cuts_what_outlasts_the_grace_period(cluster: KafkaCluster) -> None:
    grace = 1.0
    out = _long_poll(cluster, grace, max_wait_ms=20000)
    assert out["refused"] == [True] * 4
    assert "cut_after" in out, "a 20 s long poll was answered within a 1 s grace period"
    assert out["exit_code"] == 0
    assert grace <= out["exited_after"] < grace + 5
    expired = next(e for e in out["log"] if e.get("event") == "shutdown_grace_expired")
    assert expired["in_flight"] == 1
    RESULTS["sigterm-grace-expired"] = {
        "fault": "sigterm-grace-expired",
        "staged": "SIGTERM with a 20 s long-poll Fetch in flight, grace 1 s",
        "cut_after_seconds": round(out["cut_after"], 3),
        "exited_after_seconds": round(out["exited_after"], 3),
        "exit_code": out["exit_code"],
    }
