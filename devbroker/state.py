"""The dev cluster's metadata and logs: what every node of the in-process cluster shares.

Sans-I/O: plain objects, no trio.  The trio edge (``cluster.py``) owns one
``ClusterState`` and gives each node a view of it; node-local state (fetch
sessions) lives with the node.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from .log import PartitionLog
from .producers import ProducerStates


@dataclass(slots=True)
class PartitionState:
    topic: str
    index: int
    topic_id: uuid.UUID
    leader: int
    """Node id of the leader (single replica: the only replica)."""
    leader_epoch: int = 0
    log: PartitionLog = field(default_factory=PartitionLog)
    producers: ProducerStates = field(default_factory=ProducerStates)


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionState]


@dataclass(slots=True)
class ClusterState:
    cluster_id: str
    node_ids: list[int]
    topics: dict[str, TopicState] = field(default_factory=dict)
    topics_by_id: dict[uuid.UUID, TopicState] = field(default_factory=dict)
    stopped_nodes: set[int] = field(default_factory=set)
    addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    """node id -> (host, port) each node advertises (filled in when its listener binds)."""
    next_producer_id: int = 1000

    def live_nodes(self) -> list[int]:
        return [n for n in self.node_ids if n not in self.stopped_nodes and n in self.addresses]

    def allocate_producer_id(self) -> int:
        pid = self.next_producer_id
        self.next_producer_id += 1
        return pid

    def create_topic(
        self, name: str, partitions: int, topic_id: uuid.UUID | None = None
    ) -> TopicState:
        """Create a topic with leaders spread round-robin over the nodes.

        *topic_id* (default: a random one) lets a test give a topic the id another
        cluster gave it, so that answers ordered by hash codes are comparable.
        """
        if name in self.topics:
            raise ValueError(f"topic {name!r} exists")
        if partitions <= 0:
            raise ValueError("partitions must be positive")
        topic_id = topic_id if topic_id is not None else uuid.uuid4()
        if topic_id in self.topics_by_id or topic_id.int == 0:
            raise ValueError(f"topic id {topic_id} is in use or invalid")
        offset = len(self.topics)  # vary the first leader between topics
        topic = TopicState(
            name,
            topic_id,
            [
                PartitionState(name, i, topic_id, self.node_ids[(i + offset) % len(self.node_ids)])
                for i in range(partitions)
            ],
        )
        self.topics[name] = topic
        self.topics_by_id[topic_id] = topic
        return topic

    def partition(self, topic: str, index: int) -> PartitionState | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return t.partitions[index]
