"""KIP-227 incremental fetch sessions, in two halves.

Downstream, the proxy as the broker toward its clients: ``downstream_cache``
(the session cache, shared with the dev broker) and ``downstream`` (a client's
fetch in, one sessionless full fetch out; the full response in, what the
client gets out).  Upstream, the proxy as a session client toward its broker:
``upstream_session`` (the session) and ``upstream`` (full fetches served
through it, complete full responses synthesised).  Both halves speak KIP-227's
vocabulary from ``kip227`` (session ids, epochs and their rules, the Fetch
versions, the replica id) and build the client's Fetch and its answer with
``client_fetch`` (the consumer's request, topic grouping, ``ClientReply``,
``TranslationError``); neither half imports the other.  ``proxy.fetchpath``
calls them in order.
"""
