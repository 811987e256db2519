"""Per-client limit policies: which :class:`~.limits.Limits` a connection gets.

A policy matches a connection by client_id glob and/or listener name glob
(``fnmatch`` rules, case-sensitive; a client that sends no client_id is
matched as the empty string).  The first matching policy in configuration
order applies; its limits override the global ones field by field, and a
field the policy leaves unset (None) keeps the global value.  With no match
the global limits apply, under the policy name ``"default"``.

A policy may also set ``rack_override = true``: the proxy's own ``rack``
replaces a rack the client sent itself in its Fetch (KIP-392; see
:mod:`proxy.relay.rack_fetch`).  By default a client's own rack is kept, and the
proxy's is sent only for clients that send none.

Config loading and reload belong to the config layer; this is the pure
matching logic it (and each connection, when its client_id becomes known)
calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from .limits import LIMIT_NAMES, InvalidLimits, Limits

DEFAULT_POLICY = "default"


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    limits: Limits
    """Fields set here replace the global value; None keeps it."""
    client_id: str | None = None
    """Glob on the request header's client_id; None matches any client."""
    listener: str | None = None
    """Glob on the listener's name; None matches any listener."""
    rack_override: bool = False
    """The proxy's ``rack`` replaces the rack a matching client sends itself."""

    def matches(self, client_id: str | None, listener: str | None) -> bool:
        if self.client_id is not None and not fnmatchcase(client_id or "", self.client_id):
            return False
        return self.listener is None or fnmatchcase(listener or "", self.listener)

    @classmethod
    def from_mapping(cls, name: str, entry: Mapping[str, object]) -> Policy:
        """A policy from a config table: ``client_id``, ``listener``, ``rack_override`` and
        limit keys."""
        unknown = set(entry) - {"client_id", "listener", "rack_override", *LIMIT_NAMES}
        if unknown:
            raise InvalidLimits(f"policy {name!r}: unknown keys {sorted(unknown)}")
        client_id, listener = entry.get("client_id"), entry.get("listener")
        for key, value in (("client_id", client_id), ("listener", listener)):
            if value is not None and not isinstance(value, str):
                raise InvalidLimits(f"policy {name!r}: {key} must be a string, not {value!r}")
        rack_override = entry.get("rack_override", False)
        if not isinstance(rack_override, bool):
            raise InvalidLimits(
                f"policy {name!r}: rack_override must be true or false, not {rack_override!r}"
            )
        try:
            limits = Limits(**{k: entry[k] for k in LIMIT_NAMES if k in entry})  # type: ignore[arg-type]
        except InvalidLimits as exc:
            raise InvalidLimits(f"policy {name!r}: {exc}") from exc
        return cls(name, limits, client_id, listener, rack_override)  # type: ignore[arg-type]


def overridden(base: Limits, override: Limits) -> Limits:
    """*base* with every field *override* sets replaced."""
    values = base.as_dict()
    values.update({k: v for k, v in override.as_dict().items() if v is not None})
    return Limits(**values)


def select(
    policies: Iterable[Policy], client_id: str | None, listener: str | None, default: Limits
) -> tuple[str, Limits]:
    """(policy name, effective limits) for a connection."""
    for policy in policies:
        if policy.matches(client_id, listener):
            return policy.name, overridden(default, policy.limits)
    return DEFAULT_POLICY, default


def rack_override(policies: Iterable[Policy], client_id: str | None, listener: str | None) -> bool:
    """The ``rack_override`` of the policy a connection gets (first match; none: False)."""
    for policy in policies:
        if policy.matches(client_id, listener):
            return policy.rack_override
    return False
