"""The protocol layer's names for Kafka's numbers agree with kio's, and messages build across versions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import response as f4
from kio.schema.fetch.v16 import response as f16
from kio.schema.index import api_key_map

from proxy.protocol import apis, error_codes, messages
from proxy.protocol.errors import DecodeError


def test_api_keys_are_kafkas() -> None:
    for key, name in api_key_map.items():
        assert getattr(apis, name.upper()) == key
    assert apis.API_NAMES[apis.FETCH] == "fetch"
    assert len(apis.API_NAMES) == len(set(apis.API_NAMES.values()))


def test_error_codes_are_kafkas() -> None:
    names = [n for n in vars(error_codes) if n.isupper() and n != "FETCH_SESSION_ERRORS"]
    assert names
    for name in names:
        assert getattr(error_codes, name) == ErrorCode[name.lower()].value, name
    assert error_codes.FETCH_SESSION_ERRORS == {70, 71, 106}


def test_modules_by_version() -> None:
    assert messages.response_module(apis.FETCH, 16) is f16
    assert messages.request_module(apis.FETCH, 4).FetchRequest.__version__ == 4
    assert messages.module_of(f16.PartitionData) is f16
    with pytest.raises(DecodeError):
        messages.request_module(apis.FETCH, 999)


def test_make_and_convert_keep_the_fields_a_version_has() -> None:
    aborted = messages.make(f4.AbortedTransaction, producer_id=1, first_offset=2, extra=3)
    assert aborted == f4.AbortedTransaction(producer_id=1, first_offset=2)
    response = messages.make(
        f4.FetchResponse,
        throttle_time=timedelta(0),
        error_code=ErrorCode.none,
        session_id=7,
        responses=(),
        node_endpoints=(),
    )
    assert response == f4.FetchResponse(throttle_time=timedelta(0), responses=())
    moved = messages.convert(aborted, f16.AbortedTransaction)
    assert moved == f16.AbortedTransaction(producer_id=1, first_offset=2)
