"""How the proxy names a partition of a Fetch: one key for sessions, shaping and the relay.

A partition key is ``(topic, partition index)``, the topic as the Fetch version
names it: its name up to v12 (``topic``), its id from v13 (``topic_id``, KIP-516).
Within one connection a client uses one of the two consistently; the proxy's
session with its broker uses one of the two too (``sessions.as_client_session``),
and converts between them where the two differ (``sessions.as_client``).  The
topic is None where a v13+ request carries the zero topic id (kio decodes it as
None) or where an id did not resolve to a name.

A plain tuple, not a ``NamedTuple`` or a dataclass: keys are built several times per
partition and fetch (a ``NamedTuple``'s construction runs in Python, about five times a
tuple literal's), and hashed and compared more often still, which a tuple does in C.
Its parts are read by unpacking (``topic, partition = key``).

The broker-side session cache keeps more than the key per partition, as Kafka's
``TopicIdPartition`` does (``sessions.as_broker_cache.TopicIdPartition``: the id *and*
the name, since it answers at the client's version and resolves names later); its
identity inside a session is this key.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

TopicKey = str | uuid.UUID | None
"""A topic as a Fetch names it: a name (v4..v12) or an id (v13+); None: the zero id."""
PartitionKey = tuple[TopicKey, int]
"""``(topic, partition index)``: see the module docstring."""

_FIELD_OF: dict[type, str] = {}
"""The identifying field of each kio topic class seen (bounded: kio defines a few topic
classes per version).  Looked up per class, not with ``hasattr`` per topic: on v4..v12
classes (slotted, no ``topic_id``) ``hasattr`` raises and catches an AttributeError
every time."""


def _field_of(topic: Any) -> str:
    cls = type(topic)
    name = _FIELD_OF.get(cls)
    if name is not None:
        return name
    if not dataclasses.is_dataclass(cls):  # a stand-in (tests): its attributes are its own
        return "topic_id" if hasattr(topic, "topic_id") else "topic"
    names = {f.name for f in dataclasses.fields(cls)}
    name = _FIELD_OF[cls] = "topic_id" if "topic_id" in names else "topic"
    return name


def topic_key(topic: Any) -> TopicKey:
    """The topic of a kio request ``FetchTopic`` / ``ForgottenTopic`` or a response
    ``FetchableTopicResponse``: its id from Fetch v13, else its name."""
    return getattr(topic, _field_of(topic))  # type: ignore[no-any-return]


def partition_name(key: PartitionKey) -> str:
    """``topic-partition`` (as Kafka prints a TopicPartition), for logs and snapshots."""
    topic, partition = key
    return f"{topic}-{partition}"
