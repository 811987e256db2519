"""Real Java, franz-go and sarama clients through the proxy against real Kafka.

The programs in tests/clients/ (built by ``tests/clients/build``) produce through the proxy
(acks=all, idempotent) to a fresh topic, then consume with ``assign`` and in a group
(classic, and KIP-848's consumer protocol where the client has it) or a share group
(KIP-932).  Each case has its own topic; Kafka 4.x (``kafka``) is the main column, Kafka
3.9 (``kafka39``) the older-broker column for the classic cases.

Checks: every record arrives exactly once and in order per partition, at the offsets a
fresh single-producer topic gives it (0, 1, 2, ... per partition); a group commits the
end of every partition; a share group delivers and acknowledges every record (at least
once by contract; a clean run must show no redelivery).  Every broker address a client
reports (metadata) or connects to (franz-go's connect hook) is one of the proxy's.
Fetches are observed at the proxy's Fetch path: the version each client used and
whether it used fetch sessions (Java and franz-go must, sarama must not).
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from support import clients
from support.clients import ClientRun
from support.delivery import assert_exactly_once_in_order
from support.kafka import KafkaCluster
from support.stack import ProxyStack

from proxy.protocol import codec
from proxy.relay.relay import ClientRequest, Upstream
from proxy.server.proxy import Proxy

pytestmark = pytest.mark.integration

PARTITIONS = 4
COUNT = 400
STEP_TIMEOUT = 60.0
FETCH, API_VERSIONS = 1, 18
CLIENT_FETCH_MAX = {"kafka-clients": 18, "franz-go": 18, "sarama": 12}
"""The newest Fetch version each client library sends (sarama: the version it picks for
Kafka 3.9 in its config, which the program sets)."""


@dataclass(frozen=True)
class SeenFetch:
    client_id: str | None
    version: int
    session_id: int
    session_epoch: int


class ObservedStack(ProxyStack):
    """The proxy as ``run`` builds it, noting every client Fetch its Fetch path handles."""

    def __init__(self, upstream: KafkaCluster) -> None:
        super().__init__(upstream=upstream, name=f"real-clients-{upstream.version}")
        self.seen: list[SeenFetch] = []

    def configure(self, proxy: Proxy) -> None:
        path = proxy.fetch_path
        assert path is not None
        new_handler = path.handler
        seen = self.seen

        def observed(node_id: int | None = None) -> Any:
            handler = new_handler(node_id)
            handle = handler.handle_fetch

            def handle_fetch(request: ClientRequest, upstream: Upstream) -> None:
                body = codec.decode_request_body(request.header, request.frame)
                seen.append(
                    SeenFetch(
                        request.header.client_id,
                        int(request.header.api_version),
                        int(getattr(body, "session_id", 0)),
                        int(getattr(body, "session_epoch", -1)),
                    )
                )
                handle(request, upstream)

            handler.handle_fetch = handle_fetch  # type: ignore[method-assign]
            return handler

        path.handler = observed  # type: ignore[method-assign]

    def fetches_of(self, client_id: str) -> list[SeenFetch]:
        seen = self.run_sync(lambda: list(self.seen))
        return [f for f in seen if (f.client_id or "").startswith(client_id)]

    def sessions_created(self) -> int:
        def count() -> int:
            path = self.proxy.fetch_path
            assert path is not None
            return sum(c.sessions_created for c in path.client_session_caches())

        return self.run_sync(count)

    def advertised(self) -> dict[int, tuple[int, int]]:
        """The API version ranges the proxy answers a client's ApiVersions v3 with."""
        request = ApiVersionsRequest(client_software_name="kfp-test", client_software_version="1")
        frame = codec.encode_request(request, 1, "kfp-test")
        host, _, port = self.bootstrap.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.settimeout(10)
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            (size,) = struct.unpack(">i", _read(sock, 4))
            _, body = codec.decode_response(API_VERSIONS, 3, _read(sock, size))
        return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the proxy closed the connection")
        buf += chunk
    return buf


@pytest.fixture(scope="module")
def stack_kafka(kafka: KafkaCluster) -> Iterator[ObservedStack]:
    stack = ObservedStack(kafka).start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def stack_kafka39(kafka39: KafkaCluster) -> Iterator[ObservedStack]:
    stack = ObservedStack(kafka39).start()
    try:
        yield stack
    finally:
        stack.stop()


def stack_for(request: pytest.FixtureRequest, backend: str) -> ObservedStack:
    stack = request.getfixturevalue(f"stack_{backend}")
    assert isinstance(stack, ObservedStack)
    return stack


@pytest.fixture(scope="module")
def versions() -> dict[str, str]:
    found = clients.versions()
    print(f"client versions: {found}")
    return found


# -- checks ---------------------------------------------------------------------------------


def expected(tag: str) -> list[tuple[int, int, str, str]]:
    """(partition, offset, key, value): a fresh topic's offsets are the per-partition seqs."""
    return [
        (p, int(k.rpartition("-")[2]), k, v) for p, k, v in clients.expected(PARTITIONS, COUNT, tag)
    ]


def check_produced(run: ClientRun, tag: str) -> None:
    produced = run.one("produced")
    assert produced["count"] == COUNT
    want = Counter(p for p, _, _, _ in expected(tag))
    assert {int(p): o for p, o in produced["last_offsets"].items()} == {
        p: n - 1 for p, n in want.items()
    }


def check_consumed(run: ClientRun, step: str, tag: str) -> None:
    assert_exactly_once_in_order(expected(tag), run.records(step))


def check_committed(run: ClientRun, tag: str) -> None:
    committed = {int(p): o for p, o in run.one("committed")["offsets"].items()}
    want = Counter(p for p, _, _, _ in expected(tag))
    assert committed == dict(want), f"committed {committed}, produced {dict(want)}"


def check_share(run: ClientRun, tag: str) -> int:
    """Every record delivered and acknowledged, none lost; returns the duplicates."""
    want = expected(tag)
    got = run.records("share")
    assert set(got) <= set(want), sorted(set(got) - set(want))[:5]
    missing = set(want) - set(got)
    assert not missing, f"{len(missing)} records never delivered: {sorted(missing)[:5]}"
    assert run.of("acknowledged")[-1]["total"] == len(want)
    duplicates = len(got) - len(set(got))
    assert run.one("share_done")["deliveries"] == len(got)
    redelivered = [r for r in run.of("record", "share") if r["delivery_count"] != 1]
    print(f"share group: {len(got)} deliveries of {len(want)} records, {duplicates} duplicates")
    assert duplicates == 0 and not redelivered, (duplicates, redelivered[:5])
    return duplicates


def check_addresses(run: ClientRun, stack: ObservedStack) -> None:
    proxy = stack.proxy_addresses()
    host, _, port = stack.bootstrap.rpartition(":")
    seen = run.nodes()
    assert seen, "the client reported no broker address"
    assert seen <= proxy | {(host, int(port))}, f"saw {seen}, the proxy's are {proxy}"
    assert not seen & stack.broker_addresses()


def check_fetches(stack: ObservedStack, client_id: str, library: str, *, sessions: bool) -> int:
    """The Fetch version the client used (the newest both it and the proxy know), and whether
    it used fetch sessions; returns that version."""
    fetches = stack.fetches_of(client_id)
    assert fetches, f"no Fetch from {client_id} reached the proxy's Fetch path"
    used = {f.version for f in fetches}
    newest = min(stack.advertised()[FETCH][1], CLIENT_FETCH_MAX[library])
    assert used == {newest}, f"{library} sent Fetch {sorted(used)}, newest common is {newest}"
    incremental = [f for f in fetches if f.session_epoch > 0]
    if sessions:
        assert incremental, f"{library} never sent an incremental fetch"
    else:
        assert all(f.session_id == 0 and f.session_epoch == -1 for f in fetches), {
            (f.session_id, f.session_epoch) for f in fetches
        }
    print(
        f"{library} via {stack.backend}: Fetch v{newest}, {len(fetches)} fetches, "
        f"{len(incremental)} incremental"
    )
    return newest


def new_case(stack: ObservedStack, name: str) -> tuple[str, str, str]:
    """(topic, tag, client id) of a new case."""
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    return stack.create_topic(PARTITIONS, prefix=name), tag, f"kfp-{tag}"


# -- Java (org.apache.kafka:kafka-clients) -------------------------------------------------


@pytest.mark.parametrize("backend", ["kafka", "kafka39"])
def test_java_produce_assign_classic_group(
    request: pytest.FixtureRequest, backend: str, versions: dict[str, str]
) -> None:
    stack = stack_for(request, backend)
    topic, tag, cid = new_case(stack, "java")
    sessions_before = stack.sessions_created()
    run = clients.java_client(
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.assign(topic, PARTITIONS, COUNT),
        clients.group(topic, PARTITIONS, COUNT, "classic"),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_consumed(run, "assign", tag)
    check_consumed(run, "group", tag)
    check_committed(run, tag)
    check_addresses(run, stack)
    check_fetches(stack, cid, "kafka-clients", sessions=True)
    assert stack.sessions_created() > sessions_before
    print(f"java {versions['kafka-clients']} via {stack.backend}: {run.step_ms()}")


def test_java_consumer_group_protocol(stack_kafka: ObservedStack) -> None:
    stack = stack_kafka
    topic, tag, cid = new_case(stack, "java848")
    run = clients.java_client(
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.group(topic, PARTITIONS, COUNT, "consumer"),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_consumed(run, "group", tag)
    check_committed(run, tag)
    check_addresses(run, stack)
    check_fetches(stack, cid, "kafka-clients", sessions=True)


def test_java_share_group(stack_kafka: ObservedStack) -> None:
    stack = stack_kafka
    topic, tag, cid = new_case(stack, "javashare")
    run = clients.java_client(
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.share(topic, PARTITIONS, COUNT),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_share(run, tag)
    check_addresses(run, stack)


# -- franz-go (github.com/twmb/franz-go) -----------------------------------------------------


@pytest.mark.parametrize("backend", ["kafka", "kafka39"])
def test_franz_go_produce_assign_classic_group(
    request: pytest.FixtureRequest, backend: str, versions: dict[str, str]
) -> None:
    stack = stack_for(request, backend)
    topic, tag, cid = new_case(stack, "franz")
    sessions_before = stack.sessions_created()
    run = clients.go_client(
        "franz-go",
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.assign(topic, PARTITIONS, COUNT),
        clients.group(topic, PARTITIONS, COUNT, "classic"),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_consumed(run, "assign", tag)
    check_consumed(run, "group", tag)
    check_committed(run, tag)
    check_addresses(run, stack)
    check_fetches(stack, cid, "franz-go", sessions=True)
    assert stack.sessions_created() > sessions_before
    print(f"franz-go {versions['franz-go']} via {stack.backend}: {run.step_ms()}")


def test_franz_go_consumer_group_protocol(stack_kafka: ObservedStack) -> None:
    stack = stack_kafka
    topic, tag, cid = new_case(stack, "franz848")
    run = clients.go_client(
        "franz-go",
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.group(topic, PARTITIONS, COUNT, "consumer"),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_consumed(run, "group", tag)
    check_committed(run, tag)
    check_addresses(run, stack)
    check_fetches(stack, cid, "franz-go", sessions=True)


def test_franz_go_share_group(stack_kafka: ObservedStack) -> None:
    stack = stack_kafka
    topic, tag, cid = new_case(stack, "franzshare")
    run = clients.go_client(
        "franz-go",
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.share(topic, PARTITIONS, COUNT),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_share(run, tag)
    check_addresses(run, stack)


# -- sarama (github.com/IBM/sarama) ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["kafka", "kafka39"])
def test_sarama_produce_assign_classic_group(
    request: pytest.FixtureRequest, backend: str, versions: dict[str, str]
) -> None:
    stack = stack_for(request, backend)
    topic, tag, cid = new_case(stack, "sarama")
    run = clients.go_client(
        "sarama",
        stack.bootstrap,
        clients.produce(topic, PARTITIONS, COUNT, tag),
        clients.assign(topic, PARTITIONS, COUNT),
        clients.group(topic, PARTITIONS, COUNT, "classic"),
        client_id=cid,
        timeout=STEP_TIMEOUT,
    )
    check_produced(run, tag)
    check_consumed(run, "assign", tag)
    check_consumed(run, "group", tag)
    check_committed(run, tag)
    check_addresses(run, stack)
    check_fetches(stack, cid, "sarama", sessions=False)
    print(f"sarama {versions['sarama']} via {stack.backend}: {run.step_ms()}")
