"""Consumer groups' committed offsets, as Apache Kafka's group coordinator keeps them.

OffsetCommit, TxnOffsetCommit and OffsetFetch.  Whether a request may commit
is the group's business (:meth:`GroupCoordinator.offset_commit_error
<devbroker.membership.GroupCoordinator.offset_commit_error>`, Kafka's
validateOffsetCommit); a commit to an unknown group creates it, empty.
TxnOffsetCommit keeps offsets pending until the transaction's marker reaches
the group's ``__consumer_offsets`` partition (:meth:`OffsetManager.complete_txn_offsets`,
called by the transaction coordinator); meanwhile OffsetFetch with
require_stable answers UNSTABLE_OFFSET_COMMIT for them.

Sans-I/O: no trio here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from proxy.protocol import codec
from proxy.protocol.apis import OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT

from .build import build
from .state import ClusterState
from .transactions import OFFSETS_TOPIC, offsets_partition

if TYPE_CHECKING:
    from .membership import GroupCoordinator
    from .node import Request

MAX_OFFSET_METADATA = 4096  # offset.metadata.max.bytes

TopicPartition = tuple[str, int]
Committed = tuple[int, int, str | None]
"""(offset, leader epoch, metadata) of one committed partition."""


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

    def _commit_responders(
        self, api_key: int, req: Request
    ) -> tuple[Callable[[Callable[[str, Any], E]], Any], Callable[[E], Any]]:
        """(respond, everywhere) for an OffsetCommit or TxnOffsetCommit request.

        ``respond(code_for)`` answers every partition with ``code_for(topic, partition)``;
        ``everywhere(code)`` answers *code*, except that unknown partitions get
        UNKNOWN_TOPIC_OR_PARTITION (Kafka answers those before the coordinator sees
        the request).
        """
        cls = codec.response_schema(api_key, req.version)
        b = req.body

        def respond(code_for: Callable[[str, Any], E]) -> Any:
            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": code_for(t.name, p)}
                        for p in t.partitions
                    ],
                }
                for t in b.topics
            ]
            return build(cls, {"throttle_time": 0, "topics": topics})

        def everywhere(code: E) -> Any:
            return respond(
                lambda t, p: (
                    E.unknown_topic_or_partition
                    if self.state.partition(t, p.partition_index) is None
                    else code
                )
            )

        return respond, everywhere

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

    def offset_commit(self, node_id: int, req: Request) -> Any:
        b = req.body
        now = req.now
        groups = self.coordinator
        groups.tick(now)
        respond, everywhere = self._commit_responders(OFFSET_COMMIT, req)

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
        return respond(self._committer(lambda: self.committed.setdefault(group_id, {})))

    def txn_offset_commit(self, node_id: int, req: Request) -> Any:
        """GroupCoordinator.handleTxnCommitOffsets (after KafkaApis' unknown-partition check)."""
        b = req.body
        now = req.now
        groups = self.coordinator
        groups.tick(now)
        respond, everywhere = self._commit_responders(TXN_OFFSET_COMMIT, req)

        if not b.group_id:
            return everywhere(E.invalid_group_id)
        if not groups.is_coordinator(node_id, b.group_id):
            return everywhere(E.not_coordinator)
        # The __consumer_offsets partition must be in the transaction (AddOffsetsToTxn).
        error = groups.transactions.verify(
            b.transactional_id,
            b.producer_id,
            b.producer_epoch,
            offsets_partition(b.group_id),
            generic=req.version >= 4,
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

        return respond(self._committer(pending))

    def complete_txn_offsets(
        self, offsets_partition_index: int, producer_id: int, commit: bool
    ) -> None:
        """A transaction marker on a __consumer_offsets partition (handleTxnCompletion)."""
        for group_id, by_producer in self.pending_txn.items():
            if offsets_partition(group_id) != (OFFSETS_TOPIC, offsets_partition_index):
                continue
            pending = by_producer.pop(producer_id, None)
            if pending and commit:
                self.committed.setdefault(group_id, {}).update(pending)

    # -- OffsetFetch ---------------------------------------------------------------

    def _fetch_offsets(
        self, group_id: str, topics: Any | None, require_stable: bool = False
    ) -> list[dict[str, Any]]:
        offsets = self.committed.get(group_id, {})
        unstable: set[TopicPartition] = set()
        if require_stable:
            for pending in self.pending_txn.get(group_id, {}).values():
                unstable.update(pending)
        wanted: dict[str, list[int]] = {}
        if topics is None:
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
        else:
            for t in topics:
                wanted.setdefault(t.name, []).extend(t.partition_indexes)
        out = []
        for topic, partitions in wanted.items():
            parts = []
            for index in partitions:
                if (topic, index) in unstable:
                    parts.append(
                        {
                            "partition_index": index,
                            "committed_offset": -1,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": E.unstable_offset_commit,
                        }
                    )
                    continue
                offset, epoch, meta = offsets.get((topic, index), (-1, -1, ""))
                parts.append(
                    {
                        "partition_index": index,
                        "committed_offset": offset,
                        "committed_leader_epoch": epoch,
                        "metadata": meta if meta is not None else "",
                        "error_code": E.none,
                    }
                )
            out.append({"name": topic, "partitions": parts})
        return out

    def offset_fetch(self, node_id: int, req: Request) -> Any:
        b = req.body
        v = req.version
        groups = self.coordinator
        groups.tick(req.now)
        cls = codec.response_schema(OFFSET_FETCH, v)
        if v >= 8:
            answers = []
            for grp in b.groups:
                if not groups.is_coordinator(node_id, grp.group_id):
                    answers.append(
                        {"group_id": grp.group_id, "topics": [], "error_code": E.not_coordinator}
                    )
                else:
                    answers.append(
                        {
                            "group_id": grp.group_id,
                            "topics": self._fetch_offsets(
                                grp.group_id, grp.topics, bool(b.require_stable)
                            ),
                            "error_code": E.none,
                        }
                    )
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
        return build(
            cls,
            {
                "throttle_time": 0,
                "topics": self._fetch_offsets(
                    b.group_id, b.topics, bool(getattr(b, "require_stable", False))
                ),
                "error_code": E.none,
            },
        )
