"""Fetch shaping: byte and record caps, fair rotation, the reuse buffer, the memory budget.

Sans-I/O: everything here is plain code over kio Fetch request/response objects
and RecordBatch v2 headers; partitions are keyed by the fetch path's one key,
:data:`proxy.protocol.partition_key.PartitionKey`.  No trio import; the fetch path
(``proxy.fetchpath``) calls it, and it imports only the protocol layer below it.

Modules, one per feature:

- :mod:`.limits`: the configured :class:`~.limits.Limits`, request clamping,
  the per-response :class:`~.limits.ResponseLimits`, and the names of what held
  data back (:class:`~.limits.LimitKind`).
- :mod:`.policy`: per-client policies (client_id / listener globs) over the
  global limits.
- :mod:`.trim`: trimming a Fetch response to whole batches within the limits
  (KIP-74 progress guarantee, aborted transactions kept consistent).
- :mod:`.rotation`: upstream round-robin order and serve-order rotation with a
  starvation measure.
- :mod:`.buffer`: the per-connection reuse buffer of trimmed-away batches.
- :mod:`.budget`: the proxy-wide memory budget (KIP-81's buffer.memory), taken when a
  response's size is known, and the admission (fair share, waiters) to it.
- :mod:`.decision`: the per-response decision record for logs and metrics.
- :mod:`.shaper`: the per-connection composition the fetch path calls.
"""
