"""Consumer-group membership (the classic protocol), as Apache Kafka's GroupCoordinator runs it.

JoinGroup, SyncGroup, Heartbeat and LeaveGroup, with the group states Empty ->
PreparingRebalance -> CompletingRebalance -> Stable, MEMBER_ID_REQUIRED for
JoinGroup v4+, REBALANCE_IN_PROGRESS on heartbeats during a rebalance,
NOT_COORDINATOR on every node but the group's coordinator, and session
timeouts that expire silent members.

Time is passed in (``now``, monotonic seconds) so tests control it.  Requests
that Kafka parks in a purgatory (JoinGroup until every member rejoined or the
rebalance timeout passed, SyncGroup until the leader sent the assignment) come
back as a :class:`GroupWait`, which the trio edge polls.  Static members
(group.instance.id, KIP-345) join without MEMBER_ID_REQUIRED; one that rejoins
with no member id replaces its old member id (no rebalance when the group is
Stable and its protocol choice stands), and requests naming an instance id that
maps to another member id get FENCED_INSTANCE_ID.

:class:`GroupCoordinator` answers every API of the group coordinator: these
four itself, OffsetCommit, TxnOffsetCommit and OffsetFetch through its
:class:`~devbroker.offsets.OffsetManager` (which asks it who may commit), and
the transactional APIs through its
:class:`~devbroker.transactions.TransactionCoordinator`.

Sans-I/O: no trio here.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from proxy.protocol import codec
from proxy.protocol.apis import HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP

from .admin import coordinator_node
from .build import build, ms
from .offsets import OffsetManager
from .state import ClusterState
from .transactions import TransactionCoordinator

if TYPE_CHECKING:
    from .node import Request

MIN_SESSION_TIMEOUT_MS = 6000  # group.min.session.timeout.ms
MAX_SESSION_TIMEOUT_MS = 1_800_000  # group.max.session.timeout.ms
EMPTY_GROUP_CLEANUP_SECONDS = 600.0  # offsets.retention.check.interval.ms


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


class GroupWait:
    """A parked JoinGroup or SyncGroup (implements the edge's Pending protocol)."""

    def __init__(
        self, coordinator: GroupCoordinator, respond: Callable[[dict[str, Any]], Any]
    ) -> None:
        self._coordinator = coordinator
        self._respond = respond
        self.result: dict[str, Any] | None = None

    def resolve(self, result: dict[str, Any]) -> None:
        if self.result is None:
            self.result = result

    def poll(self, now: float) -> bool:
        if self.result is None:
            self._coordinator.tick(now)
        return self.result is not None

    def wake_at(self) -> float | None:
        return self._coordinator.next_deadline()

    def complete(self) -> Any:
        assert self.result is not None
        return self._respond(self.result)


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    heartbeat_deadline: float
    group_instance_id: str | None = None
    join_waiter: GroupWait | None = None
    sync_waiter: GroupWait | None = None
    assignment: bytes = b""

    def metadata_for(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    """group instance id -> member id of the static member holding it (KIP-345)."""
    pending_members: dict[str, float] = field(default_factory=dict)
    """member ids handed out with MEMBER_ID_REQUIRED -> when they expire."""
    rebalance_deadline: float | None = None
    join_not_before: float = 0.0
    sync_deadline: float | None = None
    touched: float = 0.0
    """When a request last named this group (for the cleanup of empty groups)."""

    def candidate_protocols(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        names = {name for name, _ in protocols}
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])


class GroupCoordinator:
    """Every group of the dev cluster; each node answers only for the groups it coordinates."""

    def __init__(self, state: ClusterState, *, initial_rebalance_delay_ms: int = 0) -> None:
        self.state = state
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.groups: dict[str, Group] = {}
        self.transactions = TransactionCoordinator(state, self)
        """The transaction coordinator (shared by every node, like the group coordinator)."""
        self.offsets = OffsetManager(state, self)
        """The groups' committed offsets."""

    def handlers(self) -> dict[int, Callable[[int, Request], Any]]:
        return (
            self.transactions.handlers()
            | self.offsets.handlers()
            | {
                JOIN_GROUP: self.join_group,
                SYNC_GROUP: self.sync_group,
                HEARTBEAT: self.heartbeat,
                LEAVE_GROUP: self.leave_group,
            }
        )

    def is_coordinator(self, node_id: int, group_id: str) -> bool:
        return coordinator_node(self.state.node_ids, group_id) == node_id

    # -- time --------------------------------------------------------------

    def next_deadline(self) -> float | None:
        times: list[float] = []
        for g in self.groups.values():
            # Members parked in JoinGroup/SyncGroup are kept alive (Kafka's shouldKeepAlive).
            times.extend(
                m.heartbeat_deadline
                for m in g.members.values()
                if m.join_waiter is None and m.sync_waiter is None
            )
            times.extend(g.pending_members.values())
            if g.state is GroupState.PREPARING_REBALANCE and g.rebalance_deadline is not None:
                times.append(max(g.rebalance_deadline, g.join_not_before))
                if g.join_not_before:  # an initial rebalance delay still running
                    times.append(g.join_not_before)
            if g.state is GroupState.COMPLETING_REBALANCE and g.sync_deadline is not None:
                times.append(g.sync_deadline)
        return min(times) if times else None

    def tick(self, now: float) -> None:
        """Expire members, pending members, rebalance and sync timeouts due at *now*."""
        for g in list(self.groups.values()):
            if (
                g.state is GroupState.EMPTY
                and not g.members
                and not g.pending_members
                and not self.offsets.holds(g.group_id)
                and now - g.touched >= EMPTY_GROUP_CLEANUP_SECONDS
            ):
                # Kafka's periodic cleanup removes empty groups that hold no offsets.
                del self.groups[g.group_id]
                self.offsets.forget(g.group_id)
                continue
            for mid, expiry in list(g.pending_members.items()):
                if now >= expiry:
                    del g.pending_members[mid]
            for m in list(g.members.values()):
                waiting = m.join_waiter is not None or m.sync_waiter is not None
                if not waiting and now >= m.heartbeat_deadline:
                    self._remove_member(g, m, now)
            if (
                g.state is GroupState.COMPLETING_REBALANCE
                and g.sync_deadline is not None
                and now >= g.sync_deadline
            ):
                # Members that never sent SyncGroup are removed and the group rebalances.
                for m in list(g.members.values()):
                    if m.sync_waiter is None:
                        self._remove_member(g, m, now)
                if g.state is GroupState.COMPLETING_REBALANCE:
                    self._prepare_rebalance(g, now)
            self._try_complete_join(g, now)

    # -- rebalancing ---------------------------------------------------------

    def _prepare_rebalance(self, g: Group, now: float) -> None:
        if g.state is GroupState.COMPLETING_REBALANCE:
            for m in g.members.values():
                m.assignment = b""
                if m.sync_waiter is not None:
                    m.sync_waiter.resolve({"error_code": E.rebalance_in_progress})
                    m.sync_waiter = None
        timeout = max((m.rebalance_timeout_ms for m in g.members.values()), default=0)
        if g.state is GroupState.EMPTY and self.initial_rebalance_delay_ms > 0:
            g.join_not_before = now + min(self.initial_rebalance_delay_ms, timeout) / 1000.0
        else:
            g.join_not_before = 0.0
        g.rebalance_deadline = now + timeout / 1000.0
        g.sync_deadline = None
        g.state = GroupState.PREPARING_REBALANCE

    def _try_complete_join(self, g: Group, now: float) -> None:
        if g.state is not GroupState.PREPARING_REBALANCE:
            return
        all_joined = (
            all(m.join_waiter is not None for m in g.members.values()) and not g.pending_members
        )
        deadline = g.rebalance_deadline if g.rebalance_deadline is not None else now
        if g.join_not_before and now >= g.join_not_before:
            g.join_not_before = 0.0  # the initial delay is over
        if (all_joined and not g.join_not_before) or now >= max(deadline, g.join_not_before):
            self._complete_join(g, now)

    def _complete_join(self, g: Group, now: float) -> None:
        for m in list(g.members.values()):
            if m.join_waiter is None:
                self._remove_member(g, m, now, rebalance=False)
        g.rebalance_deadline = None
        g.generation += 1
        if not g.members:
            g.state = GroupState.EMPTY
            g.touched = now
            g.protocol_name = None
            g.protocol_type = None
            g.leader = None
            return
        g.protocol_name = g.select_protocol()
        g.state = GroupState.COMPLETING_REBALANCE
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.sync_deadline = now + max(m.rebalance_timeout_ms for m in g.members.values()) / 1000.0
        everyone = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata_for(g.protocol_name),
            }
            for m in g.members.values()
        ]
        for m in g.members.values():
            assert m.join_waiter is not None
            m.join_waiter.resolve(self._join_result(g, m, everyone))
            m.join_waiter = None
            m.heartbeat_deadline = now + m.session_timeout_ms / 1000.0

    def _join_result(self, g: Group, m: Member, everyone: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "error_code": E.none,
            "generation_id": g.generation,
            "protocol_type": g.protocol_type,
            "protocol_name": g.protocol_name,
            "leader": g.leader or "",
            "member_id": m.member_id,
            "members": everyone if m.member_id == g.leader else [],
        }

    def _current_members(self, g: Group) -> list[dict[str, Any]]:
        assert g.protocol_name is not None
        return [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata_for(g.protocol_name),
            }
            for m in g.members.values()
        ]

    def _remove_member(self, g: Group, m: Member, now: float, *, rebalance: bool = True) -> None:
        del g.members[m.member_id]
        if (
            m.group_instance_id is not None
            and g.static_members.get(m.group_instance_id) == m.member_id
        ):
            del g.static_members[m.group_instance_id]
        for waiter in (m.join_waiter, m.sync_waiter):
            if waiter is not None:
                waiter.resolve({"error_code": E.unknown_member_id, "member_id": m.member_id})
        m.join_waiter = m.sync_waiter = None
        if g.leader == m.member_id:
            g.leader = next(iter(g.members), None)
        if not rebalance:
            return
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(g, now)
        self._try_complete_join(g, now)

    @staticmethod
    def _member_error(g: Group | None, member_id: str, instance_id: str | None) -> E | None:
        """Kafka's validateCurrentMember: the instance id maps to *member_id*, which exists."""
        if g is None:
            return E.unknown_member_id
        if instance_id is not None:
            current = g.static_members.get(instance_id)
            if current is None:
                return E.unknown_member_id
            if current != member_id:
                return E.fenced_instance_id
            return None
        return None if member_id in g.members else E.unknown_member_id

    def _replace_static_member(
        self,
        g: Group,
        instance_id: str,
        new_id: str,
        protocols: list[tuple[str, bytes]],
        session: int,
        rebalance_timeout: int,
        now: float,
        respond: Callable[[dict[str, Any]], Any],
        version: int,
    ) -> Any:
        """A known static member rejoined with no member id (updateStaticMemberAndRebalance)."""
        old_id = g.static_members[instance_id]
        current_leader = g.leader
        m = g.members.pop(old_id)
        for waiter in (m.join_waiter, m.sync_waiter):
            if waiter is not None:
                waiter.resolve({"error_code": E.fenced_instance_id, "member_id": old_id})
        m.join_waiter = m.sync_waiter = None
        m.member_id = new_id
        g.members[new_id] = m
        g.static_members[instance_id] = new_id
        if g.leader == old_id:
            g.leader = new_id
        m.protocols = protocols
        m.session_timeout_ms = session
        m.rebalance_timeout_ms = rebalance_timeout
        m.heartbeat_deadline = now + session / 1000.0
        if g.state is GroupState.STABLE:
            if g.select_protocol() == g.protocol_name:
                # No rebalance: the member carries on with the current assignment.
                if version >= 9 and g.leader == new_id:
                    result = self._join_result(g, m, self._current_members(g))
                    return respond(result | {"skip_assignment": True})
                result = self._join_result(g, m, [])
                return respond(result | {"leader": current_leader or ""})
        return self._wait_join(g, m, now, respond)

    # -- JoinGroup -------------------------------------------------------------

    def join_group(self, node_id: int, req: Request) -> Any:
        b = req.body
        v = req.version
        now = req.now
        self.tick(now)
        cls = codec.response_schema(JOIN_GROUP, v)

        def respond(result: dict[str, Any]) -> Any:
            data = {
                "throttle_time": 0,
                "generation_id": -1,
                "protocol_type": None,
                "protocol_name": None,
                "leader": "",
                "skip_assignment": False,
                "member_id": b.member_id,
                "members": [],
            } | result
            if v < 7 and data["protocol_name"] is None:
                data["protocol_name"] = ""
            return build(cls, data)

        def error(code: E, member_id: str | None = None) -> Any:
            return respond(
                {"error_code": code, "member_id": b.member_id if member_id is None else member_id}
            )

        group_id = b.group_id
        if not group_id:
            return error(E.invalid_group_id)
        if not self.is_coordinator(node_id, group_id):
            return error(E.not_coordinator)
        session = ms(b.session_timeout)
        rebalance_timeout = ms(getattr(b, "rebalance_timeout", b.session_timeout))
        if v == 0:
            rebalance_timeout = session
        if not MIN_SESSION_TIMEOUT_MS <= session <= MAX_SESSION_TIMEOUT_MS:
            return error(E.invalid_session_timeout)
        protocols = [(p.name, bytes(p.metadata)) for p in b.protocols]
        g = self.groups.get(group_id)
        if g is None:
            if b.member_id:
                return error(E.unknown_member_id)
            g = self.groups[group_id] = Group(group_id)
        g.touched = now
        if not g.supports(b.protocol_type, protocols):
            return error(E.inconsistent_group_protocol)
        instance_id = getattr(b, "group_instance_id", None)
        client_id = req.header.client_id or ""

        def new_member(member_id: str) -> Member:
            return Member(
                member_id=member_id,
                client_id=client_id,
                protocol_type=b.protocol_type,
                protocols=protocols,
                session_timeout_ms=session,
                rebalance_timeout_ms=rebalance_timeout,
                heartbeat_deadline=now + session / 1000.0,
                group_instance_id=instance_id,
            )

        if not b.member_id:
            member_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            if instance_id is not None and instance_id in g.static_members:
                return self._replace_static_member(
                    g,
                    instance_id,
                    member_id,
                    protocols,
                    session,
                    rebalance_timeout,
                    now,
                    respond,
                    v,
                )
            if instance_id is not None:
                g.static_members[instance_id] = member_id
            if v >= 4 and instance_id is None:
                # KIP-394: the member must come back with the id we hand out
                # (Kafka's requireKnownMemberId: v4+ without a group instance id).
                g.pending_members[member_id] = now + session / 1000.0
                return error(E.member_id_required, member_id)
            return self._add_and_wait(g, new_member(member_id), now, respond)
        if b.member_id in g.pending_members:
            del g.pending_members[b.member_id]
            return self._add_and_wait(g, new_member(b.member_id), now, respond)
        member_error = self._member_error(g, b.member_id, instance_id)
        if member_error is not None:
            return error(member_error)
        m = g.members[b.member_id]
        same = m.protocols == protocols
        m.session_timeout_ms = session
        m.rebalance_timeout_ms = rebalance_timeout
        m.heartbeat_deadline = now + session / 1000.0
        if g.state is GroupState.COMPLETING_REBALANCE and same:
            # A duplicate join after the rebalance completed: answer with the current generation.
            return respond(self._join_result(g, m, self._current_members(g)))
        if g.state is GroupState.STABLE and same and m.member_id != g.leader:
            return respond(self._join_result(g, m, []))
        m.protocols = protocols
        return self._wait_join(g, m, now, respond)

    def _add_and_wait(
        self, g: Group, m: Member, now: float, respond: Callable[[dict[str, Any]], Any]
    ) -> Any:
        if not g.members:
            g.protocol_type = m.protocol_type
        g.members[m.member_id] = m
        if g.leader is None:
            g.leader = m.member_id
        return self._wait_join(g, m, now, respond)

    def _wait_join(
        self, g: Group, m: Member, now: float, respond: Callable[[dict[str, Any]], Any]
    ) -> GroupWait:
        waiter = GroupWait(self, respond)
        if m.join_waiter is not None:
            m.join_waiter.resolve({"error_code": E.unknown_member_id, "member_id": m.member_id})
        m.join_waiter = waiter
        if g.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(g, now)
        self._try_complete_join(g, now)
        return waiter

    # -- SyncGroup ---------------------------------------------------------------

    def sync_group(self, node_id: int, req: Request) -> Any:
        b = req.body
        now = req.now
        self.tick(now)
        cls = codec.response_schema(SYNC_GROUP, req.version)

        def respond(result: dict[str, Any]) -> Any:
            data = {
                "throttle_time": 0,
                "protocol_type": None,
                "protocol_name": None,
                "assignment": b"",
            }
            return build(cls, data | result)

        def error(code: E) -> Any:
            return respond({"error_code": code})

        request_error = self._generation_member_error(node_id, b)
        if request_error is not None:
            return error(request_error)
        g = self.groups[b.group_id]
        ptype = getattr(b, "protocol_type", None)
        pname = getattr(b, "protocol_name", None)
        if (ptype is not None and ptype != g.protocol_type) or (
            pname is not None and pname != g.protocol_name
        ):
            return error(E.inconsistent_group_protocol)
        m = g.members[b.member_id]
        m.heartbeat_deadline = now + m.session_timeout_ms / 1000.0
        ok = {
            "error_code": E.none,
            "protocol_type": g.protocol_type,
            "protocol_name": g.protocol_name,
        }
        if g.state is GroupState.PREPARING_REBALANCE:
            return error(E.rebalance_in_progress)
        if g.state is GroupState.STABLE:
            return respond(ok | {"assignment": m.assignment})
        if g.state is not GroupState.COMPLETING_REBALANCE:
            return error(E.unknown_member_id)
        waiter = GroupWait(self, respond)
        m.sync_waiter = waiter
        if m.member_id == g.leader:
            assignments = {a.member_id: bytes(a.assignment) for a in b.assignments}
            g.state = GroupState.STABLE
            g.sync_deadline = None
            for member in g.members.values():
                member.assignment = assignments.get(member.member_id, b"")
                if member.sync_waiter is not None:
                    member.sync_waiter.resolve(ok | {"assignment": member.assignment})
                    member.sync_waiter = None
                member.heartbeat_deadline = now + member.session_timeout_ms / 1000.0
        return waiter

    # -- Heartbeat / LeaveGroup ----------------------------------------------------

    def _generation_member_error(self, node_id: int, b: Any) -> E | None:
        """The checks SyncGroup and Heartbeat share, in Kafka's order: group id, coordinator,
        member (incl. static-member fencing), generation; None when all pass."""
        if not b.group_id:
            return E.invalid_group_id
        if not self.is_coordinator(node_id, b.group_id):
            return E.not_coordinator
        g = self.groups.get(b.group_id)
        member_error = self._member_error(g, b.member_id, getattr(b, "group_instance_id", None))
        if g is None or member_error is not None:
            return member_error or E.unknown_member_id
        if b.generation_id != g.generation:
            return E.illegal_generation
        return None

    def heartbeat(self, node_id: int, req: Request) -> Any:
        b = req.body
        now = req.now
        self.tick(now)
        cls = codec.response_schema(HEARTBEAT, req.version)

        def respond(code: E) -> Any:
            return build(cls, {"throttle_time": 0, "error_code": code})

        request_error = self._generation_member_error(node_id, b)
        if request_error is not None:
            return respond(request_error)
        g = self.groups[b.group_id]
        m = g.members[b.member_id]
        m.heartbeat_deadline = now + m.session_timeout_ms / 1000.0
        if g.state is GroupState.PREPARING_REBALANCE:
            return respond(E.rebalance_in_progress)
        return respond(E.none)

    def leave_group(self, node_id: int, req: Request) -> Any:
        b = req.body
        now = req.now
        self.tick(now)
        v = req.version
        cls = codec.response_schema(LEAVE_GROUP, v)
        if v >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in b.members]
        else:
            leaving = [(b.member_id, None)]

        def respond(top: E, per_member: list[E]) -> Any:
            if v < 3 and per_member and top == E.none:
                top = per_member[0]
            members = [
                {"member_id": mid, "group_instance_id": iid, "error_code": code}
                for (mid, iid), code in zip(leaving, per_member, strict=False)
            ]
            return build(cls, {"throttle_time": 0, "error_code": top, "members": members})

        if not b.group_id:
            return respond(E.invalid_group_id, [])
        if not self.is_coordinator(node_id, b.group_id):
            return respond(E.not_coordinator, [])
        g = self.groups.get(b.group_id)
        codes: list[E] = []
        for mid, iid in leaving:
            if g is not None and iid is not None:
                # A static member leaves by instance id (an empty member id is allowed).
                current = g.static_members.get(iid)
                if current is None:
                    codes.append(E.unknown_member_id)
                elif mid and mid != current:
                    codes.append(E.fenced_instance_id)
                else:
                    self._remove_member(g, g.members[current], now)
                    codes.append(E.none)
            elif g is not None and mid in g.pending_members:
                del g.pending_members[mid]
                self._try_complete_join(g, now)
                codes.append(E.none)
            elif g is None or mid not in g.members:
                codes.append(E.unknown_member_id)
            else:
                self._remove_member(g, g.members[mid], now)
                codes.append(E.none)
        return respond(E.none, codes)

    # -- offset commits ----------------------------------------------------------

    def group_for_commit(self, group_id: str, now: float) -> Group:
        """The group an OffsetCommit or TxnOffsetCommit names, created empty if unknown."""
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        g.touched = now
        return g

    def offset_commit_error(
        self,
        g: Group,
        member_id: str,
        instance_id: str | None,
        generation: int,
        now: float,
        *,
        transactional: bool,
    ) -> E | None:
        """Kafka's validateOffsetCommit, then for OffsetCommit the state check of
        doCommitOffsets and the committing member's session refresh; None: commit."""
        if generation < 0 and g.state is GroupState.EMPTY:
            pass  # a commit from a consumer that manages its own assignment (or an admin)
        elif generation >= 0 or member_id or instance_id is not None:
            member_error = self._member_error(g, member_id, instance_id)
            if member_error is not None:
                return member_error
            if generation != g.generation:
                return E.illegal_generation
        elif not transactional:
            return E.unknown_member_id  # only members commit to a non-empty group
        if transactional:
            return None
        if g.state is GroupState.COMPLETING_REBALANCE:
            return E.rebalance_in_progress
        if member_id in g.members:
            m = g.members[member_id]
            m.heartbeat_deadline = now + m.session_timeout_ms / 1000.0
        return None
