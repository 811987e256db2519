"""``messages.replaced``: the same instance ``dataclasses.replace`` makes, for kio's entities
and the proxy's own frozen dataclasses, and the same refusal of an unknown field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import codec
from proxy.protocol.apis import FETCH
from proxy.protocol.messages import replaced

FETCH_REQUESTS = [codec.request_schema(FETCH, v) for v in range(4, 19)]


@settings(max_examples=60)
@given(st.data())
def test_a_kio_fetch_request_is_replaced_as_dataclasses_does(data: st.DataObject) -> None:
    schema = data.draw(st.sampled_from(FETCH_REQUESTS))
    request = data.draw(st.from_type(schema))
    names = [f.name for f in dataclasses.fields(schema)]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
    other = data.draw(st.from_type(schema))
    changes = {n: getattr(other, n) for n in chosen}
    got = replaced(request, **changes)
    assert type(got) is schema
    assert got == dataclasses.replace(request, **changes)
    assert codec.encode_body(got) == codec.encode_body(dataclasses.replace(request, **changes))
    if not changes:
        assert got is not request  # a copy, as dataclasses.replace makes


@dataclasses.dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Checked:
    a: int
    seen: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen.append(self.a)


@dataclasses.dataclass(frozen=True)
class _Derived:
    a: int
    double: int = dataclasses.field(init=False, default=0)


def test_own_dataclasses_are_replaced_as_dataclasses_does() -> None:
    plain = _Plain(1, (2,))
    assert replaced(plain, b=(3,)) == _Plain(1, (3,)) == dataclasses.replace(plain, b=(3,))
    # a __post_init__ or a field outside __init__: dataclasses.replace itself runs
    checked = _Checked(1)
    again = replaced(checked, a=2)
    assert again.seen == [1, 2]  # (the list is the one field copied: __post_init__ ran again)
    derived = _Derived(1)
    assert replaced(derived, a=2) == dataclasses.replace(derived, a=2)


@pytest.mark.parametrize("obj", [_Plain(1), _Checked(1)])
def test_an_unknown_field_is_a_type_error(obj: Any) -> None:
    with pytest.raises(TypeError):
        replaced(obj, nope=1)
    with pytest.raises(TypeError):
        dataclasses.replace(obj, nope=1)
