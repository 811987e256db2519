"""How shaping names a partition across Fetch versions.

Fetch v4..v12 name topics (``topic``); v13 and later use topic ids
(``topic_id``).  A partition key is ``(topic name or topic id, partition index)``;
within one connection the client uses one of the two consistently.
"""

from __future__ import annotations

import uuid
from typing import Any

TopicKey = str | uuid.UUID | None
PartitionKey = tuple[TopicKey, int]


def topic_key(topic: Any) -> TopicKey:
    """The key of a request FetchTopic / ForgottenTopic or a response FetchableTopicResponse."""
    if hasattr(topic, "topic_id"):
        return topic.topic_id  # type: ignore[no-any-return]
    return topic.topic  # type: ignore[no-any-return]


def topic_field(topic: Any) -> str:
    """The name of the field that identifies *topic* in its version ("topic" or "topic_id")."""
    return "topic_id" if hasattr(topic, "topic_id") else "topic"
