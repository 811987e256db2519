"""KIP-227 incremental fetch sessions, in two halves named for the role the proxy plays.

As a broker toward its clients (Kafka's ``FetchSession.scala``): ``as_broker_cache``
(the broker-side cache of the clients' sessions, shared with the dev broker) and
``as_broker`` (a client's fetch in, one sessionless full fetch out; the full response
in, what the client gets out).  As a client toward its broker (Kafka's
``FetchSessionHandler``): ``as_client_session`` (the proxy's own session with the
broker) and ``as_client`` (full fetches served through it, complete full responses
synthesised).  Both halves speak KIP-227's vocabulary from ``kip227`` (session ids,
epochs and their rules, the Fetch versions, the replica id) and build the client's
Fetch and its answer with ``client_fetch`` (``ClientFetch``, the client's Fetch validated
once at decode; the consumer's request, topic grouping, ``ClientReply``,
``TranslationError``); neither half imports the other (import-linter
contracts in ``pyproject.toml``).  ``proxy.fetchpath`` calls them in order.  Metrics
and logs keep the words ``downstream`` (toward clients) and ``upstream`` (toward the
broker).
"""
