"""The proxy's rack in the Fetch it sends upstream (proxy.relay.rack_fetch), and the
answers that carry a preferred read replica (KIP-392) on their way back to the client.

Upstream is the dev broker's dispatcher acting as a leader that runs
``RackAwareReplicaSelector``: for a fetch that carries rack ``b`` it answers the
partitions in ``Leader.redirect`` with ``preferred_read_replica = 2`` and no records,
as Kafka's ``ReplicaManager`` does (the dev cluster models no replicas, so the
redirect is staged on its answer).  Bytes in, bytes out through the real Relay.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from typing import Any

import pytest
from support.dev_upstream import batch, client_fetch

from devbroker.fetch import NodeFetcher
from devbroker.membership import GroupCoordinator
from devbroker.node import NodeDispatcher
from devbroker.outcome import Reply, Wait
from devbroker.state import ClusterState
from proxy import config
from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath, FetchPathHandler
from proxy.protocol import codec
from proxy.protocol.framing import payload_bytes
from proxy.protocol.records import iter_batches
from proxy.relay import rack_fetch
from proxy.relay.rack_fetch import RackFetch, patch_request, upstream_rack
from proxy.relay.relay import PassThroughFetch, Relay
from proxy.sessions.as_broker_cache import FetchSessionCache
from proxy.shaping.limits import InvalidLimits, Limits
from proxy.shaping.policy import Policy, rack_override

PROXY_RACK = "b"
REPLICA = 2  # the broker in rack b


def resolve(node_id: int, host: str, port: int) -> tuple[str, int] | None:
    return None


class Leader:
    """Node 1, leader of every partition; redirects ``redirect`` for fetches in rack b."""

    def __init__(self) -> None:
        self.state = ClusterState("dev", [1])
        for name, n in {"orders": 4, "events": 3}.items():
            self.state.create_topic(name, n)
        self.dispatcher = NodeDispatcher(
            1,
            self.state,
            GroupCoordinator(self.state),
            fetcher=NodeFetcher(1, self.state, FetchSessionCache(rng=random.Random(1))),
        )
        self.redirect: set[tuple[str, int]] = set()
        self.racks: list[str | None] = []
        """The rack_id of every Fetch received (None: a version without one)."""

    def append(self, topic: str, p: int, count: int = 1, times: int = 1) -> None:
        part = self.state.partition(topic, p)
        assert part is not None
        for _ in range(times):
            part.log.append(batch(count), part.leader_epoch)

    def answer(self, frame: bytes) -> bytes:
        header, request = codec.decode_request(frame)
        if header.api_key == 1:
            self.racks.append(getattr(request, "rack_id", None))
        outcome = self.dispatcher.handle(frame)
        if isinstance(outcome, Wait):
            assert outcome.pending.poll(0.0)
            response, cid = outcome.pending.complete(), outcome.correlation_id
        else:
            assert isinstance(outcome, Reply), outcome
            response, cid = outcome.response, outcome.correlation_id
        if header.api_key == 1 and getattr(request, "rack_id", "") == PROXY_RACK:
            response = self._redirected(response)
        return codec.encode_response(response, cid)

    def _redirected(self, response: Any) -> Any:
        names = {t.topic_id: name for name, t in self.state.topics.items()}
        topics = []
        for topic in response.responses:
            name = getattr(topic, "topic", None) or names.get(getattr(topic, "topic_id", None))
            parts = []
            for pd in topic.partitions:
                if (name, int(pd.partition_index)) in self.redirect and pd.error_code == 0:
                    pd = dataclasses.replace(pd, preferred_read_replica=REPLICA, records=b"")
                parts.append(pd)
            topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
        return dataclasses.replace(response, responses=tuple(topics))


class Conn:
    """One client connection through a FetchPathHandler to the Leader."""

    def __init__(self, leader: Leader, path: FetchPath, client_id: str = "app") -> None:
        self.leader = leader
        self.client_id = client_id
        self.handler: FetchPathHandler = path.handler(1)
        self.relay = Relay(resolve, fetch_handler=self.handler)

    def fetch(
        self,
        parts: list[tuple[str, int, int]],
        *,
        version: int = 12,
        rack: str = "",
    ) -> Any:
        class _Up:
            state = self.leader.state

        request = client_fetch(_Up(), version, parts)  # type: ignore[arg-type]
        if version >= 11:
            request = dataclasses.replace(request, rack_id=rack)
        self.relay.client_frame(codec.encode_request(request, 7, self.client_id))
        for _ in range(20):
            frames = self.relay.take_upstream()
            if not frames:
                break
            for f in frames:
                self.relay.upstream_frame(self.leader.answer(f))
        [out] = [payload_bytes(p) for p in self.relay.take_client()]
        return codec.decode_response(1, version, out)[1]


def partitions(response: Any, leader: Leader) -> dict[tuple[str, int], Any]:
    names = {t.topic_id: name for name, t in leader.state.topics.items()}
    out = {}
    for topic in response.responses:
        name = getattr(topic, "topic", None) or names.get(getattr(topic, "topic_id", None))
        for pd in topic.partitions:
            out[(name, int(pd.partition_index))] = pd
    return out


def records(pd: Any) -> int:
    return sum(1 for _ in iter_batches(bytes(pd.records or b"")))


ORDERS = [("orders", p, 0) for p in range(4)]


def world(**fetch_config: Any) -> tuple[Leader, FetchPath]:
    return Leader(), FetchPath(FetchPathConfig(**fetch_config))


# -- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "proxy", "override", "version", "sent"),
    [
        ("", "b", False, 12, "b"),  # no client rack: the proxy's
        ("a", "b", False, 12, "a"),  # the client's own is kept
        ("a", "b", True, 12, "b"),  # unless its policy overrides it
        ("", "", False, 12, ""),  # no rack setting: nothing changes
        ("a", "", True, 12, "a"),
        ("", "b", False, 10, ""),  # a v10 client cannot receive the redirect
        ("", "b", True, 11, "b"),
    ],
)
def test_upstream_rack(client: str, proxy: str, override: bool, version: int, sent: str) -> None:
    assert upstream_rack(client, proxy, override=override, client_version=version) == sent


def test_a_client_that_follows_keeps_the_rack_and_one_that_ignores_loses_it() -> None:
    follows = RackFetch("b")
    ignores = RackFetch("b", max_ignored=3)
    p0, p1 = ("t", 0), ("t", 1)
    for _ in range(10):
        follows.asked([p0, p1])
        follows.answered(_response_redirecting(p0))
        follows.asked([p1])  # p0 went to the preferred replica
        follows.answered(_response_redirecting())
    assert follows.active and follows.ignored == 0 and follows.redirected == 10
    stops = []
    for _ in range(4):
        stops.append(ignores.asked([p0, p1]))
        if ignores.active:
            ignores.answered(_response_redirecting(p0))
    assert stops == [False, False, False, True]
    assert not ignores.active and ignores.stopped and ignores.ignored == 3
    assert ignores.step("", override=False, client_version=12).rack_id == ""
    # a client's own rack still goes through once the proxy's stopped
    assert ignores.step("a", override=True, client_version=12).rack_id == "a"


def test_one_late_fetch_after_a_redirect_is_forgiven() -> None:
    rack = RackFetch("b", max_ignored=2)
    p0 = ("t", 0)
    for _ in range(5):
        rack.answered(_response_redirecting(p0))
        rack.asked([p0])  # built before the client read the redirect
        rack.answered(_response_redirecting())
        rack.asked([("t", 1)])
    assert rack.active and rack.ignored == 5


def _response_redirecting(*keys: tuple[str, int]) -> Any:
    mod = codec.response_schema(1, 12)
    module = __import__(mod.__module__, fromlist=["x"])
    return module.FetchResponse(
        throttle_time=timedelta(0),
        error_code=0,
        session_id=0,
        responses=tuple(
            module.FetchableTopicResponse(
                topic=topic,
                partitions=(
                    module.PartitionData(
                        partition_index=p,
                        error_code=0,
                        high_watermark=5,
                        last_stable_offset=5,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=REPLICA,
                        records=b"",
                    ),
                ),
            )
            for topic, p in keys
        ),
    )


# -- policies -------------------------------------------------------------------------------


def test_policy_rack_override_parsed_validated_and_first_match_wins() -> None:
    p = Policy.from_mapping("ext", {"client_id": "ext-*", "rack_override": True})
    assert p.rack_override and Policy.from_mapping("x", {}).rack_override is False
    with pytest.raises(InvalidLimits, match="rack_override must be true or false"):
        Policy.from_mapping("bad", {"rack_override": "yes"})
    policies = [
        Policy("keep", Limits(), client_id="ext-keep"),
        p,
    ]
    assert not rack_override(policies, "ext-keep", "broker-1")  # the first match says no
    assert rack_override(policies, "ext-1", "broker-1")
    assert not rack_override(policies, "other", "broker-1")


def test_config_takes_rack_override_in_a_policy_and_refuses_a_non_boolean() -> None:
    base = {"upstream": ["127.0.0.1:9092"]}
    settings = config.validate({**base, "policies": [{"name": "x", "rack_override": True}]})
    [policy] = FetchPathConfig.from_raw(settings.raw).policies
    assert policy.rack_override
    with pytest.raises(config.ConfigError, match="rack_override"):
        config.validate({**base, "policies": [{"name": "x", "rack_override": "yes"}]})


# -- the pass-through relay -----------------------------------------------------------------


def _frame(version: int, rack: str = "", replica: int = -1) -> bytes:
    leader = Leader()

    class _Up:
        state = leader.state

    request = client_fetch(_Up(), version, ORDERS)  # type: ignore[arg-type]
    if version >= 11:
        request = dataclasses.replace(request, rack_id=rack)
    if replica >= 0:
        request = dataclasses.replace(request, replica_id=replica)
    return codec.encode_request(request, 5, "client-x")


def _sent_upstream(handler: PassThroughFetch, frame: bytes) -> bytes:
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(frame)
    [up] = relay.take_upstream()
    return up


def test_pass_through_sets_the_proxy_rack_only_where_it_is_missing() -> None:
    frame = _frame(12)
    up = _sent_upstream(PassThroughFetch(RackFetch("b")), frame)
    header, request = codec.decode_request(up)
    assert request.rack_id == "b"
    assert header.client_id == "client-x"
    body_at = codec.parse_request_header(frame).body_offset
    assert up[8:body_at] == frame[8:body_at]  # the client's header (after our correlation id)
    for kept in (_frame(12, rack="a"), _frame(10), _frame(12, replica=3)):
        sent = _sent_upstream(PassThroughFetch(RackFetch("b")), kept)
        assert sent[8:] == kept[8:]
    # no rack setting: the frame goes as the very bytes it came in
    assert _sent_upstream(PassThroughFetch(), frame)[8:] == frame[8:]


def test_patch_request_override_and_watch() -> None:
    frame = _frame(12, rack="a")
    header = codec.parse_request_header(frame)
    rack = RackFetch("b")
    assert patch_request(header, frame, rack) is None
    patched = patch_request(header, frame, rack, override=True)
    assert patched is not None and patched[1].rack_id == "b"
    assert rack_fetch.requested(patched[1]) == {("orders", p) for p in range(4)}


# -- the fetch path: sessionless clients behind the proxy's upstream session ----------------


def test_a_sessionless_client_gets_the_proxy_rack_and_the_leader_redirect() -> None:
    leader, path = world(rack=PROXY_RACK)
    conn = Conn(leader, path)
    for p in range(4):
        leader.append("orders", p, 2)
    leader.redirect = {("orders", 0), ("orders", 1)}
    got = partitions(conn.fetch(ORDERS), leader)
    assert leader.racks == [PROXY_RACK]
    for p in (0, 1):  # the redirect reaches the client as the leader gave it
        assert got[("orders", p)].preferred_read_replica == REPLICA
        assert not got[("orders", p)].records
    for p in (2, 3):
        assert got[("orders", p)].preferred_read_replica == -1
        assert records(got[("orders", p)]) == 1
    # the client follows: it asks the leader for the others only, from their new offsets;
    # the upstream request is now incremental (a session), and still in rack b
    for p in (2, 3):
        leader.append("orders", p, 1)
    got = partitions(conn.fetch([("orders", 2, 2), ("orders", 3, 2)]), leader)
    assert leader.racks == [PROXY_RACK, PROXY_RACK]
    assert conn.handler.translator is not None
    assert conn.handler.translator.stats.incremental_requests >= 1
    assert {k: pd.preferred_read_replica for k, pd in got.items()} == {
        ("orders", 2): -1,
        ("orders", 3): -1,
    }
    assert conn.handler.rack is not None and conn.handler.rack.active


def test_a_redirect_in_an_incremental_upstream_answer_reaches_the_sessionless_client() -> None:
    leader, path = world(rack=PROXY_RACK)
    conn = Conn(leader, path)
    for p in range(4):
        leader.append("orders", p, 1)
    conn.fetch(ORDERS)  # full upstream fetch, opens the session: all four served
    leader.append("orders", 3, 1)
    leader.redirect = {("orders", 3)}
    got = partitions(conn.fetch([("orders", p, 1) for p in range(4)]), leader)
    stats = conn.handler.translator.stats  # type: ignore[union-attr]
    assert stats.incremental_requests == 1
    assert got[("orders", 3)].preferred_read_replica == REPLICA
    assert not got[("orders", 3)].records
    # partitions the incremental answer left out are filled in without a redirect
    assert [got[("orders", p)].preferred_read_replica for p in range(3)] == [-1, -1, -1]


def test_the_client_rack_is_kept_unless_its_policy_overrides_it() -> None:
    policies = (Policy("ext", Limits(), client_id="ext-*", rack_override=True),)
    leader, path = world(rack=PROXY_RACK, policies=policies)
    Conn(leader, path, client_id="app").fetch(ORDERS, rack="a")
    Conn(leader, path, client_id="ext-1").fetch(ORDERS, rack="a")
    Conn(leader, path, client_id="app").fetch(ORDERS, rack="")
    assert leader.racks == ["a", PROXY_RACK, PROXY_RACK]


def test_no_rack_setting_and_old_clients_send_no_rack() -> None:
    leader, path = world()
    Conn(leader, path).fetch(ORDERS)
    leader2, path2 = world(rack=PROXY_RACK)
    old = Conn(leader2, path2)
    old.handler.upstream_fetch_max = 12  # the upstream speaks v12; the client v10
    old.fetch(ORDERS, version=10)
    assert leader.racks == [""] and leader2.racks == [""]


def test_a_client_that_ignores_the_redirect_is_not_starved() -> None:
    leader, path = world(rack=PROXY_RACK)
    conn = Conn(leader, path)
    leader.append("orders", 0, 1, times=3)
    leader.redirect = {("orders", 0)}
    offsets = dict.fromkeys(range(4), 0)
    served = 0
    for _ in range(6):
        got = partitions(conn.fetch([("orders", p, offsets[p]) for p in range(4)]), leader)
        n = records(got[("orders", 0)])
        offsets[0] += n
        served += n
    rack = conn.handler.rack
    assert rack is not None and rack.stopped and rack.ignored == rack.max_ignored
    assert leader.racks[: rack.max_ignored] == [PROXY_RACK] * rack.max_ignored
    assert leader.racks[rack.max_ignored :] == [""] * (6 - rack.max_ignored)
    assert served == 3  # the leader's data, once the proxy's rack stopped


def test_held_batches_give_way_to_a_redirect() -> None:
    """Batches the caps trimmed away wait in the reuse buffer; when the leader then sends
    the client to a preferred replica, the answer goes out as the leader gave it (no
    records, the replica named), not the held batches with a redirect beside them."""
    leader, path = world(rack=PROXY_RACK, limits=Limits(max_partition_records=1))
    conn = Conn(leader, path)
    leader.append("orders", 0, 1, times=3)
    got = partitions(conn.fetch([("orders", 0, 0)]), leader)
    assert records(got[("orders", 0)]) == 1
    assert len(conn.handler.shaper.buffer) == 1  # two batches held
    leader.append("orders", 0, 1)
    leader.redirect = {("orders", 0)}
    got = partitions(conn.fetch([("orders", 0, 1)]), leader)
    pd = got[("orders", 0)]
    assert pd.preferred_read_replica == REPLICA
    assert not pd.records
    assert path.budget.used == 0


def test_a_reload_changes_the_rack_of_live_connections() -> None:
    leader, path = world()
    conn = Conn(leader, path)
    conn.fetch(ORDERS)
    path.reload(FetchPathConfig(rack=PROXY_RACK))
    conn.fetch(ORDERS)
    path.reload(FetchPathConfig(rack="c"))
    conn.fetch(ORDERS)
    path.reload(FetchPathConfig())
    conn.fetch(ORDERS)
    assert leader.racks == ["", PROXY_RACK, "c", ""]


def test_a_redirect_passes_the_caps_and_the_rotation_untouched() -> None:
    """With a record cap that only one partition's batch fits, the redirected partition
    (no records) is still answered, with its preferred replica, whatever the serve order."""
    leader, path = world(rack=PROXY_RACK, limits=Limits(max_records=1))
    conn = Conn(leader, path)
    for p in range(4):
        leader.append("orders", p, 1, times=2)
    leader.redirect = {("orders", 3)}
    for _ in range(3):
        got = partitions(conn.fetch(ORDERS), leader)
        assert got[("orders", 3)].preferred_read_replica == REPLICA
        assert not got[("orders", 3)].records
        assert sum(records(pd) for pd in got.values()) == 1


def test_pass_through_watches_the_answers_and_stops_for_a_client_that_ignores_them() -> None:
    frame = _frame(12)
    handler = PassThroughFetch(RackFetch(PROXY_RACK))
    relay = Relay(resolve, fetch_handler=handler)
    sent = []
    for cid in range(5):
        relay.client_frame(frame[:4] + cid.to_bytes(4, "big") + frame[8:])
        [up] = relay.take_upstream()
        sent.append(codec.decode_request(up)[1].rack_id)
        answer = _response_redirecting(("orders", 0))
        relay.upstream_frame(codec.encode_response(answer, int.from_bytes(up[4:8], "big")))
        [out] = relay.take_client()
        back = codec.decode_response(1, 12, payload_bytes(out))[1]
        assert back.responses[0].partitions[0].preferred_read_replica == REPLICA
    assert sent == [PROXY_RACK] * 3 + [""] * 2
    assert handler.rack is not None and handler.rack.stopped


# -- the proxy following the redirect itself (proxy.relay.read_replica) ---------------------


class Replicas:
    """The edge's replica connections (``read_replica.ReplicaUpstream``): node 2 answers
    from the leader's log (a replica in sync), when ``deliver`` runs, as the edge does."""

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.sent: list[tuple[int, Any]] = []
        self.down = False
        """The next sends fail (the connection to the replica is lost)."""
        self._done: list[Any] = []

    def available(self, node: int) -> bool:
        return True

    def deliver(self) -> None:
        done, self._done = self._done, []
        for callback in done:
            callback()

    def send(
        self, node: int, frame: bytes, *, api_version: int, on_response: Any, on_failure: Any
    ) -> None:
        _, request = codec.decode_request(frame)
        self.sent.append((node, request))
        if self.down:
            self._done.append(on_failure)
            return
        outcome = self.leader.dispatcher.handle(frame)
        if isinstance(outcome, Wait):  # nothing to read yet: the long poll ends at once
            assert outcome.pending.poll(0.0)
            response, cid = outcome.pending.complete(), outcome.correlation_id
        else:
            assert isinstance(outcome, Reply), outcome
            response, cid = outcome.response, outcome.correlation_id
        answer = codec.encode_response(response, cid)
        self._done.append(lambda: on_response(answer))


def fetch_following(conn: Conn, replicas: Replicas, parts: list[tuple[str, int, int]]) -> Any:
    """A v10 fetch through the handler, the leader and the replica; the client's answer."""

    class _Up:
        state = conn.leader.state

    request = client_fetch(_Up(), 10, parts)  # type: ignore[arg-type]
    conn.relay.client_frame(codec.encode_request(request, 7, conn.client_id))
    out: list[bytes] = []
    for _ in range(20):
        for f in conn.relay.take_upstream():
            conn.relay.upstream_frame(conn.leader.answer(f))
        conn.handler.resume()  # the edge's wake: replica answers run in the connection's task
        out += [payload_bytes(p) for p in conn.relay.take_client()]
        if out:
            break
    [frame] = out
    return codec.decode_response(1, 10, frame)[1]


def test_the_proxy_follows_the_redirect_for_a_fetch_v10_client() -> None:
    leader, path = world(rack=PROXY_RACK)
    for p in range(4):
        leader.append("orders", p, count=2, times=3)
    leader.redirect = {("orders", 0), ("orders", 1)}
    conn = Conn(leader, path)
    conn.handler.upstream_fetch_max = 12  # learnt from ApiVersions: v11+ upstream
    replicas = Replicas(leader)
    conn.handler.replicas = replicas
    offsets = dict.fromkeys(range(4), 0)
    got: dict[int, list[int]] = {p: [] for p in range(4)}
    for _ in range(6):
        response = fetch_following(conn, replicas, [("orders", p, offsets[p]) for p in range(4)])
        for (_, p), pd in partitions(response, leader).items():
            assert pd.error_code == 0
            for h in iter_batches(bytes(pd.records or b"")):
                assert h.base_offset == offsets[p]
                got[p] += list(range(h.base_offset, h.next_offset))
                offsets[p] = h.next_offset
    assert got == {p: list(range(6)) for p in range(4)}  # every record once, in order
    assert leader.racks[0] == PROXY_RACK  # the leader is asked with the proxy's rack
    assert replicas.sent, "nothing was fetched from the replica"
    node, request = replicas.sent[0]
    assert node == REPLICA and request.__version__ == 12 and request.rack_id == PROXY_RACK
    assert {(t.topic, p.partition) for t in request.topics for p in t.partitions} == {
        ("orders", 0),
        ("orders", 1),
    }


def test_a_lost_replica_sends_the_partitions_back_to_the_leader() -> None:
    leader, path = world(rack=PROXY_RACK)
    for p in range(2):
        leader.append("orders", p, count=1, times=4)
    leader.redirect = {("orders", 0)}
    conn = Conn(leader, path)
    conn.handler.upstream_fetch_max = 12  # learnt from ApiVersions: v11+ upstream
    replicas = Replicas(leader)
    conn.handler.replicas = replicas
    parts = [("orders", 0, 0), ("orders", 1, 0)]
    fetch_following(conn, replicas, parts)  # the redirect
    replicas.down = True
    answer = partitions(fetch_following(conn, replicas, parts), leader)
    assert answer[("orders", 0)].error_code == 0 and not answer[("orders", 0)].records
    assert ("orders", 0) not in conn.handler.read_replicas
    leader.redirect = set()  # the leader now serves it itself
    answer = partitions(fetch_following(conn, replicas, parts), leader)
    assert records(answer[("orders", 0)]) > 0
