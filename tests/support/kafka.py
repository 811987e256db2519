"""Real Apache Kafka (KRaft mode) on loopback, for the tests and the benchmarks.

    cluster = KafkaCluster(brokers=3, workdir=tmp).start()
    cluster.create_topic("orders", 12)
    Consumer({"bootstrap.servers": cluster.bootstrap, ...})
    cluster.stop_broker(2); cluster.start_broker(2)
    cluster.stop()

The broker's jars come from ``scripts/setup --test`` (``scripts/resolve-jvm``), which
resolves ``org.apache.kafka:kafka_2.13`` from Maven Central into the cache
(``$KAFKA_FETCH_PROXY_CACHE``, default ``~/.cache/kafka-fetch-proxy``).  A missing cache,
JDK or broker is a set-up failure (:class:`SetupError`), never a skip.

Every node is a combined broker+controller; a 3-node cluster has a 3-voter quorum, so
one node can be stopped and restarted while the others keep serving.  Ports are chosen
at run time, storage is formatted fresh, and every process is stopped by its pid.
Each node's ``server.log`` stays in ``workdir``.

Every cluster is listed in :func:`running_clusters` from ``start()`` to ``stop()``, so the
test run can keep the logs of any cluster a failing test used, wherever it was created
(tests/conftest.py): it sets ``cluster.keep_logs_in``, and ``stop()`` copies each node's
``server.log``, ``stdout.log`` and ``server.properties`` there (:meth:`KafkaCluster.copy_logs`).
:func:`clusters_in` finds the clusters among a test's fixture values.

Racks are opt-in (``racks=("a", "b", "c")``, one per node): each node then runs with that
``broker.rack``; with ``config=RACK_AWARE`` a leader sends a consumer that names its rack
in Fetch v11+ to a replica in that rack (KIP-392, ``preferred_read_replica``)::

    cluster = KafkaCluster(3, workdir=tmp, racks=("a", "b", "c"), config=RACK_AWARE).start()
    cluster.node_in_rack("b")                                     # -> 2
    cluster.create_topic("orders", 6)                             # replication factor 3

Security is opt-in (``security=Security(...)``): every node then also serves a
``SECURE`` listener (SASL_SSL or SASL_PLAINTEXT) with SCRAM-SHA-512 and PLAIN, and the
cluster runs the StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``::

    ca = CertificateAuthority.create(tmp / "ca", "test-ca")      # tests/support/tls.py
    sec = Security({"alice": "alice-pw"}, keystore=ca.issue("broker", server=True).keystore,
                   truststore=ca.cert)
    cluster = KafkaCluster(1, workdir=tmp, security=sec).start()
    cluster.allow("alice", topic="orders", operations=("READ", "WRITE", "DESCRIBE"))
    cluster.secure_bootstrap                                      # the SECURE listeners

SCRAM credentials are created when storage is formatted (``kafka-storage format
--add-scram``), PLAIN users are in the listener's JAAS config, ACLs are created with
the Admin API.  The PLAINTEXT listener stays the internal one (inter-broker, the
controllers, this class's own admin client): its principal, User:ANONYMOUS, is a
super user, so only the SECURE listener is a client-facing, authorizing one.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
import types
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .loopback import free_port

VERSIONS = {"4": "kafka-4", "3.9": "kafka-3.9"}
"""Broker lines the tests can run: key -> artifact set in tests/jvm/."""

START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
JVM_OPTS = os.environ.get(
    "KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS",
    "-Xms128m -Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true",
).split()

TOOL_JVM_OPTS = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
"""A short-lived JVM of Kafka's (``kafka-storage format``, a command-line tool): the client
compiler and the serial collector, about a third less CPU than the JVM's defaults."""

_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.num.partitions": "5",
    "num.partitions": "1",
    "log.segment.bytes": str(64 * 1024 * 1024),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "2000",
}


LOG_FILES = ("server.log", "stdout.log", "server.properties")
"""What :meth:`KafkaCluster.copy_logs` keeps of each node."""

_running: dict[int, KafkaCluster] = {}
"""id -> every cluster between start() and stop(), in start order."""


def running_clusters() -> list[KafkaCluster]:
    """The clusters started and not stopped yet (wherever they were created)."""
    return list(_running.values())


def clusters_in(values: Iterable[object], depth: int = 2, limit: int = 5000) -> list[KafkaCluster]:
    """The clusters among *values* or reachable from them within *depth* steps.

    A step goes into a tuple, list, set or dict, an object's attributes, or a bound
    method's object: it finds the cluster behind a ``ProxyStack`` (``stack.kafka``), a
    pair of backends whose ``create`` is a cluster's method, and so on.  At most *limit*
    objects are looked at.
    """
    found: dict[int, KafkaCluster] = {}
    seen: set[int] = set()
    level = list(values)
    for step in range(depth + 1):
        following: list[object] = []
        for obj in level:
            if id(obj) in seen or len(seen) >= limit:
                continue
            seen.add(id(obj))
            if isinstance(obj, KafkaCluster):
                found.setdefault(id(obj), obj)
                continue
            if step == depth or isinstance(obj, str | bytes | bytearray | int | float | type):
                continue
            if isinstance(obj, tuple | list | set | frozenset):
                following.extend(obj)
            elif isinstance(obj, dict):
                following.extend(obj.values())
            elif isinstance(obj, types.MethodType):
                following.append(obj.__self__)
            elif hasattr(obj, "__dict__") and not callable(obj):  # no class, function, module
                if not isinstance(obj, types.ModuleType):
                    following.extend(vars(obj).values())
        level = following
    return list(found.values())


class SetupError(RuntimeError):
    """What the tests need was not installed: run ``scripts/setup --test``."""


# -- class archives (AppCDS) ------------------------------------------------------------
#
# A JVM spends most of its start loading and verifying classes: a broker about 4 CPU-s of
# its 6 s to ready, one of Kafka's tools about 1.5 CPU-s.  ``scripts/setup --test`` runs
# each once with ``-XX:ArchiveClassesAtExit`` (``python -m support.class_archives``); every
# later JVM of the same jars maps the classes that run loaded, already parsed and
# verified: about 40 % less CPU and time to start, measured (a broker 4.2 -> 2.5 CPU-s,
# ``kafka-storage format`` 1.8 -> 0.9, a tool 1.4-2.0 -> 0.8-1.3).  The JVM checks that an
# archive matches its own build and the jars (their paths, sizes and times) and otherwise
# starts without it, as it did before: an archive only saves time.


QUIET_CDS = ("-Xlog:cds*=off",)
"""The JVM says on stdout when it cannot use an archive (a class path that is not the
archive's) and, writing one, which classes it leaves out: not among a client's or a
tool's output, which the tests read."""


@functools.cache
def class_archive(lib: Path, first: Path | None = None) -> Path:
    """Where the class archive of the JVMs that run the jars of *lib* (after the jar
    *first*, if given) is kept: named by the JDK and the jars, so an upgrade of either
    gets a new one."""
    stamp = hashlib.sha256(os.path.realpath(java()).encode())
    for jar in [*([first] if first is not None else []), *sorted(lib.glob("*.jar"))]:
        st = jar.stat()
        stamp.update(f"{jar.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    name = lib.parent.name if first is None else f"{first.stem}-{lib.parent.name}"
    return cache_dir() / "cds" / f"{name}-{stamp.hexdigest()[:16]}.jsa"


def archive_flags(lib: Path, first: Path | None = None) -> list[str]:
    """The JVM options that map the class archive of *lib*'s jars (after *first*), none
    while it is not built."""
    archive = class_archive(lib, first)
    return [f"-XX:SharedArchiveFile={archive}", *QUIET_CDS] if archive.is_file() else []


def tool_command(
    lib: Path, main: str, *args: str, archive: Sequence[str] | None = None
) -> list[str]:
    """A short-lived JVM running *main* of *lib*'s jars with *args*: :data:`TOOL_JVM_OPTS`,
    and the jars' class archive (or *archive*: the options in its place)."""
    flags = archive_flags(lib) if archive is None else list(archive)
    return [java(), *TOOL_JVM_OPTS, *flags, "-cp", f"{lib}/*", main, *args]


def cluster_id() -> str:
    """A new cluster id as ``kafka-storage random-uuid`` makes it (Kafka's
    ``Uuid.randomUuid``: 16 random bytes in URL-safe base64, never starting with "-"), with
    no JVM to start."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def cache_dir() -> Path:
    env = os.environ.get("KAFKA_FETCH_PROXY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kafka-fetch-proxy"


def jvm_lib(artifact_set: str) -> Path:
    """The directory of resolved jars for ``tests/jvm/<artifact_set>``."""
    lib = cache_dir() / "jvm" / artifact_set / "lib"
    if not lib.is_dir() or not any(lib.glob("*.jar")):
        raise SetupError(
            f"{lib} has no jars: run `scripts/setup --test` (it resolves tests/jvm/{artifact_set})"
        )
    return lib


def java() -> str:
    path = shutil.which("java")
    if path is None:
        raise SetupError("no `java` on PATH: run `scripts/setup --test` (it installs a JDK)")
    return path


def jar_version(lib: Path, artifact: str) -> str:
    """The version of ``artifact`` among the jars in ``lib`` (``kafka_2.13`` -> ``4.4.0``)."""
    for jar in lib.glob(f"{artifact}-*.jar"):
        m = re.fullmatch(re.escape(artifact) + r"-(\d[\w.\-]*)\.jar", jar.name)
        if m:
            return m.group(1)
    raise SetupError(f"no {artifact} jar in {lib}")


def _log_config(lib: Path, node_dir: Path) -> list[str]:
    """JVM flags that send the broker's log to ``node_dir/server.log``."""
    log = node_dir / "server.log"
    if any(lib.glob("log4j-core-*.jar")):
        conf = node_dir / "log4j2.properties"
        conf.write_text(
            "\n".join(
                [
                    "appender.f.type = File",
                    "appender.f.name = F",
                    f"appender.f.fileName = {log}",
                    "appender.f.layout.type = PatternLayout",
                    "appender.f.layout.pattern = [%d] %p %m (%c)%n",
                    "rootLogger.level = INFO",
                    "rootLogger.appenderRef.f.ref = F",
                    "logger.kafka.name = kafka",
                    "logger.kafka.level = INFO",
                    "logger.state.name = state.change.logger",
                    "logger.state.level = WARN",
                    "",
                ]
            )
        )
        return [f"-Dlog4j2.configurationFile={conf}"]
    conf = node_dir / "log4j.properties"
    conf.write_text(
        "\n".join(
            [
                "log4j.rootLogger=INFO, F",
                "log4j.appender.F=org.apache.log4j.FileAppender",
                f"log4j.appender.F.File={log}",
                "log4j.appender.F.layout=org.apache.log4j.PatternLayout",
                "log4j.appender.F.layout.ConversionPattern=[%d] %p %m (%c)%n",
                "log4j.logger.state.change.logger=WARN",
                "",
            ]
        )
    )
    return [f"-Dlog4j.configuration=file:{conf}"]


@dataclass
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    secure_port: int | None = None
    """The SECURE listener's port (only with ``KafkaCluster(security=...)``)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no server.log)"
        return "\n".join(text[-lines:])


SECURE_LISTENER = "SECURE"
SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Security:
    """A SECURE listener with SASL (SCRAM-SHA-512 and PLAIN) and an authorizer.

    ``users`` (name -> password) are both SCRAM-SHA-512 credentials and PLAIN users.
    With ``protocol="SASL_SSL"`` the listener serves TLS from ``keystore`` (a PEM file:
    PKCS#8 key, then the certificate chain; ``tests/support/tls.py``) and trusts
    ``truststore`` (PEM CAs).  ``super_users`` are super users besides User:ANONYMOUS
    (the internal PLAINTEXT listener's principal).
    """

    users: Mapping[str, str]
    protocol: str = "SASL_SSL"
    keystore: Path | None = None
    truststore: Path | None = None
    super_users: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.protocol not in ("SASL_SSL", "SASL_PLAINTEXT"):
            raise ValueError(f"protocol {self.protocol!r}: SASL_SSL or SASL_PLAINTEXT")
        if self.protocol == "SASL_SSL" and (self.keystore is None or self.truststore is None):
            raise ValueError("SASL_SSL needs a keystore and a truststore")
        for name, password in self.users.items():
            if not re.fullmatch(r"[\w.-]+", name) or not re.fullmatch(r"[\w.-]+", password):
                raise ValueError(f"user {name!r}: names and passwords of [A-Za-z0-9_.-] only")

    def properties(self) -> dict[str, str]:
        """Broker properties of the SECURE listener and the authorizer."""
        prefix = f"listener.name.{SECURE_LISTENER.lower()}"
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        props = {
            "sasl.enabled.mechanisms": f"PLAIN,{SCRAM_MECHANISM}",
            f"{prefix}.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            ),
            f"{prefix}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(["User:ANONYMOUS", *(f"User:{u}" for u in self.super_users)]),
        }
        if self.protocol == "SASL_SSL":
            props |= {
                f"{prefix}.ssl.keystore.type": "PEM",
                f"{prefix}.ssl.keystore.location": str(self.keystore),
                f"{prefix}.ssl.truststore.type": "PEM",
                f"{prefix}.ssl.truststore.location": str(self.truststore),
                f"{prefix}.ssl.client.auth": "none",
            }
        return props

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create the SCRAM credentials."""
        args: list[str] = []
        for user, password in self.users.items():
            args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        return args


RACK_AWARE = {"replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector"}
"""Broker config for rack-aware fetching (KIP-392): leaders name a preferred read replica in
the consumer's rack.  Give the nodes racks with ``KafkaCluster(racks=...)``."""

MAX_PARTITIONS_PER_REQUEST = 5000
"""Partitions created (or added) by one Admin request: KRaft refuses a batch of more than
10,000 metadata records, and a partition is one record per replica set."""


class KafkaCluster:
    """A KRaft cluster of ``brokers`` combined broker+controller nodes on 127.0.0.1."""

    def __init__(
        self,
        brokers: int = 1,
        *,
        workdir: Path,
        version: str = "4",
        config: Mapping[str, str] | None = None,
        listeners: Mapping[str, int] | None = None,
        security: Security | None = None,
        name: str | None = None,
        racks: Sequence[str] | None = None,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"unknown Kafka line {version!r}: one of {sorted(VERSIONS)}")
        self.lib = jvm_lib(VERSIONS[version])
        self.version = jar_version(self.lib, "kafka_2.13")
        self.workdir = Path(workdir)
        self.name = name or self.workdir.name
        """What the test run calls it (its kept logs' directory starts with it)."""
        self.keep_logs_in: Path | None = None
        """If set (tests/conftest.py does when a test that used the cluster failed), ``stop()``
        copies every node's logs there (:meth:`copy_logs`)."""
        self.config = {**_DEFAULTS, **(config or {})}
        self.extra_listeners = dict(listeners or {})
        """name -> advertised port of a second PLAINTEXT listener on node 1 (e.g. for a relay)."""
        self.cluster_id = ""
        self.nodes: dict[int, KafkaNode] = {}
        for node_id in range(1, brokers + 1):
            node_dir = self.workdir / f"node-{node_id}"
            self.nodes[node_id] = KafkaNode(node_id, free_port(), free_port(), node_dir)
        self.security = security
        """The SECURE listener and authorizer (None: PLAINTEXT only, no authorizer)."""
        if security is not None:
            for node in self.nodes.values():
                node.secure_port = free_port()
        self.start_seconds = 0.0
        self.archive_at_exit: list[str] = []
        """JVM options of the nodes in place of the class archive's (``class_archives``:
        the run that writes it)."""
        if racks is not None and len(racks) != brokers:
            raise ValueError(f"{len(racks)} racks for {brokers} brokers: one per broker")
        self.racks: dict[int, str] = (
            {} if racks is None else {n: str(r) for n, r in zip(self.nodes, racks, strict=True)}
        )
        """node id -> its ``broker.rack`` (empty: no racks)."""

    # -- lifecycle ---------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes.values())

    @property
    def secure_bootstrap(self) -> str:
        """The SECURE listeners (``security=`` only)."""
        if self.security is None:
            raise ValueError("this cluster has no SECURE listener (no security=)")
        return ",".join(f"127.0.0.1:{n.secure_port}" for n in self.nodes.values())

    def start(self, timeout: float = START_TIMEOUT) -> KafkaCluster:
        """Format storage, launch every node, wait until all serve; stopped again on failure."""
        began = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = cluster_id()
        for node in self.nodes.values():
            node.dir.mkdir(parents=True, exist_ok=True)
            self._write_properties(node)
            scram = self.security.scram_arguments() if self.security is not None else []
            self._storage(
                "format", "-t", self.cluster_id, "-c", str(node.dir / "server.properties"), *scram
            )
        _running[id(self)] = self  # until stop()
        try:
            for node in self.nodes.values():
                self._launch(node)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """SIGTERM every node at once, SIGKILL what is still running after 10 s; then copy
        the logs to ``keep_logs_in`` if it is set."""
        try:
            self._stop_nodes()
        finally:
            _running.pop(id(self), None)
            if self.keep_logs_in is not None:
                self.copy_logs(self.keep_logs_in)

    def copy_logs(self, dest: Path) -> Path:
        """Copy each node's :data:`LOG_FILES` to ``dest/node-<id>-<file>``."""
        dest.mkdir(parents=True, exist_ok=True)
        for node in self.nodes.values():
            for log in LOG_FILES:
                if (node.dir / log).exists():
                    shutil.copy(node.dir / log, dest / f"node-{node.node_id}-{log}")
        return dest

    def _stop_nodes(self) -> None:
        running = [n for n in self.nodes.values() if n.proc is not None]
        for node in running:
            assert node.proc is not None
            if node.proc.poll() is None:
                if node.paused:
                    node.proc.send_signal(signal.SIGCONT)
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for node in running:
            assert node.proc is not None
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(STOP_TIMEOUT)
            node.proc = None
            node.paused = False

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop_broker(self, node_id: int, *, kill: bool = False) -> None:
        """Stop one node (SIGTERM, a controlled shutdown; ``kill``: SIGKILL)."""
        self._terminate(self.nodes[node_id], kill=kill)

    def start_broker(self, node_id: int, timeout: float = START_TIMEOUT) -> None:
        node = self.nodes[node_id]
        if node.proc is not None and node.proc.poll() is None:
            return
        self._launch(node)
        self.wait_ready(timeout)

    def pause_broker(self, node_id: int) -> None:
        """SIGSTOP: the node's sockets stay open but nothing answers."""
        node = self.nodes[node_id]
        assert node.proc is not None
        node.proc.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume_broker(self, node_id: int) -> None:
        node = self.nodes[node_id]
        assert node.proc is not None
        node.proc.send_signal(signal.SIGCONT)
        node.paused = False

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until every running node is registered and serves metadata."""
        deadline = time.monotonic() + timeout
        want = {n.node_id for n in self.nodes.values() if n.proc is not None}
        last: object = None
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(
                        f"Kafka node {node.node_id} exited with {node.proc.returncode}; "
                        f"its log ({node.log}):\n{node.tail()}"
                    )
            try:
                seen = set(self._admin(timeout=2).list_topics(timeout=2).brokers)
                if want <= seen:
                    return
                last = f"brokers registered: {sorted(seen)}, want {sorted(want)}"
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"Kafka not ready in {timeout:.0f} s ({last})")

    # -- admin -------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        *,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        from confluent_kafka.admin import NewPartitions, NewTopic

        rf = replication_factor or len(self.nodes)
        admin = self._admin(timeout=timeout)
        # KRaft writes a topic's creation as one batch of records, at most 10,000 of them
        # (POLICY_VIOLATION beyond): a larger topic is created, then grown, in steps.
        created = min(partitions, MAX_PARTITIONS_PER_REQUEST)
        futures = admin.create_topics(
            [NewTopic(name, created, rf, config=dict(config or {}))],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        futures[name].result(timeout=timeout)
        while created < partitions:
            created = min(partitions, created + MAX_PARTITIONS_PER_REQUEST)
            grown = admin.create_partitions(
                [NewPartitions(name, created)], operation_timeout=timeout, request_timeout=timeout
            )
            grown[name].result(timeout=timeout)
        self._wait_served(name, partitions, timeout)
        return name

    def delete_topics(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Delete *names* and wait until the controller has accepted each deletion."""
        if not names:
            return
        admin = self._admin(timeout=timeout)
        futures = admin.delete_topics(
            list(names), operation_timeout=timeout, request_timeout=timeout
        )
        for future in futures.values():
            future.result(timeout=timeout)

    def topics(self) -> list[str]:
        """Every topic's name but Kafka's own (``__consumer_offsets``, ...)."""
        listed = self._admin().list_topics(timeout=10).topics
        return sorted(name for name in listed if not name.startswith("__"))

    def new_topic(self, partitions: int, prefix: str = "t", **kwargs: Any) -> str:
        return self.create_topic(f"{prefix}-{uuid.uuid4().hex[:10]}", partitions, **kwargs)

    def node_in_rack(self, rack: str) -> int:
        """The one node whose ``broker.rack`` is *rack*."""
        [node] = [n for n, r in self.racks.items() if r == rack]
        return node

    def replicas_of(self, topic: str, partition: int) -> tuple[int, list[int], list[int]]:
        """(leader, replicas, in-sync replicas) of a partition, from Metadata."""
        p = self._admin().list_topics(topic, timeout=10).topics[topic].partitions[partition]
        return int(p.leader), [int(r) for r in p.replicas], [int(r) for r in p.isrs]

    def move_leader(self, topic: str, partition: int, to: int, timeout: float = 30.0) -> None:
        """Make node *to* (a replica already) the partition's leader, with no broker stopped:
        the replica list reordered so it comes first (AlterPartitionReassignments, the same
        replicas), then a preferred leader election (ElectLeaders); returns once Metadata
        names it."""
        from .rawclient import RawClient

        _, replicas, _ = self.replicas_of(topic, partition)
        if to not in replicas:
            raise ValueError(f"node {to} is not a replica of {topic}-{partition}: {replicas}")
        order = [to, *(r for r in replicas if r != to)]
        deadline = time.monotonic() + timeout
        running = next(n for n in self.nodes.values() if n.proc is not None and not n.paused)
        with RawClient(running.address, client_id="leader-mover", deadline=deadline) as c:
            parts = [{"partition_index": partition, "replicas": order}]
            moved = c.call(45, 0, {"timeout": 10_000, "topics": [{"name": topic, "partitions": parts}]})  # fmt: skip
            codes = [int(moved.error_code)] + [
                int(p.error_code) for t in moved.responses for p in t.partitions
            ]
            if any(codes):
                raise RuntimeError(f"AlterPartitionReassignments {topic}-{partition}: {codes}")
            while self.leader_of(topic, partition) != to:
                tp = [{"topic": topic, "partitions": [partition]}]
                c.call(43, 2, {"election_type": 0, "topic_partitions": tp, "timeout": 10_000})
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}-{partition}: leader not {to} after {timeout} s")
                time.sleep(0.1)

    def leader_of(self, topic: str, partition: int) -> int:
        meta = self._admin().list_topics(topic, timeout=10)
        return int(meta.topics[topic].partitions[partition].leader)

    def allow(
        self,
        user: str,
        *,
        topic: str | None = None,
        group: str | None = None,
        operations: tuple[str, ...] = ("READ", "WRITE", "DESCRIBE"),
        prefixed: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """ALLOW ACLs for User:*user* on a topic or a consumer group (Admin API).

        ``operations`` are ``AclOperation`` names; ``prefixed`` makes the resource name a
        prefix.  Returns once the ACLs are created (the authorizer sees them from the
        metadata log a moment later: callers wait for their effect)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        if (topic is None) == (group is None):
            raise ValueError("ACLs for one topic or one group")
        kind, name = (
            (ResourceType.TOPIC, topic) if topic is not None else (ResourceType.GROUP, group)
        )
        assert name is not None
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [
            AclBinding(
                kind, name, pattern, f"User:{user}", "*", AclOperation[op], AclPermissionType.ALLOW
            )
            for op in operations
        ]
        admin = self._admin(timeout=timeout)  # kept alive until the results are in
        futures = admin.create_acls(bindings, request_timeout=timeout)
        for future in futures.values():
            future.result(timeout=timeout)

    def set_client_quota(self, client_id: str, timeout: float = 30.0, **quotas: float) -> None:
        """Client-id quotas (``consumer_byte_rate=...``, ``producer_byte_rate=...``), as
        ``kafka-configs --alter --entity-type clients --entity-name ID --add-config`` sets them
        (AlterClientQuotas v1); returns once the broker describes them (DescribeClientQuotas
        answers from the metadata image the quota manager is updated from)."""
        from .rawclient import RawClient

        entity = [{"entity_type": "client-id", "entity_name": client_id}]
        ops = [{"key": k, "value": float(v), "remove": False} for k, v in quotas.items()]
        deadline = time.monotonic() + timeout
        with RawClient(self.nodes[1].address, client_id="quota-admin", deadline=deadline) as c:
            altered = c.call(49, 1, {"entries": [{"entity": entity, "ops": ops}], "validate_only": False})  # fmt: skip
            errors = [int(e.error_code) for e in altered.entries]
            if any(errors):
                raise RuntimeError(f"AlterClientQuotas for {client_id!r}: errors {errors}")
            match = [{"entity_type": "client-id", "match_type": 0, "match": client_id}]
            while True:
                described = c.call(48, 1, {"components": match, "strict": True})
                values = {
                    str(v.key): float(v.value)
                    for entry in described.entries or ()
                    for v in entry.values
                }
                if all(values.get(k) == float(v) for k, v in quotas.items()):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"quotas {quotas} of {client_id!r} not in effect: {values}")
                time.sleep(0.1)

    def _wait_served(self, topic: str, partitions: int, timeout: float) -> None:
        """Until Metadata lists a leader for every partition and that leader answers for it.

        Kafka lists a new topic's leaders in Metadata a moment before the leader's
        replica manager has made the partition: a Produce then fails with
        NOT_LEADER_OR_FOLLOWER and a non-idempotent producer's retry reorders its
        batches.  So the leaders must also answer ListOffsets for every partition.
        (The dev cluster serves a topic as soon as it exists.)
        """
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        admin = self._admin()
        latest = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            meta = admin.list_topics(topic, timeout=5).topics.get(topic)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                try:
                    for future in admin.list_offsets(latest, request_timeout=10).values():
                        future.result(timeout=10)
                    return
                except Exception as exc:  # a leader that does not serve the partition yet
                    last = exc
            time.sleep(0.1)
        raise TimeoutError(f"topic {topic} not served after {timeout:.0f} s ({last})")

    def _admin(self, timeout: float = 10.0) -> Any:
        from confluent_kafka.admin import AdminClient

        running = [n.address for n in self.nodes.values() if n.proc is not None and not n.paused]
        return AdminClient(
            {
                "bootstrap.servers": ",".join(running or [self.bootstrap]),
                "socket.timeout.ms": int(timeout * 1000),
                "log_level": 0,
            }
        )

    # -- processes ---------------------------------------------------------------

    def _storage(self, *args: str) -> str:
        proc = subprocess.run(
            tool_command(self.lib, "kafka.tools.StorageTool", *args),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kafka-storage {args[0]} failed: {proc.stdout}{proc.stderr}")
        return proc.stdout

    def _write_properties(self, node: KafkaNode) -> None:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes.values())
        listeners = [f"PLAINTEXT://127.0.0.1:{node.port}"]
        advertised = [f"PLAINTEXT://127.0.0.1:{node.port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        if node.node_id == 1:
            for name, port in self.extra_listeners.items():
                listen = free_port()
                node.extra[name] = str(listen)
                listeners.append(f"{name}://127.0.0.1:{listen}")
                advertised.append(f"{name}://127.0.0.1:{port}")
                protocols.append(f"{name}:PLAINTEXT")
        if self.security is not None:
            secure = f"{SECURE_LISTENER}://127.0.0.1:{node.secure_port}"
            listeners.append(secure)
            advertised.append(secure)
            protocols.append(f"{SECURE_LISTENER}:{self.security.protocol}")
        listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
        rf = str(min(3, len(self.nodes)))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(node.dir / "data"),
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": "1",
            "default.replication.factor": rf,
            **({"broker.rack": self.racks[node.node_id]} if self.racks else {}),
            **(self.security.properties() if self.security is not None else {}),
            **self.config,
        }
        (node.dir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _launch(self, node: KafkaNode) -> None:
        log_flags = _log_config(self.lib, node.dir)
        cmd = [
            java(),
            *JVM_OPTS,
            *(self.archive_at_exit or archive_flags(self.lib)),
            *log_flags,
            "-cp",
            f"{self.lib}/*",
            "kafka.Kafka",
            str(node.dir / "server.properties"),
        ]
        out = (node.dir / "stdout.log").open("ab")
        node.proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        out.close()
        node.paused = False

    def _terminate(self, node: KafkaNode, *, kill: bool = False) -> None:
        proc = node.proc
        if proc is None:
            return
        if proc.poll() is None:
            if node.paused:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT)
        node.proc = None
        node.paused = False
