"""Security through the proxy, on real Apache Kafka with SASL over TLS and ACLs.

One single-node cluster for the module (``KafkaCluster(security=...)``): a SECURE
listener (SASL_SSL, SCRAM-SHA-512 and PLAIN) and the StandardAuthorizer with
``allow.everyone.if.no.acl.found=false``.  User ``alice`` may read and write
topics named ``alice-*``, ``bob`` topics named ``bob-*``; each may use consumer
groups of their own prefix.  The proxy reaches the SECURE listener over TLS
(``upstream_tls`` with the test CA and hostname checks); clients speak SASL
to the proxy, which passes it through per connection, so every upstream
connection runs with its own client's identity.

What is checked: SCRAM and PLAIN end to end with confluent-kafka and
kafka-python; a client never reads or writes a topic its ACLs do not cover
(the broker's TOPIC_AUTHORIZATION_FAILED reaches it, by name and by topic id);
two users on one proxy at once never see each other's records or topic ids
through the proxy's caches (fetch-session state, reuse buffer, topic-id map);
the proxy's own Metadata requests for topic ids run with the client's
identity; downstream mutual TLS; and /debug/sessions (off by default) never
shows record data.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import trio
from support.kafka import KafkaCluster, Security
from support.procs import proxy as proxy_process
from support.tls import CertificateAuthority, Issued

from devbroker.build import build
from proxy import config
from proxy.observe.metrics import Metrics
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.server.proxy import Proxy

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

T = TypeVar("T")
USERS = {"alice": "alice-pw", "bob": "bob-pw"}
TOPIC_AUTHORIZATION_FAILED = 29
SASL_AUTHENTICATION_FAILED = 58
FETCH_SESSION_ID_NOT_FOUND = 70
TEST_TIMEOUT = 60.0


# -- the cluster and the TLS material --------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    broker: Issued
    proxy: Issued
    """The proxy's server certificate toward clients (downstream TLS)."""
    alice: Issued
    """A client certificate from the test CA."""
    rogue: Issued
    """A client certificate from another CA."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create(base / "ca", "test-ca")
    other = CertificateAuthority.create(base / "other", "other-ca")
    return Pki(
        ca=ca,
        broker=ca.issue("broker", server=True),
        proxy=ca.issue("proxy", server=True),
        alice=ca.issue("alice", client=True),
        rogue=other.issue("alice", client=True),
    )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Any:
    security = Security(USERS, keystore=pki.broker.keystore, truststore=pki.ca.cert)
    cluster = KafkaCluster(1, workdir=tmp_path_factory.mktemp("secure"), security=security)
    cluster.start()
    try:
        for user in USERS:
            cluster.allow(user, topic=f"{user}-", prefixed=True)
            cluster.allow(user, group=f"{user}-", prefixed=True, operations=("READ", "DESCRIBE"))
        _wait_for_acls(cluster, pki)
        yield cluster
    finally:
        cluster.stop()


def _wait_for_acls(cluster: KafkaCluster, pki: Pki, timeout: float = 30.0) -> None:
    """Until alice, straight to the broker, sees a topic of hers (the authorizer has the ACLs)."""
    from confluent_kafka.admin import AdminClient

    probe = cluster.new_topic(1, prefix="alice-probe")
    admin = AdminClient(
        {
            "bootstrap.servers": cluster.secure_bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(pki.ca.cert),
            **_sasl("alice", "SCRAM-SHA-512"),
        }
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(probe, timeout=5).topics.get(probe)
        if topic is not None and topic.error is None:
            return
        time.sleep(0.1)
    raise TimeoutError("alice's ACLs never took effect")


def _sasl(user: str, mechanism: str) -> dict[str, str]:
    return {"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": USERS[user]}


def _topic(cluster: KafkaCluster, user: str, partitions: int = 1) -> str:
    return cluster.new_topic(partitions, prefix=f"{user}-t")


# -- the proxy in front of the SECURE listener -----------------------------------------


@asynccontextmanager
async def serving(
    cluster: KafkaCluster, pki: Pki, metrics: Metrics | None = None, **extra: Any
) -> AsyncIterator[Proxy]:
    """A proxy in this task's nursery whose upstream is the SECURE listener over TLS.

    The proxy holds no credentials, so a SASL listener answers its discovery's
    ApiVersions and closes on Metadata: the proxy reports the upstream reachable
    (``upstream_requires_authentication``) and binds the broker listeners from the
    Metadata responses it relays to clients."""
    settings = config.validate(
        {
            "upstream": cluster.secure_bootstrap.split(","),
            "listen": "127.0.0.1:0",
            "broker_port_base": 0,
            "connect_timeout_seconds": 5,
            "retry_backoff_initial_seconds": 0.5,
            "retry_backoff_max_seconds": 5,
            "upstream_tls": {"enabled": True, "ca_file": str(pki.ca.cert), "check_hostname": True},
            **extra,
        }
    )
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(Proxy(settings, metrics=metrics).serve)
        yield proxy
        nursery.cancel_scope.cancel()


def _address(proxy: Proxy) -> tuple[str, int]:
    """The proxy's bootstrap listener."""
    assert proxy.bootstrap is not None
    return "127.0.0.1", proxy.bootstrap.port


def _bootstrap(proxy: Proxy) -> str:
    host, port = _address(proxy)
    return f"{host}:{port}"


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """A blocking client call; the test's fail_after abandons it rather than hang."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


# -- blocking clients ------------------------------------------------------------------


def produce(conf: dict[str, Any], topic: str, values: list[bytes], batch: int = 5) -> None:
    """confluent-kafka, *batch* records per RecordBatch (one flush per batch)."""
    from confluent_kafka import Producer

    failures: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    producer = Producer({**conf, "linger.ms": 0, "message.timeout.ms": 20000})
    for start in range(0, len(values), batch):
        for value in values[start : start + batch]:
            producer.produce(topic, value, partition=0, on_delivery=delivered)
        assert producer.flush(25) == 0, "records left undelivered"
    assert not failures, failures


def produce_error(conf: dict[str, Any], topic: str) -> Any:
    """The delivery error of one record (None: delivered)."""
    from confluent_kafka import Producer

    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        errors.append(err)

    producer = Producer({**conf, "message.timeout.ms": 15000})
    producer.produce(topic, b"forbidden", on_delivery=delivered)
    producer.flush(20)
    assert len(errors) == 1
    return errors[0]


def consume_confluent(
    conf: dict[str, Any],
    topic: str,
    count: int,
    *,
    timeout: float = 30.0,
    keep_polling: threading.Event | None = None,
) -> tuple[list[bytes], list[Any]]:
    """(values, errors) of partition 0 from the beginning; stops at *count* records (then,
    with *keep_polling*, keeps the connection fetching until that event is set); a
    *count* of 0 stops at the first error."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"{conf['sasl.username']}-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 200,
        }
    )
    values: list[bytes] = []
    errors: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while time.monotonic() < deadline:
            if count and len(values) >= count and (keep_polling is None or keep_polling.is_set()):
                break
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error())
                if count == 0:
                    break
                continue
            value = msg.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    return values, errors


def kafka_python_consumer(bootstrap: str, user: str, mechanism: str, **extra: Any) -> Any:
    import kafka

    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": USERS[user],
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "request_timeout_ms": 20000,
    }
    return kafka.KafkaConsumer(**(options | extra))


def consume_kafka_python(
    bootstrap: str,
    user: str,
    mechanism: str,
    topic: str,
    count: int,
    *,
    timeout: float = 30.0,
    keep_polling: threading.Event | None = None,
    caught_up: threading.Event | None = None,
) -> list[bytes]:
    import kafka

    consumer = kafka_python_consumer(bootstrap, user, mechanism, fetch_max_wait_ms=300)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        while time.monotonic() < deadline:
            if len(values) >= count:
                if caught_up is not None:
                    caught_up.set()
                if keep_polling is None or keep_polling.is_set():
                    break
            for records in consumer.poll(timeout_ms=200).values():
                values.extend(r.value for r in records)
    finally:
        consumer.close()
    return values


# -- a raw Kafka-protocol client over trio (SASL/PLAIN, then any request) ----------------


class Raw:
    """One connection: kio requests built from plain dicts, decoded responses back."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(64 << 20)
        self.correlation_id = 0
        self.frames: list[bytes] = []
        """Every response frame received, raw (to look for bytes that must not be there)."""
        self.versions: dict[int, tuple[int, int]] = {}

    @classmethod
    @asynccontextmanager
    async def connect(cls, address: tuple[str, int]) -> AsyncIterator[Raw]:
        stream = await trio.open_tcp_stream(*address)
        try:
            yield cls(stream)
        finally:
            await trio.aclose_forcefully(stream)

    async def frame(self) -> bytes:
        while (frame := self.decoder.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("the proxy closed the connection")
            self.decoder.feed(data)
        self.frames.append(bytes(frame))
        return self.frames[-1]

    async def call(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        schema = codec.request_schema(api_key, version)
        assert schema is not None
        self.correlation_id += 1
        request = codec.encode_request(build(schema, data), self.correlation_id, "raw")
        await self.stream.send_all(encode_frame(request))
        cid, body = codec.decode_response(api_key, version, await self.frame())
        assert cid == self.correlation_id
        return body

    async def login(self, user: str, password: str | None = None) -> None:
        """ApiVersions, then SaslHandshake + SaslAuthenticate (PLAIN) as *user*."""
        versions = await self.call(
            18, 3, {"client_software_name": "raw", "client_software_version": "1"}
        )
        self.versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in versions.api_keys
        }
        handshake = await self.call(17, 1, {"mechanism": "PLAIN"})
        assert int(handshake.error_code) == 0, handshake
        token = b"\x00" + user.encode() + b"\x00" + (password or USERS[user]).encode()
        auth = await self.call(36, 2, {"auth_bytes": token})
        assert int(auth.error_code) == 0, auth.error_message

    async def metadata(self, topics: list[str]) -> Any:
        return await self.call(
            3,
            12,
            {
                "topics": [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )

    async def fetch(
        self,
        version: int,
        *,
        topic: str | None = None,
        topic_id: uuid.UUID | None = None,
        session_id: int = 0,
        epoch: int = -1,
    ) -> Any:
        topics = []
        if topic is not None or topic_id is not None:
            part = {
                "partition": 0,
                "fetch_offset": 0,
                "partition_max_bytes": 1 << 20,
                "current_leader_epoch": -1,
                "last_fetched_epoch": -1,
                "log_start_offset": -1,
            }
            topics = [{"topic": topic, "topic_id": topic_id, "partitions": [part]}]
        return await self.call(
            1,
            version,
            {
                "replica_id": -1,
                "replica_state": {"replica_id": -1, "replica_epoch": -1},
                "max_wait": 0,
                "min_bytes": 0,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "session_id": session_id,
                "session_epoch": epoch,
                "topics": topics,
                "forgotten_topics_data": [],
                "rack_id": "",
                "cluster_id": None,
            },
        )


def partitions_of(response: Any) -> list[tuple[Any, Any]]:
    """(topic name or id, PartitionData) of a Fetch response."""
    return [
        (getattr(t, "topic", None) or getattr(t, "topic_id", None), p)
        for t in response.responses
        for p in t.partitions
    ]


async def topic_id_of(cluster: KafkaCluster, topic: str) -> uuid.UUID:
    """The topic id, asked of the broker's internal PLAINTEXT listener (a super user)."""
    host, port = cluster.bootstrap.split(",")[0].split(":")
    async with Raw.connect((host, int(port))) as raw:
        meta = await raw.metadata([topic])
    (found,) = meta.topics
    assert int(found.error_code) == 0
    return uuid.UUID(str(found.topic_id))


# -- SASL through the proxy ------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
async def test_sasl_over_tls_upstream_with_two_clients(
    secure: KafkaCluster, pki: Pki, mechanism: str
) -> None:
    topic = _topic(secure, "alice")
    values = [f"{mechanism}-{i:03d}".encode() for i in range(30)]
    with trio.fail_after(TEST_TIMEOUT):
        async with serving(secure, pki) as proxy:
            # Ready (a Kubernetes readiness probe passes) although discovery cannot
            # authenticate: the upstream answered, SASL is the clients' own.
            await proxy.discovered.wait()
            await proxy.wait_ready()
            assert proxy.upstream_auth_only and proxy.readiness()[0]
            conf = {
                "bootstrap.servers": _bootstrap(proxy),
                "security.protocol": "SASL_PLAINTEXT",
                **_sasl("alice", mechanism),
            }
            await in_thread(produce, conf, topic, values)
            got, errors = await in_thread(lambda: consume_confluent(conf, topic, len(values)))
            assert got == values and not errors
            got_kp = await in_thread(
                lambda: consume_kafka_python(
                    _bootstrap(proxy), "alice", mechanism, topic, len(values)
                )
            )
            assert got_kp == values
            # clients reached the broker listener the proxy bound from relayed Metadata
            assert proxy.broker_address(1) is not None

            # a wrong password: the broker's refusal reaches the client through the proxy
            async with Raw.connect(_address(proxy)) as raw:
                await raw.call(
                    18, 3, {"client_software_name": "raw", "client_software_version": "1"}
                )
                assert int((await raw.call(17, 1, {"mechanism": "PLAIN"})).error_code) == 0
                auth = await raw.call(36, 2, {"auth_bytes": b"\x00alice\x00wrong"})
                assert int(auth.error_code) == SASL_AUTHENTICATION_FAILED
                assert "nvalid" in (auth.error_message or "")


def sasl_errors(conf: dict[str, Any]) -> list[Any]:
    """The errors confluent-kafka reports while it tries to list topics with *conf*."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    settings: dict[str, Any] = {**conf, "error_cb": errors.append}
    admin = AdminClient(settings)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    return errors


async def test_wrong_password_is_refused_by_the_broker(secure: KafkaCluster, pki: Pki) -> None:
    from confluent_kafka import KafkaError

    with trio.fail_after(TEST_TIMEOUT):
        async with serving(secure, pki) as proxy:
            conf = {
                "bootstrap.servers": _bootstrap(proxy),
                "security.protocol": "SASL_PLAINTEXT",
                **_sasl("alice", "SCRAM-SHA-512"),
                "sasl.password": "wrong",
            }
            errors = await in_thread(sasl_errors, conf)
            auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            assert auth, errors
            assert "invalid credentials" in auth[0].str()


# -- authorization is the broker's, per connection --------------------------------------


async def test_acls_hold_through_the_proxy(secure: KafkaCluster, pki: Pki) -> None:
    from confluent_kafka import KafkaError

    mine, theirs = _topic(secure, "alice"), _topic(secure, "bob")
    with trio.fail_after(TEST_TIMEOUT):
        async with serving(secure, pki) as proxy:
            bob = {
                "bootstrap.servers": _bootstrap(proxy),
                "security.protocol": "SASL_PLAINTEXT",
                **_sasl("bob", "SCRAM-SHA-512"),
            }
            await in_thread(produce, bob, theirs, [b"bob-only-%d" % i for i in range(10)])
            alice = {**bob, **_sasl("alice", "SCRAM-SHA-512")}

            err = await in_thread(produce_error, alice, theirs)
            assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
            assert await in_thread(produce_error, alice, mine) is None

            err = await in_thread(subscribe_error, alice, theirs)
            assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

            # Fetch by name (v12) and by topic id (v17) on alice's own connection
            theirs_id = await topic_id_of(secure, theirs)
            async with Raw.connect(_address(proxy)) as raw:
                await raw.login("alice")
                meta = await raw.metadata([theirs])
                assert [int(t.error_code) for t in meta.topics] == [TOPIC_AUTHORIZATION_FAILED]
                for version, ref in ((12, {"topic": theirs}), (17, {"topic_id": theirs_id})):
                    response = await raw.fetch(version, **ref)
                    parts = partitions_of(response)
                    assert parts and all(
                        int(p.error_code) == TOPIC_AUTHORIZATION_FAILED and not p.records
                        for _, p in parts
                    ), (version, parts)
                assert not any(b"bob-only" in f for f in raw.frames)


def subscribe_error(conf: dict[str, Any], topic: str) -> Any:
    """The first error a confluent-kafka consumer subscribed to *topic* reports."""
    from confluent_kafka import Consumer

    consumer = Consumer({**conf, "group.id": f"{conf['sasl.username']}-{uuid.uuid4().hex[:6]}"})
    deadline = time.monotonic() + 15
    try:
        consumer.subscribe([topic])
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is not None, "a record of a forbidden topic"
                return msg.error()
    finally:
        consumer.close()
    raise AssertionError("the consumer was never refused")


# -- the proxy's caches never cross connections ----------------------------------------


async def test_two_users_at_once_share_nothing_through_the_proxy(
    secure: KafkaCluster, pki: Pki
) -> None:
    x, y = _topic(secure, "alice"), _topic(secure, "bob")
    x_values = [b"ALICE-SECRET-%04d" % i for i in range(120)]
    y_values = [b"bob-public-%04d" % i for i in range(120)]
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(TEST_TIMEOUT):
        # max_records trims every response, so each connection's reuse buffer is used
        async with serving(secure, pki, metrics, max_records=7) as proxy:
            base = {"bootstrap.servers": _bootstrap(proxy), "security.protocol": "SASL_PLAINTEXT"}
            alice = {**base, **_sasl("alice", "SCRAM-SHA-512")}
            bob = {**base, **_sasl("bob", "PLAIN")}
            await in_thread(produce, alice, x, x_values)
            await in_thread(produce, bob, y, y_values)
            x_id = await topic_id_of(secure, x)

            stop = threading.Event()
            alice_caught_up = threading.Event()
            results: dict[str, Any] = {}

            async def alice_reads() -> None:  # kafka-python: a fetch-session client
                results["alice"] = await in_thread(
                    lambda: consume_kafka_python(
                        _bootstrap(proxy), "alice", "SCRAM-SHA-512", x, len(x_values),
                        keep_polling=stop, caught_up=alice_caught_up,
                    )
                )  # fmt: skip

            async def bob_reads() -> None:  # confluent-kafka: sessionless full fetches
                results["bob"] = await in_thread(
                    lambda: consume_confluent(bob, y, len(y_values), keep_polling=stop)
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(alice_reads)
                nursery.start_soon(bob_reads)
                assert await in_thread(alice_caught_up.wait, 30)
                try:
                    await bob_probes(proxy, x, x_id)
                finally:
                    stop.set()

            assert results["alice"] == x_values
            bob_values, bob_errors = results["bob"]
            assert bob_values == y_values and not bob_errors
            hits = metrics.registry.get_sample_value("kafka_fetch_proxy_buffered_reuse_hits_total")
            assert hits is not None and hits > 0, "the reuse buffer was never used"


async def bob_probes(proxy: Proxy, x: str, x_id: uuid.UUID) -> None:
    """While alice reads topic x through the proxy, bob tries to get at it on his own connection."""
    assert proxy.fetch_path is not None
    assert proxy.fetch_path.topic_ids.id_for(x) == x_id  # learnt from alice's Metadata
    node = proxy.broker_address(1)
    assert node is not None
    async with Raw.connect(node) as raw:
        await raw.login("bob")
        # by name: the proxy translates with the id alice's Metadata taught it, but the
        # upstream Fetch runs on bob's connection and the broker refuses it
        for version, ref in ((12, {"topic": x}), (17, {"topic_id": x_id})):
            parts = partitions_of(await raw.fetch(version, **ref))
            assert [int(p.error_code) for _, p in parts] == [TOPIC_AUTHORIZATION_FAILED]
            assert not any(p.records for _, p in parts)
        meta = await raw.metadata([x])
        (topic,) = meta.topics
        assert int(topic.error_code) == TOPIC_AUTHORIZATION_FAILED
        assert topic.topic_id is None or uuid.UUID(str(topic.topic_id)).int == 0

        # alice's fetch sessions with the proxy (their ids and epochs as /debug/sessions
        # shows them) belong to her connections: on bob's each id is unknown, as a broker
        # answers an id it never created (FETCH_SESSION_ID_NOT_FOUND, no session, no
        # partitions), by names and by ids, at her epoch and the next; and a full fetch
        # naming her id gets bob nothing of hers and leaves her sessions as they were
        targets = proxy.debug_sessions()["downstream"]["sessions"]
        assert targets, "alice (kafka-python) holds a fetch session with the proxy"
        alice_ids = {t["session_id"] for t in targets}
        for target in targets:
            for version in (12, 17):
                for epoch in (target["epoch"], target["epoch"] + 1):
                    response = await raw.fetch(
                        version, session_id=target["session_id"], epoch=epoch
                    )
                    assert int(response.error_code) == FETCH_SESSION_ID_NOT_FOUND
                    assert int(response.session_id) == 0
                    assert not partitions_of(response)
            full = await raw.fetch(12, topic=x, session_id=target["session_id"], epoch=0)
            assert int(full.error_code) == 0
            assert int(full.session_id) not in alice_ids
            parts = partitions_of(full)
            assert [int(p.error_code) for _, p in parts] == [TOPIC_AUTHORIZATION_FAILED]
            assert not any(p.records for _, p in parts)
        after = {t["session_id"] for t in proxy.debug_sessions()["downstream"]["sessions"]}
        assert alice_ids <= after, "bob's fetches closed one of alice's sessions"
        assert not any(b"ALICE-SECRET" in frame for frame in raw.frames)


async def test_proxy_metadata_for_topic_ids_runs_as_the_client(
    secure: KafkaCluster, pki: Pki
) -> None:
    """A names client (Fetch v12) on an ids upstream makes the proxy ask Metadata for the
    ids itself: on that client's connection, so bob's request learns nothing of alice's
    topic (the broker refuses), and learns bob's own."""
    x, y = _topic(secure, "alice"), _topic(secure, "bob")
    y_id = await topic_id_of(secure, y)
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            serving(secure, pki) as proxy,
            Raw.connect(_address(proxy)) as raw,
        ):
            assert proxy.fetch_path is not None
            ids = proxy.fetch_path.topic_ids
            await raw.login("bob")
            assert raw.versions[1][1] >= 13  # the upstream is on topic ids
            parts = partitions_of(await raw.fetch(12, topic=x))
            assert [int(p.error_code) for _, p in parts] == [TOPIC_AUTHORIZATION_FAILED]
            parts = partitions_of(await raw.fetch(12, topic=y))
            assert [int(p.error_code) for _, p in parts] == [0]
            # bob never sent Metadata: the proxy asked, on bob's connection, as bob
            assert ids.id_for(y) == y_id
            assert ids.id_for(x) is None
            assert len(ids) == 1


# -- downstream mutual TLS ---------------------------------------------------------------


async def tls_api_versions(port: int, pki: Pki, cert: Issued | None) -> bool:
    """True if the proxy answers ApiVersions over TLS presenting *cert* (None: no cert)."""
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    stream = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", port), context, server_hostname="127.0.0.1"
    )
    try:
        raw = Raw(stream)
        await raw.call(18, 0, {})
        return True
    except (ssl.SSLError, trio.BrokenResourceError, EOFError):
        return False
    finally:
        await trio.aclose_forcefully(stream)


async def test_downstream_mutual_tls(secure: KafkaCluster, pki: Pki) -> None:
    topic = _topic(secure, "alice")
    values = [b"mtls-%02d" % i for i in range(10)]
    downstream = {
        "enabled": True,
        "cert_file": str(pki.proxy.cert),
        "key_file": str(pki.proxy.key),
        "ca_file": str(pki.ca.cert),
    }
    with trio.fail_after(TEST_TIMEOUT):
        async with serving(secure, pki, downstream_tls=downstream) as proxy:
            port = _address(proxy)[1]
            assert await tls_api_versions(port, pki, pki.alice)
            assert not await tls_api_versions(port, pki, None)
            assert not await tls_api_versions(port, pki, pki.rogue)
            assert not await tls_api_versions(port, pki, pki.proxy)  # serverAuth only

            conf = {
                "bootstrap.servers": _bootstrap(proxy),
                "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(pki.ca.cert),
                "ssl.certificate.location": str(pki.alice.cert),
                "ssl.key.location": str(pki.alice.key),
                **_sasl("alice", "SCRAM-SHA-512"),
            }
            await in_thread(produce, conf, topic, values)
            got, errors = await in_thread(lambda: consume_confluent(conf, topic, len(values)))
            assert got == values and not errors
            got_kp = await in_thread(
                lambda: consume_kafka_python_tls(_bootstrap(proxy), pki, topic, len(values))
            )
            assert got_kp == values


def consume_kafka_python_tls(bootstrap: str, pki: Pki, topic: str, count: int) -> list[bytes]:
    import kafka

    consumer = kafka_python_consumer(
        bootstrap,
        "alice",
        "PLAIN",
        security_protocol="SASL_SSL",
        ssl_cafile=str(pki.ca.cert),
        ssl_certfile=str(pki.alice.cert),
        ssl_keyfile=str(pki.alice.key),
    )
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        while len(values) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                values.extend(r.value for r in records)
    finally:
        consumer.close()
    return values


# -- /debug/sessions and logs never carry record data ------------------------------------


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


async def test_debug_sessions_is_off_by_default_and_never_shows_records(
    secure: KafkaCluster, pki: Pki
) -> None:
    topic = _topic(secure, "alice")
    values = [b"PAYLOAD-SECRET-%03d" % i for i in range(40)]
    upstream_tls = ["--upstream-tls-enabled", "--upstream-tls-ca-file", str(pki.ca.cert)]
    with trio.fail_after(TEST_TIMEOUT):
        with proxy_process(secure.secure_bootstrap, *upstream_tls) as plain:
            debug = plain.lines["metrics"].replace("/metrics", "/debug/sessions")
            status, _ = await in_thread(http_get, debug)
            assert status == 404

        with proxy_process(
            secure.secure_bootstrap, *upstream_tls, "--debug-sessions", "--log-level", "debug",
            "--max-records", "7",
        ) as p:  # fmt: skip
            conf = {
                "bootstrap.servers": p.lines["bootstrap"],
                "security.protocol": "SASL_PLAINTEXT",
                **_sasl("alice", "SCRAM-SHA-512"),
            }
            await in_thread(produce, conf, topic, values)
            stop, caught_up = threading.Event(), threading.Event()
            results: dict[str, Any] = {}

            async def reader() -> None:  # a session client, kept fetching until looked at
                results["kp"] = await in_thread(
                    lambda: consume_kafka_python(
                        p.lines["bootstrap"], "alice", "SCRAM-SHA-512", topic, len(values),
                        keep_polling=stop, caught_up=caught_up,
                    )
                )  # fmt: skip

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                got, errors = await in_thread(lambda: consume_confluent(conf, topic, len(values)))
                assert got == values and not errors
                assert await in_thread(caught_up.wait, 30)
                try:
                    debug = p.lines["metrics"].replace("/metrics", "/debug/sessions")
                    status, body = await in_thread(http_get, debug)
                    _, metrics_text = await in_thread(http_get, p.lines["metrics"])
                finally:
                    stop.set()
            assert results["kp"] == values
            assert status == 200
            snapshot = json.loads(body)
            assert snapshot["total"] >= 1 and snapshot["downstream"]["total"] >= 1, snapshot
            log = p.stderr()
        assert '"event"' in log  # the debug log was written
        for text in (body, metrics_text, log):
            assert "PAYLOAD-SECRET" not in text
            assert b"PAYLOAD-SECRET".hex() not in text
