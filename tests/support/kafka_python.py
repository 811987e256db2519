"""What the tests need to know about kafka-python (the client, not the proxy).

kafka-python 3.0.x drops a group leader's assignment when ``poll()``'s timeout expires
while a rejoin that a metadata change started is still in flight: the join task then
finishes inside ``_perform_assignment``, which makes ``need_rejoin()`` false, so the next
``poll()`` never awaits the finished task and never applies what SyncGroup returned.  The
consumer stays in the group with no partitions and fetches nothing.  It happens against
the dev cluster with no proxy in the path (``test_kafka_python_subscribe``, 3 runs in 30
with the machine loaded), and the first join of a freshly subscribed consumer often
starts before the topic's metadata has arrived, which is such a rejoin.

A ``poll()`` returns as soon as records arrive, so a long timeout costs a test nothing
when records flow; it only keeps the join from being cut short on a loaded machine.
"""

from __future__ import annotations

GROUP_POLL_MS = 5_000
"""``poll(timeout_ms=...)`` for a kafka-python consumer that subscribes in a group."""
