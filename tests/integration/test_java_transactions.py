"""The Java client's transactions through the proxy: the dev cluster, Kafka 4.4 and Kafka 3.9.

One run of tests/clients/java/ProxyClient.java (built by ``tests/clients/build``) through
the proxy:

1. ``txn``: a transactional producer writes ``COUNT`` records to a fresh topic in ``TXNS``
   transactions, aborting every third one from the second on (after a flush, so the
   aborted records are in the log) and committing the rest;
2. ``read_committed``: a consumer with isolation.level read_committed reads the topic from
   the beginning to its end;
3. ``ctp``: consume-transform-produce: a read_committed consumer in a classic group and a
   second transactional producer copy the committed records to another topic, committing
   the group's offsets in each transaction (``sendOffsetsToTransaction``); its second
   transaction is aborted and its records processed again;
4. ``read_committed`` of that output topic.

Checks: the log is laid out as the transactions wrote it (each record at the offset a
fresh single-producer topic gives it, one marker per partition and transaction); the
read_committed consumers get exactly the committed records, exactly once and in order per
partition, and end at the end of every partition; the group's committed offsets are the
ends of the committed transactions; every broker address the client reports is the
proxy's.

Transactions protocol, seen at the proxy (every response it relays passes the fetch path's
``observe`` hook, with its API key and version): Kafka 4.4 and the dev cluster finalize
``transaction.version`` 2, so the Java 4.4 client uses transactions V2 (KIP-890 part 2):
EndTxn v5, whose responses carry the producer epoch the coordinator bumped at every end
of a transaction, and neither AddPartitionsToTxn nor AddOffsetsToTxn (Produce v12+ and
TxnOffsetCommit v5 add partitions implicitly).  Kafka 3.9 has no transaction.version 2:
the client falls back to V1, EndTxn and TxnOffsetCommit below v5, AddPartitionsToTxn
before producing and AddOffsetsToTxn before committing offsets.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from support import clients
from support.backends import running, upstream_for
from support.clients import ClientRun
from support.delivery import assert_exactly_once_in_order
from support.kafka import KafkaCluster
from support.stack import ProxyStack

from proxy.protocol import codec
from proxy.protocol.apis import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    PRODUCE,
    TXN_OFFSET_COMMIT,
)
from proxy.server.proxy import Proxy

pytestmark = pytest.mark.integration

PARTITIONS = 4
COUNT = 240
TXNS = 6
"""Transactions of COUNT / TXNS records; 1 and 4 abort, 0, 2, 3 and 5 commit."""
STEP_TIMEOUT = 60.0
BACKENDS = ("devbroker", "kafka", "kafka39")
TRANSACTIONS_V2 = {"devbroker": True, "kafka": True, "kafka39": False}
"""Whether the upstream finalizes transaction.version 2 (Kafka 4.4, the dev cluster)."""


@dataclass(frozen=True)
class SeenResponse:
    api_key: int
    version: int
    body: Any
    """The decoded EndTxn response (None for other APIs)."""


class TxnStack(ProxyStack):
    """The proxy as ``run`` builds it, noting every response it relays (API and version)."""

    def __init__(self, upstream: KafkaCluster | None, backend: str) -> None:
        super().__init__(upstream=upstream, name=f"java-txn-{backend}")
        self.seen: list[SeenResponse] = []

    def configure(self, proxy: Proxy) -> None:
        path = proxy.fetch_path
        assert path is not None
        new_handler = path.handler
        seen = self.seen

        def observed(node_id: int | None = None) -> Any:
            handler = new_handler(node_id)
            observe = handler.observe

            def note(api_key: int, api_version: int, frame: bytes) -> None:
                body = None
                if api_key == END_TXN:
                    body = codec.decode_response(api_key, api_version, frame)[1]
                seen.append(SeenResponse(api_key, api_version, body))
                observe(api_key, api_version, frame)

            handler.observe = note  # type: ignore[method-assign]
            return handler

        path.handler = observed  # type: ignore[method-assign]

    def responses(self) -> list[SeenResponse]:
        return self.run_sync(lambda: list(self.seen))


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest) -> Iterator[TxnStack]:
    backend = str(request.param)
    with running(TxnStack(upstream_for(request, backend), backend)) as s:
        yield s


# -- what the transactions wrote ------------------------------------------------------------


@dataclass
class Layout:
    """The source topic as the txn step writes it."""

    committed: list[tuple[int, int, str, str]]
    """(partition, offset, key, value) of every committed record, in send order."""
    aborted: list[tuple[int, int, str, str]]
    end: dict[int, int]
    """Every partition's log end offset (the last commit marker + 1)."""


def layout(tag: str) -> Layout:
    """Each transaction's records at the next offsets of their partitions, then one marker
    per partition it wrote to (a transaction ends before the next one starts)."""
    per = COUNT // TXNS
    records = clients.expected(PARTITIONS, COUNT, tag)
    nxt: dict[int, int] = defaultdict(int)
    out = Layout([], [], {})
    for t in range(TXNS):
        batch = records[t * per : (t + 1) * per]
        placed = []
        for p, k, v in batch:
            placed.append((p, nxt[p], k, v))
            nxt[p] += 1
        for p in {p for p, _, _ in batch}:
            nxt[p] += 1  # the transaction's marker
        (out.aborted if t % 3 == 1 else out.committed).extend(placed)
    out.end = dict(nxt)
    return out


def read(run: ClientRun, topic: str) -> list[tuple[int, int, str, str]]:
    return [
        (r["p"], r["o"], r["k"], r["v"])
        for r in run.of("record", "read_committed")
        if r["topic"] == topic
    ]


def positions(run: ClientRun, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    (line,) = [p for p in run.of("positions", "read_committed") if p["topic"] == topic]
    return (
        {int(p): o for p, o in line["positions"].items()},
        {int(p): o for p, o in line["end"].items()},
    )


def check_addresses(run: ClientRun, stack: TxnStack) -> None:
    seen = run.nodes()
    host, _, port = stack.bootstrap.rpartition(":")
    assert seen, "the client reported no broker address"
    assert seen <= stack.proxy_addresses() | {(host, int(port))}, seen
    assert not seen & stack.broker_addresses()


def check_protocol(stack: TxnStack, backend: str, end_txns: int) -> dict[str, Any]:
    """EndTxn's version (and V2's epoch bumps), AddPartitionsToTxn's absence or presence."""
    responses = stack.responses()
    end_txn = [r for r in responses if r.api_key == END_TXN]
    versions = {
        name: sorted({r.version for r in responses if r.api_key == key})
        for name, key in (
            ("InitProducerId", INIT_PRODUCER_ID),
            ("EndTxn", END_TXN),
            ("AddPartitionsToTxn", ADD_PARTITIONS_TO_TXN),
            ("AddOffsetsToTxn", ADD_OFFSETS_TO_TXN),
            ("TxnOffsetCommit", TXN_OFFSET_COMMIT),
            ("Produce", PRODUCE),
        )
    }
    assert len(end_txn) == end_txns, f"{len(end_txn)} EndTxn responses, {end_txns} ends"
    assert all(int(r.body.error_code) == 0 for r in end_txn), [r.body for r in end_txn]
    if TRANSACTIONS_V2[backend]:
        assert versions["EndTxn"] == [5], versions
        assert versions["AddPartitionsToTxn"] == [], versions
        assert versions["AddOffsetsToTxn"] == [], versions  # TxnOffsetCommit v5 adds the group
        assert versions["TxnOffsetCommit"] == [5], versions
        assert min(versions["Produce"]) >= 12, versions
        # V2: every EndTxn bumps the producer epoch, and its response says to what.
        epochs: dict[int, list[int]] = defaultdict(list)
        for r in end_txn:
            epochs[int(r.body.producer_id)].append(int(r.body.producer_epoch))
        assert len(epochs) == 2, epochs  # the txn step's producer and the ctp step's
        for pid, seq in epochs.items():
            assert all(b == a + 1 for a, b in pairwise(seq)), (pid, seq)
    else:
        assert versions["EndTxn"] and max(versions["EndTxn"]) < 5, versions
        assert versions["AddPartitionsToTxn"], versions
        assert versions["AddOffsetsToTxn"], versions
        assert versions["TxnOffsetCommit"] and max(versions["TxnOffsetCommit"]) < 5, versions
    return versions


# -- the test -------------------------------------------------------------------------------


def test_java_transactions_read_committed_and_consume_transform_produce(
    stack: TxnStack, request: pytest.FixtureRequest
) -> None:
    backend = request.node.callspec.params["stack"]
    tag = f"jtxn-{uuid.uuid4().hex[:6]}"
    source = stack.create_topic(PARTITIONS, prefix="jtxn")
    dest = stack.create_topic(PARTITIONS, prefix="jtxn-out")
    want = layout(tag)
    run = clients.java_client(
        stack.bootstrap,
        f"txn,{source},{PARTITIONS},{COUNT},{tag},{TXNS}",
        f"read_committed,{source},{PARTITIONS},{len(want.committed)}",
        f"ctp,{source},{PARTITIONS},{len(want.committed)},{dest}",
        f"read_committed,{dest},{PARTITIONS},{len(want.committed)}",
        client_id=f"kfp-{tag}",
        timeout=STEP_TIMEOUT,
    )

    # The transactions, and where their records landed.
    txns = run.of("txn", "txn")
    assert [(t["txn"], t["outcome"]) for t in txns] == [
        (t, "abort" if t % 3 == 1 else "commit") for t in range(TXNS)
    ]
    sent = run.of("sent", "txn")
    assert [(s["p"], s["o"], s["k"], s["v"]) for s in sent if s["outcome"] == "commit"] == (
        want.committed
    )
    assert [(s["p"], s["o"], s["k"], s["v"]) for s in sent if s["outcome"] == "abort"] == (
        want.aborted
    )

    # read_committed: the committed records, exactly once, in order; the whole partition.
    assert_exactly_once_in_order(want.committed, read(run, source))
    at, end = positions(run, source)
    assert at == end == want.end, (at, end, want.end)

    # Consume-transform-produce: one abort, the rest committed with the group's offsets.
    ctp = run.of("txn", "ctp")
    outcomes = Counter(t["outcome"] for t in ctp)
    assert outcomes["abort"] == 1 and outcomes["commit"] >= 2, outcomes
    assert ctp[1]["outcome"] == "abort"
    assert sum(t["records"] for t in ctp if t["outcome"] == "commit") == len(want.committed)
    last = {p: o + 1 for p, o, _, _ in want.committed}  # after each partition's last record
    assert {int(p): o for p, o in run.one("committed")["offsets"].items()} == last
    transformed = [(p, k, f"ctp|{v}") for p, _, k, v in want.committed]
    got = [(p, k, v) for p, _, k, v in read(run, dest)]
    assert_exactly_once_in_order(transformed, got)
    at, end = positions(run, dest)
    assert at == end, (at, end)

    check_addresses(run, stack)
    versions = check_protocol(stack, backend, TXNS + len(ctp))
    print(
        f"java {clients.versions()['kafka-clients']} via {stack.backend}: "
        f"transactions {'V2' if TRANSACTIONS_V2[backend] else 'V1'}, {versions}, "
        f"ctp {dict(outcomes)}, {run.step_ms()}"
    )
