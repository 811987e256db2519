"""Hypothesis over every fuzz target: seeds, raw bytes, mutated seeds, and structured framing.

A short, deterministic run of what ``python -m tests.fuzz.run`` runs for a
million inputs per target (``tests/fuzz/targets.py`` says what counts as a
finding).  Each example is bounded in time by ``targets.check``.
"""

from __future__ import annotations

import random

import pytest
from fuzz import mutate, seeds, targets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocol.framing import encode_frame

NAMES = sorted(targets.TARGETS)
FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", NAMES)
def test_every_seed_is_handled(name: str) -> None:
    assert seeds.seeds(name), f"no seeds for {name}"
    for data in seeds.seeds(name):
        targets.check(data, name)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.binary(max_size=400))
def test_raw_bytes(name: str, data: bytes) -> None:
    targets.check(data, name)


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(pick=st.integers(0, 2**32), rng_seed=st.integers(0, 2**32), rounds=st.integers(1, 6))
def test_mutated_seeds(name: str, pick: int, rng_seed: int, rounds: int) -> None:
    pool = seeds.seeds(name)
    rng = random.Random(rng_seed)
    data = mutate.mutate(pool[pick % len(pool)], rng, pool[rng.randrange(len(pool))], rounds)
    targets.check(data, name)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    frames=st.lists(st.binary(max_size=80), max_size=6),
    tail=st.binary(max_size=6),
    knobs=st.binary(min_size=3, max_size=3),
)
def test_framing_whole_and_byte_by_byte(frames: list[bytes], tail: bytes, knobs: bytes) -> None:
    """h11's way: valid frames (plus noise) cut the same whole, byte by byte and in chunks."""
    targets.check(knobs + b"".join(encode_frame(f) for f in frames) + tail, "framing")


def test_a_broken_invariant_is_a_finding() -> None:
    """The harness itself: a target that breaks a rule is reported, a ProtocolError is not."""
    assert targets.classify(AssertionError("x")) == "invariant"
    assert targets.classify(TypeError("x")) == "TypeError"
    assert targets.classify(targets.Hang("x")) == "hang"
    from proxy.protocol.errors import DecodeError

    assert targets.classify(DecodeError("x")) is None
    try:
        try:
            raise MemoryError
        except MemoryError as exc:
            raise DecodeError("hidden") from exc
    except DecodeError as exc:
        assert targets.classify(exc) == "DecodeError caused by MemoryError"
