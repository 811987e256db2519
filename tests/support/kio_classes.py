"""Every request and response class kio knows, for tests that cover each one.

Importing this module also teaches Hypothesis to draw kio's ``Records`` (as a
short, valid records field), which ``st.from_type`` cannot build on its own.
"""

from __future__ import annotations

from hypothesis import strategies as st
from kio.static.primitive import Records

from proxy.protocol import codec

st.register_type_strategy(Records, st.binary(max_size=40).map(Records.parse))

SCHEMAS: list[type] = [
    schema
    for api_key in range(100)
    for version in range(30)
    for schema in (codec.request_schema(api_key, version), codec.response_schema(api_key, version))
    if schema is not None
]
"""Every (api key, version)'s request and response class, requests first per pair."""


def schema_id(schema: type) -> str:
    """A readable pytest id for a kio class."""
    return f"{schema.__module__}.{schema.__name__}"
