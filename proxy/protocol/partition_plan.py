"""What a Fetch asks of one partition: the plan both fetch sessions and the dev broker share.

Kafka's ``FetchRequest.PartitionData``: the fetch offset, the partition's byte limit,
the fetcher's log start offset and the two epochs (KIP-320's current leader epoch,
KIP-595's last fetched epoch).  It is what a KIP-227 session caches per partition
and compares to tell an altered partition, so one type serves every stage that reads
it: the broker-side cache toward clients (``sessions.as_broker_cache``, and the dev
broker through it) and the proxy's own session with its broker
(``sessions.as_client_session``), instead of one struct per half with the same
fields.

Absent values are -1, as on the wire (a version without the field, an unknown
epoch): an epoch below 0 is read as -1 (:func:`plan_of`), so Kafka's ``Optional``
empty is ``epoch < 0``.

A ``NamedTuple``: built once per partition and fetch from the decoded request
(a slotted frozen dataclass's construction costs about three times as much),
compared per session partition on every fetch (a tuple's equality runs in C).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .messages import kio_class_with, make

NO_EPOCH = -1
"""An epoch the request does not carry."""


class PartitionPlan(NamedTuple):
    """One partition's fetch parameters (see the module docstring)."""

    fetch_offset: int
    partition_max_bytes: int
    log_start_offset: int = -1
    current_leader_epoch: int = NO_EPOCH
    last_fetched_epoch: int = NO_EPOCH


def plan_of(partition: Any) -> PartitionPlan:
    """The plan of a kio request ``FetchPartition`` of any version (v4+)."""
    kind = type(partition)
    if kind in FROM_V9:
        # kio's classes of v9+ (their fields always ints): the fields read straight, the
        # tuple made without NamedTuple's keyword-default constructor.  Once per partition
        # of every client fetch, so this costs per partition what the general path did.
        leader_epoch = partition.current_leader_epoch
        fetched_epoch = partition.last_fetched_epoch if kind in _FROM_V12 else NO_EPOCH
        return _new_plan(
            PartitionPlan,
            (
                partition.fetch_offset,
                partition.partition_max_bytes,
                partition.log_start_offset,
                leader_epoch if leader_epoch >= 0 else NO_EPOCH,
                fetched_epoch if fetched_epoch >= 0 else NO_EPOCH,
            ),
        )
    leader_epoch = int(getattr(partition, "current_leader_epoch", NO_EPOCH))
    fetched_epoch = int(getattr(partition, "last_fetched_epoch", NO_EPOCH))
    plan = PartitionPlan(
        int(partition.fetch_offset),
        int(partition.partition_max_bytes),
        int(getattr(partition, "log_start_offset", -1)),
        leader_epoch if leader_epoch >= 0 else NO_EPOCH,
        fetched_epoch if fetched_epoch >= 0 else NO_EPOCH,
    )
    plain_from_v9(kind)  # looks at the class once: the next of its kind is fast
    return plan


def plain_from_v9(kind: type) -> bool:
    """Whether *kind* is one of kio's request ``FetchPartition`` classes of v9+, whose
    fetch offset, partition max bytes, log start offset and current leader epoch are
    always ints that a per-partition walk may read straight (``plan_of``'s fast path)."""
    if kind not in _SEEN:
        _SEEN.add(kind)
        if kio_class_with(kind, PartitionPlan._fields[:4]):
            FROM_V9.add(kind)
            if kio_class_with(kind, PartitionPlan._fields):
                _FROM_V12.add(kind)
    return kind in FROM_V9


FROM_V9: set[type] = set()
"""kio ``FetchPartition`` classes with a current leader epoch and a log start offset (v9+)."""
_FROM_V12: set[type] = set()
"""Those of them with a last fetched epoch too (v12+)."""
_SEEN: set[type] = set()
"""Classes looked at once (kio's are a bounded set; anything else is never fast)."""
_new_plan = tuple.__new__


def fetch_partition(mod: Any, partition: int, plan: PartitionPlan) -> Any:
    """The kio request ``FetchPartition`` of *mod*'s version for *plan* (the inverse of
    :func:`plan_of`): how both sessions write the partitions of the Fetch they build."""
    return make(
        mod.FetchPartition,
        partition=partition,
        fetch_offset=plan.fetch_offset,
        partition_max_bytes=plan.partition_max_bytes,
        log_start_offset=plan.log_start_offset,
        current_leader_epoch=plan.current_leader_epoch,
        last_fetched_epoch=plan.last_fetched_epoch,
    )
