"""Fail closed: no response the proxy offers can tell a client where a broker really is.

The address-bearing (api_key, version) pairs are derived here from kio's
generated response classes, independently of the proxy's own reading
(``proxy.relay.endpoints``): every ``kio.schema.*.response`` module is
imported, every response class walked through its type hints, and any entity
with a host-like and a port-like field counts.  For each pair, an instance
with every array non-empty is encoded and put through the proxy's rewrite:
either every such entity comes out pointing at the proxy, or ApiVersions never
offers that version and the relay refuses the request.  A kio release that
adds such an API (or an address to an existing one) fails this test until the
proxy handles it.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import pkgutil
import typing
import uuid
from typing import Any

import kio.schema
import pytest
from kio.static.constants import EntityType

from proxy.protocol import codec
from proxy.protocol.errors import ProtocolError
from proxy.relay import apiversions, endpoints, rewrite
from proxy.relay.relay import Relay

PROXY = ("proxy.test", 4321)
UPSTREAM = ("broker.internal", 19092)

NOT_BROKER_ADDRESSES = {
    # KIP-1071: a Kafka Streams instance's application.server, which other
    # instances and applications contact directly; it must pass unchanged.
    (88, "Endpoint"),
    (89, "Endpoint"),
}


def _host_like(name: str) -> bool:
    return name == "host" or name.endswith("_host")


def _port_like(name: str) -> bool:
    return name == "port" or name.endswith("_port")


def _is_address(cls: Any) -> bool:
    names = [f.name for f in dataclasses.fields(cls)]
    return any(map(_host_like, names)) and any(map(_port_like, names))


def _entity_types(hint: Any) -> list[type]:
    """The dataclasses a field's type hint refers to (through tuples and optionals)."""
    if typing.get_origin(hint) is not None:
        return [t for arg in typing.get_args(hint) for t in _entity_types(arg)]
    return [hint] if dataclasses.is_dataclass(hint) and isinstance(hint, type) else []


def _hints(cls: Any) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


def _reachable(cls: type, seen: dict[type, None]) -> dict[type, None]:
    if cls not in seen:
        seen[cls] = None
        for hint in _hints(cls).values():
            for inner in _entity_types(hint):
                _reachable(inner, seen)
    return seen


def _response_classes() -> list[Any]:
    out: list[Any] = []
    for info in pkgutil.walk_packages(kio.schema.__path__, "kio.schema."):
        if not info.name.endswith(".response"):
            continue
        module = importlib.import_module(info.name)
        out.extend(
            v
            for v in vars(module).values()
            if isinstance(v, type) and getattr(v, "__type__", None) is EntityType.response
        )
    return sorted(out, key=lambda c: (int(c.__api_key__), int(c.__version__)))


RESPONSES = _response_classes()
ADDRESS_BEARING = {
    (int(cls.__api_key__), int(cls.__version__)): cls
    for cls in RESPONSES
    if any(
        _is_address(e) and (int(cls.__api_key__), e.__name__) not in NOT_BROKER_ADDRESSES
        for e in _reachable(cls, {})
    )
}


# --- an instance of any kio response, every array holding one element ------------------


def _value(hint: Any, field_name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return (_value(typing.get_args(hint)[0], field_name),)
    if origin is not None:  # X | None: the value, never None
        return _value(next(a for a in typing.get_args(hint) if a is not type(None)), field_name)
    if dataclasses.is_dataclass(hint):
        return _instance(hint)
    if isinstance(hint, type) and issubclass(hint, bool):
        return False
    if isinstance(hint, type) and issubclass(hint, int):
        members = getattr(hint, "__members__", None)
        if members:  # ErrorCode
            return next(iter(members.values()))
        return hint(UPSTREAM[1] if _port_like(field_name) else 1)
    if hint is float or (isinstance(hint, type) and issubclass(hint, float)):
        return hint(0.5)
    if isinstance(hint, type) and issubclass(hint, str):
        return hint(UPSTREAM[0] if _host_like(field_name) else "x")
    if isinstance(hint, type) and issubclass(hint, bytes):
        return hint(b"")
    if hint is uuid.UUID:
        return uuid.UUID(int=1)
    if isinstance(hint, type) and issubclass(hint, datetime.timedelta):
        return hint.parse(datetime.timedelta(0))  # type: ignore[attr-defined]
    if isinstance(hint, type) and issubclass(hint, datetime.datetime):
        return hint.parse(datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC))  # type: ignore[attr-defined]
    raise AssertionError(f"no value for {hint!r}")


def _instance(cls: Any) -> Any:
    return cls(**{name: _value(hint, name) for name, hint in _hints(cls).items()})


def _addresses(obj: Any, api_key: int) -> list[tuple[str, tuple[Any, Any]]]:
    """(entity name, (host, port)) of every address-like entity in a decoded message."""
    if isinstance(obj, tuple):
        return [a for x in obj for a in _addresses(x, api_key)]
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return []
    found = []
    cls = type(obj)
    if _is_address(cls) and (api_key, cls.__name__) not in NOT_BROKER_ADDRESSES:
        names = [f.name for f in dataclasses.fields(obj)]
        host = next(getattr(obj, n) for n in names if _host_like(n))
        port = next(getattr(obj, n) for n in names if _port_like(n))
        found.append((cls.__name__, (host, int(port))))
    for f in dataclasses.fields(obj):
        found.extend(_addresses(getattr(obj, f.name), api_key))
    return found


def _to_proxy(node_id: int, host: str, port: int) -> tuple[str, int]:
    return PROXY


def rewritten_by_the_proxy(api_key: int, version: int) -> bool:
    cls = ADDRESS_BEARING[(api_key, version)]
    original = _instance(cls)
    assert all(addr == UPSTREAM for _, addr in _addresses(original, api_key))
    frame = codec.encode_response(original, 5)
    try:
        out = rewrite.rewrite_response(api_key, version, frame, _to_proxy)
    except Exception:
        return False
    body = codec.decode_response(api_key, version, out)[1]
    found = _addresses(body, api_key)
    assert found, f"{cls.__name__}: the instance holds no address"
    return all(addr == PROXY for _, addr in found)


def test_the_derivation_finds_the_known_address_bearing_apis() -> None:
    """Guard against a derivation that finds nothing (and so proves nothing)."""
    assert len(RESPONSES) > 250
    expected = {(3, 0), (3, 13), (10, 0), (10, 6), (60, 0), (1, 16), (1, 18), (0, 10), (0, 13)}
    expected |= {(55, 2), (52, 1), (82, 0), (78, 1), (78, 2), (79, 1), (79, 2)}
    assert expected <= set(ADDRESS_BEARING)
    assert (1, 15) not in ADDRESS_BEARING and (0, 9) not in ADDRESS_BEARING
    assert (88, 0) not in ADDRESS_BEARING  # Streams application endpoints only


@pytest.mark.parametrize(("api_key", "version"), sorted(ADDRESS_BEARING))
def test_every_address_bearing_version_is_rewritten_or_never_offered(
    api_key: int, version: int
) -> None:
    advertised = apiversions.proxy_range(api_key, (0, 32767))
    offered = advertised is not None and advertised[0] <= version <= advertised[1]
    if rewritten_by_the_proxy(api_key, version):
        assert offered, "rewritten, so it should be offered"
        return
    assert not offered, f"api_key={api_key} v{version} leaks broker addresses"
    relay = Relay(_to_proxy)
    with pytest.raises(ProtocolError):
        relay.client_frame(codec.encode_request(_instance(_request(api_key, version)), 1, "c"))
    assert relay.take_upstream() == []


def _request(api_key: int, version: int) -> Any:
    schema = codec.request_schema(api_key, version)
    assert schema is not None
    return schema


def test_what_is_not_rewritten_today() -> None:
    """The decision recorded: controller endpoints (DescribeQuorum v2, Raft APIs) stay out."""
    left_out = {
        key_version for key_version in ADDRESS_BEARING if not rewritten_by_the_proxy(*key_version)
    }
    assert left_out == {(52, 1), (52, 2), (53, 1), (54, 1), (55, 2), (59, 1), (82, 0)}
    assert apiversions.proxy_range(55, (0, 2)) == (0, 1)


@pytest.mark.parametrize("api_key", [88, 89])
def test_streams_application_endpoints_pass_unchanged(api_key: int) -> None:
    cls = codec.response_schema(api_key, 0)
    frame = codec.encode_response(_instance(cls), 3)
    assert b"broker.internal" in frame  # the instance does hold an endpoint
    assert rewrite.rewrite_response(api_key, 0, frame, _to_proxy) is frame
    assert apiversions.proxy_range(api_key, (0, 0)) == (0, 0)


def test_every_api_kio_knows_but_none_it_does_not_is_offered() -> None:
    keys = sorted({int(c.__api_key__) for c in RESPONSES})
    for key in keys:
        rng = apiversions.kio_range(key)
        assert rng is not None
        offered = apiversions.proxy_range(key, (0, 32767))
        if all((key, v) in ADDRESS_BEARING for v in range(rng[0], rng[1] + 1)) and offered is None:
            continue  # every version leaks (UpdateRaftVoter)
        assert offered is not None and offered[1] <= rng[1]
    assert apiversions.proxy_range(max(keys) + 1, (0, 3)) is None
    assert apiversions.proxy_range(1, (4, 99)) == (4, apiversions.kio_range(1)[1])  # type: ignore[index]
    assert endpoints.advertisable(1, 18) and not endpoints.advertisable(1, 99)
