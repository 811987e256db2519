"""Property tests: the byte-level rewriter agrees with kio on every version it rewrites.

For random messages of every (API, version) whose responses the proxy rewrites
(and ApiVersions), generated from kio's types: walking with a hook that
changes nothing returns the very same bytes, and rewriting endpoints gives
exactly kio's encoding of the message with those endpoints replaced.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from proxy.protocol import codec, walk
from proxy.protocol.apis import API_VERSIONS, PRODUCE
from proxy.relay import rewrite

# kio registers strategies for its primitives but not for Records (opaque batch bytes here)
st.register_type_strategy(Records, st.binary(max_size=40).map(Records.parse))

SCHEMAS = [
    (api_key, version)
    for api_key in sorted(rewrite.REWRITTEN_APIS | {API_VERSIONS})
    for version in range(20)
    if codec.response_schema(api_key, version) is not None
    and (api_key == API_VERSIONS or rewrite.needs_rewrite(api_key, version))
]


def advertised(node_id: int) -> tuple[str, int]:
    return (f"proxy-{node_id % 7}.local", 20000 + node_id % 1000)


def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
    return advertised(node_id)


def expected(obj: Any) -> Any:
    """kio's view of the rewrite: every endpoint with a node id >= 0 points at the proxy."""
    if isinstance(obj, tuple):
        return tuple(expected(x) for x in obj)
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    changes = {f.name: expected(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if rewrite.is_endpoint(type(obj)):
        node = changes.get("node_id", changes.get("broker_id"))
        if node >= 0:
            host, port = advertised(node)
            changes.update(host=host, port=type(obj.port)(port))
    return dataclasses.replace(obj, **changes)


class KeepAll:
    def wants(self, cls: type) -> bool:
        return True

    def __call__(self, cls: type, buf: bytes, spans: Any, start: int, end: int) -> None:
        return None


@st.composite
def messages(draw: st.DrawFn) -> tuple[int, int, Any]:
    api_key, version = draw(st.sampled_from(SCHEMAS))
    return api_key, version, draw(st.from_type(codec.response_schema(api_key, version)))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messages(), st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_walk_agrees_with_kio(message: tuple[int, int, Any], cid: int) -> None:
    api_key, version, obj = message
    frame = codec.encode_response(obj, cid)
    hv = codec.response_header_version(api_key, version)
    assert hv is not None
    schema = codec.response_schema(api_key, version)
    # a hook that keeps everything: the same object back, the whole body consumed
    assert walk.rewrite(schema, frame, codec.response_body_offset(frame, hv), KeepAll()) is frame
    if api_key == API_VERSIONS:
        return
    out = rewrite.rewrite_response(api_key, version, frame, resolve)
    got_cid, body = codec.decode_response(api_key, version, out)
    assert got_cid == cid
    assert body == expected(obj)
    assert out == codec.encode_response(expected(obj), cid)


PRODUCE_VERSIONS = [
    v
    for v in range(10, rewrite.PRODUCE_SKIPPED_MAX + 1)
    if codec.response_schema(PRODUCE, v) is not None
]


@st.composite
def produce_responses(draw: st.DrawFn) -> tuple[int, Any]:
    version = draw(st.sampled_from(PRODUCE_VERSIONS))
    return version, draw(st.from_type(codec.response_schema(PRODUCE, version)))


@settings(
    max_examples=120,  # 300 took some 30 s of a loaded worker in the suite's parallel run
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(produce_responses(), st.integers(min_value=-(2**31), max_value=2**31 - 1), st.data())
def test_a_produce_answer_is_skipped_exactly_when_it_names_no_node(
    message: tuple[int, Any], cid: int, data: st.DataObject
) -> None:
    """The skip over a ProduceResponse (``_no_node_endpoints``) says "no NodeEndpoints"
    exactly for kio's encodings with none (record errors, messages, current leaders and
    all), and never for a frame cut short or run on: those are walked and refused."""
    version, obj = message
    frame = codec.encode_response(obj, cid)
    hv = codec.response_header_version(PRODUCE, version)
    assert hv is not None
    offset = codec.response_body_offset(frame, hv)
    assert rewrite._no_node_endpoints(frame, offset, version) == (not obj.node_endpoints)
    if not obj.node_endpoints:
        assert rewrite.rewrite_response(PRODUCE, version, frame, resolve) is frame
    cut = data.draw(st.integers(min_value=offset, max_value=len(frame) - 1))
    assert not rewrite._no_node_endpoints(frame[:cut], offset, version)
    assert not rewrite._no_node_endpoints(frame + b"\x00", offset, version)
