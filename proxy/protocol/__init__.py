"""Sans-I/O Kafka protocol layer shared by the proxy and the dev broker.

Nothing in this package imports trio or touches sockets: every function takes
bytes (or kio objects) and returns bytes (or kio objects).  It imports nothing
else from the proxy either; everything above it builds on it.

- :mod:`.apis`, :mod:`.error_codes`: Kafka's API keys and the error codes the
  fetch path acts on.
- :mod:`.errors`: the one exception family that escapes (``ProtocolError``).
- :mod:`.framing`: size-prefixed frames in and out, bounded.
- :mod:`.varint`, :mod:`.codec`: headers and bodies, decoded and encoded with kio's
  schemas; every body is decoded by one compiled, validating pass (:mod:`.readers`)
  and encoded by compiled writers (:mod:`.writers`).
- :mod:`.fetch_views`: a Fetch response decoded with its records left as views of
  the frame; :mod:`.fetch_count`: a Fetch request's partitions counted from its bytes.
- :mod:`.walk`: schema-driven walks of encoded messages: byte-level rewriting (broker
  addresses, ApiVersions), field spans, the layout the Fetch count follows.  Bodies are
  no longer walked before they are decoded: ``walk.check`` is the verdict the tests
  hold the readers to.
- :mod:`.messages`: kio message classes by version, and entities built across versions.
- :mod:`.partition_key`: the one key of a Fetch's partition (topic name or id, partition
  index) that sessions, shaping and the relay share; :mod:`.partition_plan`: what a
  Fetch asks of one partition (offset, byte limit, epochs), the one type both fetch
  sessions and the dev broker keep; :mod:`.partition_result`: what an answer says of
  one partition besides its records (error, watermarks, sizes, redirect, divergence),
  read from kio once for both sessions.
- :mod:`.records`: RecordBatch v2 headers, read without decompressing anything.
"""
