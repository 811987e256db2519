"""Which proxy address stands for which broker, and where each broker really is.

Sans-I/O.  ``AddressBook.resolve`` is the resolver the rewriting rules call for
every broker endpoint a response announces: it records the broker's real
address (brokers may move) and returns the proxy's advertised address for that
node id.  The first time a node id is seen, ``bind(node_id, port)`` is called
(synchronously) so a listener exists *before* the rewritten response reaches
the client; it returns the bound port (useful when the wanted port is 0) or
None when binding failed, in which case the node is retried next time.
"""

from __future__ import annotations

from collections.abc import Callable


class AddressBook:
    def __init__(
        self,
        advertised_host: str,
        port_for: Callable[[int], int],
        bind: Callable[[int, int], int | None],
    ) -> None:
        self.advertised_host = advertised_host
        self._port_for = port_for
        self._bind = bind
        self.upstream: dict[int, tuple[str, int]] = {}
        """node id -> the broker's real (host, port), as last announced upstream."""
        self.advertised: dict[int, tuple[str, int]] = {}
        """node id -> (advertised host, port) of the proxy's listener for it."""

    def resolve(self, node_id: int, host: str, port: int) -> tuple[str, int] | None:
        if node_id < 0:
            return None
        if host and port > 0:
            self.upstream[node_id] = (host, port)
        known = self.advertised.get(node_id)
        if known is not None:
            return known
        bound = self._bind(node_id, self._port_for(node_id))
        if bound is None:
            return None
        self.advertised[node_id] = (self.advertised_host, bound)
        return self.advertised[node_id]
