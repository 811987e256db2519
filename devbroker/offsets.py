"""Consumer groups' committed offsets, as Apache Kafka's group coordinator keeps them.

OffsetCommit, TxnOffsetCommit and OffsetFetch.  Whether a request may commit
is the group's business (:meth:`GroupCoordinator.offset_commit_error
<devbroker.membership.GroupCoordinator.offset_commit_error>`, Kafka's
validateOffsetCommit); a commit to an unknown group creates it, empty.
TxnOffsetCommit keeps offsets pending until the transaction's marker reaches
the group's ``__consumer_offsets`` partition (:meth:`OffsetManager.complete_txn_offsets`,
called by the transaction coordinator); meanwhile OffsetFetch with
require_stable answers UNSTABLE_OFFSET_COMMIT for them.

OffsetCommit and OffsetFetch v10 name topics by id.  As Kafka's KafkaApis does,
the broker resolves ids to names before the coordinator sees the request
(offsets are kept by name, so every version sees the same offsets) and answers
unknown ids itself with UNKNOWN_TOPIC_ID: in OffsetCommit before the
coordinator's topics (its response builder, :class:`_CommitBuilder`), in
OffsetFetch after them.  Fetching all of a group's topics at v10 leaves out the
topics that no longer exist.  All of a group's offsets are answered in the
iteration order of Kafka's TimelineHashMaps (:func:`timeline_hash_map_order`).

Sans-I/O: no trio here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode as E

from proxy.protocol import codec
from proxy.protocol.apis import OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT

from .build import build
from .jvm_order import java_string_hash
from .state import ClusterState
from .transactions import OFFSETS_TOPIC, offsets_partition

if TYPE_CHECKING:
    from .membership import GroupCoordinator
    from .node import Request

MAX_OFFSET_METADATA = 4096  # offset.metadata.max.bytes
TOPIC_IDS_VERSION = 10
"""OffsetCommit and OffsetFetch name topics by id from this version on."""
ZERO_UUID = uuid.UUID(int=0)

TopicPartition = tuple[str, int]
K = TypeVar("K")
Committed = tuple[int, int, str | None]
"""(offset, leader epoch, metadata) of one committed partition."""
CommitTopic = tuple[str, uuid.UUID, list[Any]]
"""(name, topic id, request partitions) of a topic KafkaApis passes to the coordinator."""
CommitAnswer = tuple[str, uuid.UUID, list[tuple[int, E]]]
"""(name, topic id, (partition, error) per partition): the coordinator's answer for one topic."""


_GOLDEN = -7046029254386353131  # BaseHashTable.findSlot's multiplier (0x9E3779B97F4A7C15)
_MASK64 = (1 << 64) - 1
_MAX_CAPACITY = 1 << 30


def _timeline_slot(hash_code: int, capacity: int) -> int:
    """BaseHashTable.findSlot: the top log2(capacity) bits of hashCode * golden ratio."""
    return ((hash_code * _GOLDEN) & _MASK64) >> (65 - capacity.bit_length())


def timeline_hash_map_order(keys: Iterable[K], hash_code: Callable[[K], int]) -> list[K]:
    """The iteration order of a ``TimelineHashMap(registry, 0)`` after inserting *keys* in order.

    Kafka's coordinators keep committed offsets in these maps (group -> topic ->
    partition); BaseHashTable starts with 2 slots, doubles once ``(size + 1) * 0.75``
    exceeds the slot count, appends a colliding key to its slot's list, and
    rehashes slot by slot in list order.  Iteration goes slot by slot, each slot's
    list from its end (SnapshottableHashTable's iterators take the last of the
    unpacked slot first).  Replacing a key keeps its place; the dev cluster never
    removes single offsets.
    """
    capacity = 2
    slots: list[list[K]] = [[], []]
    size = 0
    for key in keys:
        if (size + 1) * 0.75 > capacity and capacity < _MAX_CAPACITY:
            capacity *= 2
            grown: list[list[K]] = [[] for _ in range(capacity)]
            for slot in slots:
                for k in slot:
                    grown[_timeline_slot(hash_code(k), capacity)].append(k)
            slots = grown
        slots[_timeline_slot(hash_code(key), capacity)].append(key)
        size += 1
    return [k for slot in slots for k in reversed(slot)]


def _in_kafka_order(offsets: dict[TopicPartition, Committed]) -> list[tuple[str, list[int]]]:
    """A group's offsets as Kafka's nested TimelineHashMaps iterate them (keys first
    inserted in *offsets*' order: a replaced offset keeps its place)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in offsets:
        by_topic.setdefault(topic, []).append(partition)
    return [
        (topic, timeline_hash_map_order(by_topic[topic], lambda p: p))
        for topic in timeline_hash_map_order(by_topic, java_string_hash)
    ]


class OffsetManager:
    """The committed offsets of every group (Kafka's OffsetMetadataManager)."""

    def __init__(self, state: ClusterState, coordinator: GroupCoordinator) -> None:
        self.state = state
        self.coordinator = coordinator
        self.committed: dict[str, dict[TopicPartition, Committed]] = {}
        """group id -> its committed offsets."""
        self.pending_txn: dict[str, dict[int, dict[TopicPartition, Committed]]] = {}
        """group id -> producer id -> offsets committed in its open transaction (TxnOffsetCommit)."""

    def handlers(self) -> dict[int, Callable[[int, Request], Any]]:
        return {
            TXN_OFFSET_COMMIT: self.txn_offset_commit,
            OFFSET_COMMIT: self.offset_commit,
            OFFSET_FETCH: self.offset_fetch,
        }

    def holds(self, group_id: str) -> bool:
        """Whether *group_id* has committed or pending offsets (its group is not cleaned up)."""
        return bool(self.committed.get(group_id)) or bool(self.pending_txn.get(group_id))

    def forget(self, group_id: str) -> None:
        """Drop what is kept for *group_id* (its group was cleaned up; :meth:`holds` was False)."""
        self.committed.pop(group_id, None)
        self.pending_txn.pop(group_id, None)

    # -- OffsetCommit / TxnOffsetCommit --------------------------------------------

    def _committer(
        self, into: Callable[[], dict[TopicPartition, Committed]]
    ) -> Callable[[str, Any], E]:
        """The per-partition commit of OffsetCommit and TxnOffsetCommit, storing in *into()*."""

        def commit(topic: str, p: Any) -> E:
            if self.state.partition(topic, p.partition_index) is None:
                return E.unknown_topic_or_partition
            meta = p.committed_metadata
            if meta is not None and len(meta.encode()) > MAX_OFFSET_METADATA:
                return E.offset_metadata_too_large
            epoch = getattr(p, "committed_leader_epoch", -1)
            into()[(topic, p.partition_index)] = (p.committed_offset, epoch, meta)
            return E.none

        return commit

    def _resolve(self, by_id: bool, topic: Any) -> tuple[str, uuid.UUID]:
        """(name, topic id) of a request topic; ("", id) or (name, ZERO) when unknown.

        v10+ names topics by id (KafkaApis resolves names from the metadata cache),
        older versions by name (KafkaApis looks the id up, ZERO_UUID when unknown).
        """
        if by_id:
            tid = topic.topic_id or ZERO_UUID
            known = self.state.topics_by_id.get(tid)
            return (known.name if known is not None else ""), tid
        named = self.state.topics.get(topic.name)
        return topic.name, (named.topic_id if named is not None else ZERO_UUID)

    def offset_commit(self, node_id: int, req: Request) -> Any:
        """KafkaApis.handleOffsetCommitRequest, then the group coordinator's commitOffsets."""
        return self._commit_flow(
            OFFSET_COMMIT, req, lambda valid: self._commit_offsets(node_id, req, valid)
        )

    def _commit_flow(
        self,
        api_key: int,
        req: Request,
        coordinator: Callable[[list[CommitTopic]], list[CommitAnswer]],
    ) -> Any:
        """What KafkaApis does with an OffsetCommit or TxnOffsetCommit request.

        KafkaApis answers unknown topic ids (UNKNOWN_TOPIC_ID, v10+), unknown topics
        and unknown partitions (UNKNOWN_TOPIC_OR_PARTITION) itself, in a response
        builder keyed by topic id (v10+) or name; what remains goes to the
        *coordinator*, whose answer (one topic per request topic) is merged in: a
        topic the builder holds gets the coordinator's partitions appended, others
        follow.  With nothing left, the coordinator is not asked at all.
        """
        b = req.body
        v = req.version
        by_id = api_key == OFFSET_COMMIT and v >= TOPIC_IDS_VERSION
        errors = _CommitBuilder(by_id)
        valid: list[CommitTopic] = []
        for t in b.topics:
            name, tid = self._resolve(by_id, t)
            if by_id and not name:
                errors.add_all(tid, name, t.partitions, E.unknown_topic_id)
            elif tid == ZERO_UUID:
                errors.add_all(tid, name, t.partitions, E.unknown_topic_or_partition)
            else:
                known = []
                for p in t.partitions:
                    if self.state.partition(name, p.partition_index) is None:
                        errors.add(tid, name, p.partition_index, E.unknown_topic_or_partition)
                    else:
                        known.append(p)
                if known:
                    valid.append((name, tid, known))
        if valid:
            errors.merge(coordinator(valid))
        cls = codec.response_schema(api_key, v)
        return build(cls, {"throttle_time": 0, "topics": errors.topics()})

    def _commit_offsets(
        self, node_id: int, req: Request, topics: list[CommitTopic]
    ) -> list[CommitAnswer]:
        """The group coordinator's commitOffsets: one answer per request topic, in order."""
        b = req.body
        now = req.now
        groups = self.coordinator
        groups.tick(now)

        everywhere = _everywhere(topics)

        # An empty group id is valid for offsets (Kafka's isValidGroupId for OffsetCommit).
        if not groups.is_coordinator(node_id, b.group_id):
            return everywhere(E.not_coordinator)
        generation = b.generation_id_or_member_epoch
        instance_id = getattr(b, "group_instance_id", None)
        if b.group_id not in groups.groups and generation >= 0:
            return everywhere(E.illegal_generation)
        g = groups.group_for_commit(b.group_id, now)
        error = groups.offset_commit_error(
            g, b.member_id, instance_id, generation, now, transactional=False
        )
        if error is not None:
            return everywhere(error)
        group_id = b.group_id
        return _answer(topics, self._committer(lambda: self.committed.setdefault(group_id, {})))

    def txn_offset_commit(self, node_id: int, req: Request) -> Any:
        """KafkaApis.handleTxnOffsetCommitRequest (as OffsetCommit's), then the coordinator."""
        return self._commit_flow(
            TXN_OFFSET_COMMIT, req, lambda valid: self._commit_txn_offsets(node_id, req, valid)
        )

    def _commit_txn_offsets(
        self, node_id: int, req: Request, topics: list[CommitTopic]
    ) -> list[CommitAnswer]:
        """GroupCoordinator.commitTransactionalOffsets."""
        b = req.body
        now = req.now
        groups = self.coordinator
        groups.tick(now)
        everywhere = _everywhere(topics)
        if not b.group_id:
            return everywhere(E.invalid_group_id)
        if not groups.is_coordinator(node_id, b.group_id):
            return everywhere(E.not_coordinator)
        # The __consumer_offsets partition must be in the transaction (AddOffsetsToTxn);
        # from v5 (transactions V2) the coordinator adds it instead (ADD_PARTITION).
        error = groups.transactions.verify(
            b.transactional_id,
            b.producer_id,
            b.producer_epoch,
            offsets_partition(b.group_id),
            generic=req.version >= 4,
            add_at=now if req.version >= 5 else None,
        )
        if error:
            return everywhere(error)
        g = groups.group_for_commit(b.group_id, now)
        generation = int(getattr(b, "generation_id", -1))
        member_id = getattr(b, "member_id", "")
        instance_id = getattr(b, "group_instance_id", None)
        member_error = groups.offset_commit_error(
            g, member_id, instance_id, generation, now, transactional=True
        )
        if member_error is not None:
            return everywhere(member_error)
        group_id, producer_id = b.group_id, b.producer_id

        def pending() -> dict[TopicPartition, Committed]:
            return self.pending_txn.setdefault(group_id, {}).setdefault(producer_id, {})

        return _answer(topics, self._committer(pending))

    def complete_txn_offsets(
        self, offsets_partition_index: int, producer_id: int, commit: bool
    ) -> None:
        """A transaction marker on a __consumer_offsets partition (handleTxnCompletion)."""
        for group_id, by_producer in self.pending_txn.items():
            if offsets_partition(group_id) != (OFFSETS_TOPIC, offsets_partition_index):
                continue
            pending = by_producer.pop(producer_id, None)
            if pending and commit:
                # Kafka replays the pending offsets in its maps' order into the group's.
                committed = self.committed.setdefault(group_id, {})
                for topic, partitions in _in_kafka_order(pending):
                    for partition in partitions:
                        committed[(topic, partition)] = pending[(topic, partition)]

    # -- OffsetFetch ---------------------------------------------------------------

    @staticmethod
    def _partition_answer(
        index: int, committed: Committed | None, error: E = E.none
    ) -> dict[str, Any]:
        offset, epoch, meta = committed if committed is not None else (-1, -1, "")
        return {
            "partition_index": index,
            "committed_offset": offset,
            "committed_leader_epoch": epoch,
            "metadata": meta if meta is not None else "",
            "error_code": error,
        }

    def _fetch_offsets(
        self,
        group_id: str,
        topics: list[tuple[str, uuid.UUID, list[int]]] | None,
        require_stable: bool = False,
    ) -> list[dict[str, Any]]:
        """The coordinator's fetchOffsets (*topics* None: fetchAllOffsets).

        Named topics are answered one per request topic, in request order; all
        topics in the order of Kafka's maps (:func:`timeline_hash_map_order`), each
        with the id the topic has now (ZERO if none).
        """
        offsets = self.committed.get(group_id, {})
        unstable: set[TopicPartition] = set()
        if require_stable:
            for pending in self.pending_txn.get(group_id, {}).values():
                unstable.update(pending)
        wanted: list[tuple[str, uuid.UUID, list[int]]]
        if topics is None:
            wanted = []
            for topic, partitions in _in_kafka_order(offsets):
                known = self.state.topics.get(topic)
                wanted.append((topic, known.topic_id if known else ZERO_UUID, partitions))
        else:
            wanted = topics
        out = []
        for topic, tid, partitions in wanted:
            parts = [
                self._partition_answer(index, None, E.unstable_offset_commit)
                if (topic, index) in unstable
                else self._partition_answer(index, offsets.get((topic, index)))
                for index in partitions
            ]
            out.append({"name": topic, "topic_id": tid, "partitions": parts})
        return out

    def _fetch_group(
        self, node_id: int, version: int, group_id: str, topics: Any | None, require_stable: bool
    ) -> dict[str, Any]:
        """KafkaApis.fetchOffsetsForGroup / fetchAllOffsetsForGroup (OffsetFetch v8+).

        v10+: topic ids the broker does not know answer UNKNOWN_TOPIC_ID after the
        coordinator's topics; fetching all topics leaves out topics that no longer
        exist (they have no id).
        """
        if not self.coordinator.is_coordinator(node_id, group_id):
            return {"group_id": group_id, "topics": [], "error_code": E.not_coordinator}
        if topics is None:
            answered = self._fetch_offsets(group_id, None, require_stable)
            if version >= TOPIC_IDS_VERSION:
                answered = [t for t in answered if t["topic_id"] != ZERO_UUID]
            return {"group_id": group_id, "topics": answered, "error_code": E.none}
        known: list[tuple[str, uuid.UUID, list[int]]] = []
        unknown: list[dict[str, Any]] = []
        for t in topics:
            name, tid = self._resolve(version >= TOPIC_IDS_VERSION, t)
            if version >= TOPIC_IDS_VERSION and not name:
                unknown.append(
                    {
                        "name": name,
                        "topic_id": tid,
                        "partitions": [
                            self._partition_answer(i, None, E.unknown_topic_id)
                            for i in t.partition_indexes
                        ],
                    }
                )
            else:
                known.append((name, tid, list(t.partition_indexes)))
        answered = self._fetch_offsets(group_id, known, require_stable)
        return {"group_id": group_id, "topics": answered + unknown, "error_code": E.none}

    def offset_fetch(self, node_id: int, req: Request) -> Any:
        b = req.body
        v = req.version
        groups = self.coordinator
        groups.tick(req.now)
        cls = codec.response_schema(OFFSET_FETCH, v)
        if v >= 8:
            answers = [
                self._fetch_group(node_id, v, grp.group_id, grp.topics, bool(b.require_stable))
                for grp in b.groups
            ]
            return build(cls, {"throttle_time": 0, "groups": answers})
        if not groups.is_coordinator(node_id, b.group_id):
            if v >= 2:
                return build(
                    cls, {"throttle_time": 0, "topics": [], "error_code": E.not_coordinator}
                )
            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": i,
                            "committed_offset": -1,
                            "metadata": "",
                            "error_code": E.not_coordinator,
                        }
                        for i in t.partition_indexes
                    ],
                }
                for t in b.topics
            ]
            return build(cls, {"throttle_time": 0, "topics": topics})
        wanted = (
            None
            if b.topics is None
            else [(t.name, ZERO_UUID, list(t.partition_indexes)) for t in b.topics]
        )
        return build(
            cls,
            {
                "throttle_time": 0,
                "topics": self._fetch_offsets(
                    b.group_id, wanted, bool(getattr(b, "require_stable", False))
                ),
                "error_code": E.none,
            },
        )


def _everywhere(topics: list[CommitTopic]) -> Callable[[E], list[CommitAnswer]]:
    """The coordinator's answer of one error for every partition it was given."""

    def answer(code: E) -> list[CommitAnswer]:
        return [(n, tid, [(p.partition_index, code) for p in ps]) for n, tid, ps in topics]

    return answer


def _answer(topics: list[CommitTopic], commit: Callable[[str, Any], E]) -> list[CommitAnswer]:
    return [(n, tid, [(p.partition_index, commit(n, p)) for p in ps]) for n, tid, ps in topics]


class _CommitBuilder:
    """OffsetCommitResponse.Builder: topics keyed by id (v10+) or name, in first-seen order."""

    def __init__(self, by_id: bool) -> None:
        self.by_id = by_id
        self._topics: dict[object, dict[str, Any]] = {}
        self._as_answered: list[dict[str, Any]] = []
        """The coordinator's topics, taken as they are when the builder held none."""

    def _topic(self, tid: uuid.UUID, name: str) -> dict[str, Any]:
        key = tid if self.by_id else name
        t = self._topics.get(key)
        if t is None:
            t = self._topics[key] = {"name": name, "topic_id": tid, "partitions": []}
        return t

    def add(self, tid: uuid.UUID, name: str, index: int, code: E) -> None:
        self._topic(tid, name)["partitions"].append({"partition_index": index, "error_code": code})

    def add_all(self, tid: uuid.UUID, name: str, partitions: Any, code: E) -> None:
        for p in partitions:
            self.add(tid, name, p.partition_index, code)

    def merge(self, answered: list[CommitAnswer]) -> None:
        """Builder.merge: the coordinator's topics, appended to the same key or added."""
        fresh = not self._topics
        for name, tid, parts in answered:
            t = {
                "name": name,
                "topic_id": tid,
                "partitions": [{"partition_index": i, "error_code": c} for i, c in parts],
            }
            key = tid if self.by_id else name
            if fresh:
                self._as_answered.append(t)
            elif key in self._topics:
                self._topics[key]["partitions"].extend(t["partitions"])
            else:
                self._topics[key] = t

    def topics(self) -> list[dict[str, Any]]:
        return list(self._topics.values()) + self._as_answered
