"""A strict in-memory Kafka cluster for tests and demos (``devbroker``).

Start it from Python::

    async with DevCluster(nodes=3, topics={"orders": 12}) as cluster:
        cluster.bootstrap   # "127.0.0.1:PORT" of node 0

or from the command line: ``kafka-devbroker --nodes 3 --port 29092 --topic
orders:12`` (or ``python -m devbroker ...``; node i on port+i; the first stdout
line is ``bootstrap=HOST:PORT``).

A package of its own beside ``proxy``, which it builds on (``proxy.protocol``
for framing and the codec, ``proxy.sessions.as_broker_cache`` for the KIP-227 session
cache); nothing in ``proxy`` imports it, and the sidecar image leaves it out.

Modules, edge first:

- ``cluster``: the trio edge (listeners, one task per connection, long polls,
  fault hooks) and :class:`DevCluster`;
- ``cli``: the ``kafka-devbroker`` command (``python -m devbroker``);
- ``node``: one node's sans-I/O dispatcher (frame in, outcome out);
  ``outcome``: what it returns;
- ``versions``: the API versions implemented, and ApiVersions;
- ``admin``: Metadata, DescribeCluster, CreateTopics, FindCoordinator, ListOffsets;
- ``produce`` (+ ``producers``: idempotent sequences): Produce, InitProducerId;
- ``membership``: the classic consumer-group protocol (JoinGroup, SyncGroup,
  Heartbeat, LeaveGroup; generations and rebalances) and :class:`GroupCoordinator`,
  which answers every group coordinator API;
- ``offsets``: committed offsets (OffsetCommit, TxnOffsetCommit, OffsetFetch);
- ``transactions``: the transaction coordinator (InitProducerId with a
  transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, markers);
- ``fetch``: Fetch, with KIP-74 reads and KIP-227 sessions
  (``proxy.sessions.as_broker_cache``, in ``session_cache``: Kafka's eight cache shards);
- ``jvm_order``: the hash orders Kafka answers some multi-partition requests in;
- ``state`` and ``log``: topics, partitions, leaders and raw-batch logs;
- ``build``: version-independent construction of kio messages.

Known differences from Apache Kafka: one replica per partition (CreateTopics
refuses a replication factor above 1, and topic configs other than the
defaults the dev cluster implements); transactions V2 (KIP-890 part 2,
``transaction.version`` 2 finalized as on a fresh Kafka 4.4) and V1 are
implemented, KIP-939 (InitProducerId v6) and ``group.version`` 1 (KIP-848) are
not, and EndTxn writes the markers of live leaders before it answers (Kafka:
just after, so a request in between gets CONCURRENT_TRANSACTIONS there; and a
read_committed Fetch right after may get only the log up to an older position of
the last stable offset from Kafka, the whole of it here); record bodies are not validated (Kafka's
LogValidator reads every record; here only timestamps of uncompressed and
gzip batches are read, and tests may produce opaque bodies); the initial
rebalance delay defaults to 0 (Kafka: 3 s); ListOffsets by timestamp reads
record timestamps only in uncompressed and gzip batches (others answer with
the batch's first offset); no SASL/TLS listeners; APIs outside the list in
``versions`` (DescribeGroups, DeleteTopics, WriteTxnMarkers, KIP-848 groups, ...)
are not advertised and close the connection like an unknown API, and some
versions Kafka 4.4 advertises are not (listed in ``versions``); a consumer
fetch from a follower replica (a preferred read replica in Kafka) cannot happen;
Metadata for all topics lists them in creation order (Kafka: its metadata
image's order).  Answers Kafka orders by JVM hash codes (ListOffsets, Produce,
Metadata's missing topics; ``jvm_order``) come in the same order only when the
topic ids are the same, as the differential test arranges.
``tests/integration/test_differential.py`` sends the same requests to the dev
cluster and to Apache Kafka and compares the answers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DevCluster"]


def __getattr__(name: str) -> Any:
    # Lazy, so that the sans-I/O modules (log, state, fetch, ...) import without trio.
    if name == "DevCluster":
        from .cluster import DevCluster

        return DevCluster
    raise AttributeError(name)
