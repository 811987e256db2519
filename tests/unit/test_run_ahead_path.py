"""``run_ahead`` on the Fetch path: the real relay and handler, the dev broker's dispatcher
upstream (``support.fetch_world``).

After an answer that delivered data, the handler sends upstream what the client will
ask next, with no long poll, and keeps the answer in the reuse buffer; the client's
next fetch is answered from it with no upstream round.  Every record once and in
order, its upstream bytes counted, its memory budget given back; on unless set off.
"""

from __future__ import annotations

import argparse
import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from support.dev_upstream import client_fetch
from support.fetch_world import Conn, World, upstream_fetches

from proxy import config, fetchpath
from proxy.config import FetchPathConfig
from proxy.observe.metrics import PREFIX, Metrics
from proxy.protocol import codec
from proxy.protocol.records import iter_batches

PARTS = 4
BATCHES = 30  # per partition, of 5 records each


@pytest.fixture(autouse=True)
def _small_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any answer with records starts a run-ahead round (64 KiB in the proxy)."""
    monkeypatch.setattr(fetchpath, "RUN_AHEAD_MIN_BYTES", 1)


def _world(run_ahead: bool, metrics: Any = None) -> World:
    w = World(FetchPathConfig(run_ahead=run_ahead), metrics)
    for p in range(PARTS):
        w.append("orders", p, 5, times=BATCHES)
    return w


def _fetch(c: Conn, cid: int, offsets: dict[int, int], max_bytes: int, **fields: int) -> Any:
    """Fetch v12 of *offsets* (*fields*: more of the request's, e.g. its session's)."""

    class _Up:
        state = c.world.state

    request = client_fetch(_Up(), 12, [("orders", p, o) for p, o in offsets.items()])  # type: ignore[arg-type]
    request = dataclasses.replace(request, max_bytes=max_bytes, **fields)
    [out] = c.send(codec.encode_request(request, cid, c.client_id))
    return codec.decode_response(1, 12, out)[1]


def _consume(c: Conn, max_bytes: int) -> tuple[int, list[int]]:
    """Read every record; (client fetches, upstream fetches sent after each answer)."""
    offsets = {p: 0 for p in range(PARTS)}
    rounds_after: list[int] = []
    for cid in range(1, 500):
        before = len(upstream_fetches(c))
        response = _fetch(c, cid, offsets, max_bytes)
        rounds_after.append(len(upstream_fetches(c)) - before)
        for t in response.responses:
            for pd in t.partitions:
                p = int(pd.partition_index)
                for h in iter_batches(pd.records or b""):
                    assert h.base_offset == offsets[p], "gap or duplicate"
                    offsets[p] = h.next_offset
        if all(o == BATCHES * 5 for o in offsets.values()):
            return cid, rounds_after
    raise AssertionError(f"did not finish: {offsets}")


def test_the_next_fetch_is_answered_from_what_ran_ahead() -> None:
    metrics = Metrics()
    w = _world(True, metrics)
    c = Conn(w).with_edge()
    fetches, rounds_after = _consume(c, max_bytes=2000)
    handler = c.handler
    assert handler.ahead_rounds > 0 and handler.shaper.held_answers > 0
    # Answered from held data: the fetch itself sent nothing upstream, only the next round.
    assert 0 in rounds_after or 1 in rounds_after
    assert len(upstream_fetches(c)) < 2 * fetches
    [_, ahead, *_] = upstream_fetches(c)
    assert ahead.max_wait == timedelta(0)  # no long poll ahead of the client
    sample = metrics.registry.get_sample_value
    assert sample(f"{PREFIX}run_ahead_rounds_total") == handler.ahead_rounds
    assert sample(f"{PREFIX}run_ahead_held_bytes_total") > 0
    # What the rounds brought upstream is counted with the rest (nothing fetched twice).
    up = sample(f"{PREFIX}broker_to_proxy_fetch_record_bytes_total", {"node": "1"})
    total = sum(len(w.state.partition("orders", p).log.data) for p in range(PARTS))  # type: ignore[union-attr]
    assert total <= up <= 1.05 * total
    # Memory: what the buffer holds is all the connection holds; nothing after it closes.
    assert w.path.budget.used == handler.shaper.buffer.size
    handler.close()
    assert w.path.budget.used == 0


def test_off_when_set_so_and_a_reload_turns_it_off() -> None:
    w = _world(False)
    c = Conn(w).with_edge()
    _, rounds_after = _consume(c, max_bytes=2000)
    assert c.handler.ahead_rounds == 0 and set(rounds_after) == {1}
    w = _world(True)
    c = Conn(w).with_edge()
    _fetch(c, 1, {p: 0 for p in range(PARTS)}, 2000)
    assert c.handler.ahead_rounds == 1
    w.path.reload(FetchPathConfig(run_ahead=False))
    before = len(upstream_fetches(c))
    _fetch(c, 2, {p: 100 for p in range(PARTS)}, 2000)  # (a seek: held data dropped)
    assert c.handler.ahead_rounds == 1 and len(upstream_fetches(c)) == before + 1


def test_a_seek_drops_what_ran_ahead_and_reads_from_the_new_offset() -> None:
    w = _world(True)
    c = Conn(w).with_edge()
    _fetch(c, 1, {p: 0 for p in range(PARTS)}, 2000)
    assert c.handler.shaper.buffer.size > 0
    response = _fetch(c, 2, {p: 50 for p in range(PARTS)}, 10**6)
    firsts = [
        next(iter_batches(pd.records)).base_offset
        for t in response.responses
        for pd in t.partitions
        if pd.records
    ]
    assert firsts and set(firsts) == {50}


def _ended_at(response: Any, asked: dict[int, int]) -> dict[int, int]:
    """*asked* moved past what *response* delivered: the client's next offsets."""
    offsets = dict(asked)
    for t in response.responses:
        for pd in t.partitions:
            for h in iter_batches(pd.records or b""):
                offsets[int(pd.partition_index)] = h.next_offset
    return offsets


def test_a_client_that_seeks_between_fetches_is_not_run_ahead_for_until_it_reads_on() -> None:
    w = _world(True)
    c = Conn(w).with_edge()
    asked = {p: 0 for p in range(PARTS)}
    response = _fetch(c, 1, asked, 2000)
    assert c.handler.ahead_rounds == 1  # a first answer: nothing says the client seeks
    before = len(upstream_fetches(c))
    for cid, at in enumerate((50, 20, 80, 35), start=2):
        asked = {p: at for p in range(PARTS)}
        response = _fetch(c, cid, asked, 2000)
        assert _ended_at(response, asked) != asked  # each delivered data
    # Each seek went upstream itself and nothing ran ahead of it: the client seeks.
    assert c.handler.ahead_rounds == 1
    assert len(upstream_fetches(c)) == before + 4
    # Reading on from where the last answer left it, it is run ahead for again, and the
    # fetch after that is answered from what ran ahead.
    asked = _ended_at(response, asked)
    response = _fetch(c, 6, asked, 2000)
    assert c.handler.ahead_rounds == 2
    held = c.handler.shaper.held_answers
    _fetch(c, 7, _ended_at(response, asked), 2000)
    assert c.handler.shaper.held_answers == held + 1


def test_a_session_client_that_reads_on_is_run_ahead_for() -> None:
    """A KIP-227 session client lists only the partitions whose offsets moved: it reads on
    from where its answer left it all the same, and the rounds run ahead of it."""
    w = _world(True)
    c = Conn(w).with_edge()

    asked = {p: 0 for p in range(PARTS)}
    response = _fetch(c, 1, asked, 2000, session_id=0, session_epoch=0)  # opens the session
    session = int(response.session_id)
    assert session != 0 and c.handler.ahead_rounds == 1
    for epoch in range(1, 4):
        moved = _ended_at(response, asked)
        changed = {p: o for p, o in moved.items() if o != asked[p]}
        assert changed
        held = c.handler.shaper.held_answers
        response = _fetch(c, 1 + epoch, changed, 2000, session_id=session, session_epoch=epoch)
        assert int(response.error_code) == 0
        assert c.handler.ahead_rounds == 1 + epoch
        assert c.handler.shaper.held_answers == held + 1  # from what ran ahead
        asked = moved


def test_not_under_record_limits() -> None:
    w = World(FetchPathConfig(run_ahead=True, limits=config_limits(max_records=7)))
    for p in range(PARTS):
        w.append("orders", p, 5, times=BATCHES)
    c = Conn(w).with_edge()
    _fetch(c, 1, {p: 0 for p in range(PARTS)}, 10**6)
    assert c.handler.ahead_rounds == 0


def config_limits(**kw: int) -> Any:
    from proxy.shaping.limits import Limits

    return Limits(**kw)


def test_the_setting_from_flag_env_and_file() -> None:
    assert FetchPathConfig.from_raw({}).run_ahead is True
    assert FetchPathConfig().run_ahead is True
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(["--upstream", "k:1", "--no-run-ahead"])
    assert FetchPathConfig.from_raw(config.from_args(args, {}).raw).run_ahead is False
    args = parser.parse_args(["--upstream", "k:1"])
    env = {"KAFKA_FETCH_PROXY_RUN_AHEAD": "false"}
    assert FetchPathConfig.from_raw(config.from_args(args, env).raw).run_ahead is False
    with pytest.raises(config.ConfigError, match=r"key 'run_ahead'"):
        config.validate({"upstream": ["k:1"], "run_ahead": "yes"})
