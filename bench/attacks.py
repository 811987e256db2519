"""Hostile clients against a proxy with default settings (issue 19's "Done when").

    .venv/bin/python -m bench.attacks                       # every attack, full size
    .venv/bin/python -m bench.attacks --only big-fetch,http-idle --label after
    .venv/bin/python -m bench.attacks --kafka --only big-fetch  # real Kafka upstream

One dev cluster process (one node; topics ``wide`` of 100,000 partitions and
``victim`` of 1) stays up for the run; for each attack a fresh ``kafka-fetch-proxy
run`` process starts in front of it with default settings (only the ports are
chosen at run time, and ``metrics_listen`` is set so that ``/healthz`` exists;
every ``KAFKA_FETCH_PROXY_*`` variable is removed from its environment).  While the
attack runs, this process watches the proxy from the outside:

- three probers send ApiVersions every 10 ms, each on its own connection, and record
  each round trip: an ApiVersions v99, which the proxy answers alone (the proxy's own
  round trip, :func:`own_api_versions_frame`); an ApiVersions v3 through the proxy,
  which relays it to the broker; the same straight to the broker (its own time).  A
  probe that waits longer than the interval also counts the probes it kept from being
  sent (HdrHistogram's coordinated-omission correction), so p99 is over time, not over
  answers;
- every 0.5 s a new connection sends one ApiVersions (does a newcomer get in?);
- ``/healthz`` is asked every 0.2 s on a new connection (2 s timeout);
- the proxy's RSS (``VmRSS``) is sampled every 50 ms, and its connections to the
  upstream broker are counted every 0.5 s (``/proc``, in a thread);
- a victim consumer (confluent-kafka, through the proxy) reads ``victim``, which a
  producer (direct to the cluster) writes 100 records a second to.

This process runs no automatic full collection (``gc.freeze`` and a gen-2 threshold out
of reach), so its own pauses are not counted as the proxy's.  The attack itself runs in
a separate process (``--worker``), so its own CPU does not stall the watchers: it prepares its frames, says ``ready``, starts on ``go`` and
prints one JSON line of what it saw.  Every attack is bounded in count and time, and
all traffic is to 127.0.0.1.

The four criteria (issue 19), over the attack's window: the proxy's own ApiVersions
p99 under 100 ms (the relayed and the broker's are reported beside it); maximum RSS under ``memory_budget_bytes`` + 64 MiB; every ``/healthz``
answer 200; the victim receives records with no gap over :data:`VICTIM_MAX_GAP`
seconds.  Reported besides: new connections served, RSS still held after the attack
(the retention rows), upstream connections.  Results go to
``var/attacks/<label>.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import itertools
import json
import math
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

MIB = 1 << 20
PROBE_INTERVAL = 0.010
RTT_P99_LIMIT = 0.100
RSS_HEADROOM = 64 * MIB
VICTIM_MAX_GAP = 2.0
"""Seconds without a victim record that count as "stopped receiving" (the producer
writes every 10 ms; librdkafka's fetch wait is 500 ms; 2 s leaves room for a busy
2-core machine)."""
WIDE_PARTITIONS = 100_000
LEAN_PARTITIONS = 30_000
WORKER_TIMEOUT = 200.0
"""Seconds an attack may run before its worker is killed (its window ends there)."""
PROXY_TREE = REPO
"""Where the proxy and the dev cluster run from (``--tree``: e.g. ``git archive HEAD``
unpacked, so that a run measures a commit, not a shared work tree's edits)."""
WORKER_CLIENT_ID = "hostile-client"


# -- frames ----------------------------------------------------------------------------


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def fetch_frame(
    topic: str,
    partitions: Iterable[int],
    *,
    correlation_id: int = 1,
    session_id: int = 0,
    session_epoch: int = -1,
) -> bytes:
    """A Fetch v12 (topic names) of *partitions* from offset 0, 1 MiB each, no wait."""
    from proxy.protocol import codec
    from proxy.protocol.messages import make

    mod = sys.modules[codec.request_schema(1, 12).__module__]
    parts = tuple(
        make(mod.FetchPartition, partition=p, fetch_offset=0, partition_max_bytes=MIB)
        for p in partitions
    )
    request = make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(0),
        min_bytes=1,
        max_bytes=50 * MIB,
        isolation_level=0,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=(make(mod.FetchTopic, topic=topic, partitions=parts),),
        forgotten_topics_data=(),
    )
    return _frame(codec.encode_request(request, correlation_id, WORKER_CLIENT_ID))


def api_versions_frame(correlation_id: int, client_id: str = "prober") -> bytes:
    from proxy.protocol import codec
    from proxy.protocol.messages import make

    mod = sys.modules[codec.request_schema(18, 3).__module__]
    request = make(
        mod.ApiVersionsRequest, client_software_name="attacks", client_software_version="1"
    )
    return _frame(codec.encode_request(request, correlation_id, client_id))


OWN_PROBE_VERSION = 99


def own_api_versions_frame(correlation_id: int) -> bytes:
    """An ApiVersions v99: above every version the proxy knows, so it answers it alone, as
    Kafka's broker does (a v0 UNSUPPORTED_VERSION with its range; the client then asks
    again lower), without the upstream broker.  Its round trip is the proxy's own: a
    relayed ApiVersions also waits for the broker, which serves the attack's own large
    fetches and sessions too (the dev cluster stalled for seconds under them before
    b0dee7d sliced its work)."""
    client = b"own-prober"
    header = struct.pack(">hhih", 18, OWN_PROBE_VERSION, correlation_id, len(client)) + client
    return _frame(header + b"\x00" + b"\x00\x00\x00")


def produce_head(declared: int) -> bytes:
    """The first bytes of a Produce v9 frame announcing *declared* bytes (never finished)."""
    client = WORKER_CLIENT_ID.encode()
    header = struct.pack(">hhih", 0, 9, 1, len(client)) + client + b"\x00"
    return struct.pack(">i", declared) + header


# -- the attacks (run in the worker process) --------------------------------------------


@dataclass
class Target:
    bootstrap: tuple[str, int]
    broker: tuple[str, int]
    http: tuple[str, int]
    topic: str


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _read_frame(sock: socket.socket) -> bytes:
    head = _read_exactly(sock, 4)
    (size,) = struct.unpack(">i", head)
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 4 * MIB))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _threads(fns: Sequence[Callable[[], None]]) -> None:
    ts = [threading.Thread(target=f, daemon=True) for f in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _closed(sock: socket.socket) -> bool:
    """True if the peer closed *sock* (EOF or reset); never blocks."""
    sock.setblocking(False)  # a socket with a timeout would wait that long on EAGAIN
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def big_fetch(
    t: Target, partitions: int, connections: int, rounds: int = 1, timeout: float = 120.0
) -> Callable[[], dict[str, Any]]:
    """*connections* sessionless Fetches of *partitions* at once, each on its own connection
    closed after its answer; *rounds* times in a row."""
    frame = fetch_frame(t.topic, range(partitions))

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {"request_bytes": len(frame), "answers": [], "errors": []}

        def one() -> None:
            began = time.monotonic()
            try:
                with socket.create_connection(t.broker, timeout=timeout) as s:
                    s.sendall(frame)
                    answer = _read_frame(s)
                out["answers"].append(
                    {"bytes": len(answer), "seconds": round(time.monotonic() - began, 3)}
                )
            except OSError as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}")

        for _ in range(rounds):
            _threads([one] * connections)
        return out

    return run


def unfinished_frames(
    t: Target, connections: int, send_bytes: int, hold: float, send_timeout: float = 30.0
) -> Callable[[], dict[str, Any]]:
    """*connections* each send *send_bytes* of a Produce frame announced just under
    ``max_frame_bytes``, then trickle a byte a second for *hold* seconds."""
    declared = 100 * MIB - 1
    chunk = b"\x00" * MIB

    def run() -> dict[str, Any]:
        sent = [0] * connections
        closed = [False] * connections

        def one(i: int) -> None:
            try:
                s = socket.create_connection(t.bootstrap, timeout=5)
            except OSError:
                closed[i] = True
                return
            try:
                s.settimeout(None)
                s.setblocking(False)
                head = produce_head(declared)
                deadline = time.monotonic() + send_timeout
                pending = memoryview(head)
                while sent[i] < send_bytes and time.monotonic() < deadline:
                    if not pending:
                        pending = memoryview(chunk[: min(MIB, send_bytes - sent[i])])
                    try:
                        n = s.send(pending)
                    except BlockingIOError:
                        time.sleep(0.01)  # the proxy is not reading: try again
                        continue
                    sent[i] += n
                    pending = pending[n:]
                end = time.monotonic() + hold
                while time.monotonic() < end:
                    time.sleep(1.0)
                    if _closed(s):
                        closed[i] = True
                        return
                    try:
                        sent[i] += s.send(b"\x00")
                    except BlockingIOError:
                        pass
            except OSError:
                closed[i] = True
            finally:
                s.close()

        _threads([lambda i=i: one(i) for i in range(connections)])
        return {"sent_bytes": sent, "closed_by_proxy": sum(closed)}

    return run


def pipelined_fetches(
    t: Target, fetches: int, partitions: int, timeout: float = 120.0
) -> Callable[[], dict[str, Any]]:
    """One connection pipelines *fetches* sessionless Fetches of *partitions* each."""
    frames = [fetch_frame(t.topic, range(partitions), correlation_id=i + 1) for i in range(fetches)]
    blob = b"".join(frames)

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {"sent_bytes": len(blob), "answers": 0, "error": None}
        with socket.create_connection(t.broker, timeout=timeout) as s:

            def read() -> None:
                try:
                    for _ in range(fetches):
                        _read_frame(s)
                        out["answers"] += 1
                except OSError as exc:
                    out["error"] = f"{type(exc).__name__}: {exc}"

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                s.sendall(blob)
            except OSError as exc:
                out["error"] = f"send: {type(exc).__name__}: {exc}"
            reader.join(timeout)
        return out

    return run


def abandoned_sessions(
    t: Target, sessions: int, partitions: int, parallel: int = 3
) -> Callable[[], dict[str, Any]]:
    """*sessions* connections each create a fetch session of *partitions*, then leave."""
    frame = fetch_frame(t.topic, range(partitions), session_id=0, session_epoch=0)

    def run() -> dict[str, Any]:
        ids: list[int] = []
        errors: list[str] = []
        lock = threading.Lock()
        todo = list(range(sessions))

        def worker() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                try:
                    with socket.create_connection(t.broker, timeout=60) as s:
                        s.sendall(frame)
                        answer = _read_frame(s)
                    # Fetch v12 response: correlation id, header tags, throttle, error, session
                    (session_id,) = struct.unpack_from(">i", answer, 4 + 1 + 4 + 2)
                    with lock:
                        ids.append(session_id)
                except OSError as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")

        _threads([worker] * parallel)
        return {"sessions_created": sum(1 for i in ids if i), "errors": errors[:5]}

    return run


def idle_sockets(
    address: tuple[str, int], count: int, hold: float, rate: float = 0.0
) -> Callable[[], dict[str, Any]]:
    """*count* connections that send nothing (opened *rate* a second, 0: as fast as they
    connect), all closed *hold* seconds after the first; no connect is tried after that.
    How many the server closed meanwhile."""

    def run() -> dict[str, Any]:
        socks: list[socket.socket] = []
        refused = 0
        began = time.monotonic()
        deadline = began + hold
        for i in range(count):
            if rate:
                wait = began + i / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                socks.append(socket.create_connection(address, timeout=min(2.0, left)))
            except OSError:
                refused += 1
        opened = time.monotonic() - began
        time.sleep(max(0.0, deadline - time.monotonic()))
        closed = sum(1 for s in socks if _closed(s))
        for s in socks:
            s.close()
        return {
            "opened": len(socks),
            "refused_at_connect": refused,
            "closed_by_server": closed,
            "open_seconds": round(opened, 2),
        }

    return run


@dataclass(frozen=True)
class Attack:
    name: str
    row: str
    """The row of issue 19's table it stages."""
    build: Callable[[Target, dict[str, Any]], Callable[[], dict[str, Any]]]
    full: dict[str, Any]
    lean: dict[str, Any]
    settle: float = 3.0
    """Seconds watched after the attack (RSS still held at the end is reported)."""
    settle_lean: float = 1.0
    retention: bool = False
    """A row about state kept after its owner left: RSS still held is a criterion."""
    lockout: bool = False
    """A row about connections that lock others out: every newcomer during the attack must
    be served (at ``max_connections`` a socket that has sent nothing gives its slot to a
    newcomer, so nobody waits for ``first_request_timeout_seconds``)."""


ATTACKS: dict[str, Attack] = {
    a.name: a
    for a in [
        Attack(
            "big-fetch",
            "One large Fetch freezes every client (one sessionless Fetch of 100,000 partitions)",
            lambda t, p: big_fetch(t, p["partitions"], 1, rounds=p.get("rounds", 1)),
            {"partitions": 100_000},
            {"partitions": 30_000, "rounds": 3},
        ),
        Attack(
            "admitted-fetch",
            "One large Fetch freezes every client (the largest sessionless Fetch "
            "max_fetch_partitions admits, 20,000 partitions)",
            lambda t, p: big_fetch(t, p["partitions"], 1, rounds=p.get("rounds", 1)),
            {"partitions": 20_000, "rounds": 3},
            {"partitions": 20_000},
        ),
        Attack(
            "nine-big-fetches",
            "One large Fetch freezes every client (nine of them at once)",
            lambda t, p: big_fetch(t, p["partitions"], p["connections"]),
            {"partitions": 100_000, "connections": 9},
            {"partitions": 10_000, "connections": 9},
        ),
        Attack(
            "unfinished-frames",
            "Request bytes have no overall bound (8 connections, 64 MiB each of an unfinished frame)",
            lambda t, p: unfinished_frames(
                t, p["connections"], p["send_bytes"], p["hold"], p.get("send_timeout", 30.0)
            ),
            {"connections": 8, "send_bytes": 64 * MIB, "hold": 15.0},
            {"connections": 8, "send_bytes": 64 * MIB, "hold": 3.0, "send_timeout": 5.0},
        ),
        Attack(
            "pipelined-fetches",
            "Queued fetches are decoded on arrival (40 pipelined fetches of 25,000 partitions)",
            lambda t, p: pipelined_fetches(t, p["fetches"], p["partitions"]),
            {"fetches": 40, "partitions": 25_000},
            {"fetches": 40, "partitions": 10_000},
        ),
        Attack(
            "abandoned-sessions",
            "Fetch sessions outlive their connection (54 sessions of 10,000 partitions, then gone)",
            lambda t, p: abandoned_sessions(t, p["sessions"], p["partitions"]),
            {"sessions": 54, "partitions": 10_000},
            {"sessions": 20, "partitions": 10_000},
            settle=10.0,
            settle_lean=4.0,
            retention=True,
        ),
        Attack(
            "closed-state",
            "A closed connection's state waits for the cyclic GC (two closed 100,000-partition fetches)",
            lambda t, p: big_fetch(t, p["partitions"], 1, rounds=2),
            {"partitions": 100_000},
            {"partitions": 30_000},
            settle=15.0,
            settle_lean=4.0,
            retention=True,
        ),
        Attack(
            "http-idle",
            "16 idle sockets take the health endpoint down (20 idle sockets on the HTTP port)",
            lambda t, p: idle_sockets(t.http, p["sockets"], p["hold"]),
            {"sockets": 20, "hold": 15.0},
            {"sockets": 20, "hold": 3.0},
        ),
        Attack(
            "idle-connections",
            "1,000 idle connections lock everyone out (1,000 connections that send nothing)",
            lambda t, p: idle_sockets(t.bootstrap, p["connections"], p["hold"]),
            {"connections": 1000, "hold": 20.0},
            {"connections": 1000, "hold": 5.0},
            lockout=True,
        ),
        Attack(
            "connection-leak",
            "1,000 idle connections lock everyone out (a leak: 4,000 connects in 30 s, none closed)",
            lambda t, p: idle_sockets(t.bootstrap, p["connections"], p["hold"], p["rate"]),
            {"connections": 4000, "hold": 30.0, "rate": 133.0},
            {"connections": 1500, "hold": 5.0, "rate": 500.0},
            lockout=True,
        ),
    ]
}


def worker_main(args: argparse.Namespace) -> int:
    """``--worker``: prepare the attack, print ``ready``, run on ``go``, print its JSON."""
    target = Target(_addr(args.bootstrap), _addr(args.broker), _addr(args.http), args.topic)
    attack = ATTACKS[args.worker]
    run = attack.build(target, json.loads(args.params))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    began = time.monotonic()
    faulthandler.dump_traceback_later(WORKER_TIMEOUT - 5)  # where it hung, if it does
    result = run()
    result["seconds"] = round(time.monotonic() - began, 3)
    print(json.dumps(result), flush=True)
    return 0


# -- watching the proxy ------------------------------------------------------------------


def rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections of process *pid* to *port* (its upstream connections)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        count = 0
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "01" and int(cols[2].rsplit(":", 1)[1], 16) == port:
                        count += cols[9] in inodes
        return count
    except OSError:
        return 0


@dataclass
class Watch:
    """What the watchers saw, as (monotonic time, value) series."""

    probes: list[tuple[float, float]] = field(default_factory=list)
    probe_errors: list[tuple[float, str]] = field(default_factory=list)
    probe_outstanding: float | None = None
    newcomers: list[tuple[float, bool]] = field(default_factory=list)
    healthz: list[tuple[float, str]] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    upstream: list[tuple[float, int]] = field(default_factory=list)
    victim: list[float] = field(default_factory=list)
    victim_errors: list[str] = field(default_factory=list)
    own: Watch | None = None
    """A prober whose ApiVersions the proxy answers alone (:func:`own_api_versions_frame`)."""
    direct: Watch | None = None
    """The relayed prober's ApiVersions straight to the upstream broker (the broker's own time)."""


async def _api_versions(stream: trio.abc.Stream, frame: bytes) -> None:
    await stream.send_all(frame)
    buf = b""
    need = 4
    while len(buf) < need:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("closed by the proxy")
        buf += chunk
        if need == 4 and len(buf) >= 4:
            need = 4 + struct.unpack(">i", buf[:4])[0]


async def prober(
    address: tuple[str, int], w: Watch, frame: Callable[[int], bytes] | None = None
) -> None:
    """ApiVersions every PROBE_INTERVAL on one connection (reconnecting if it is closed)."""
    make_frame = api_versions_frame if frame is None else frame
    cid = 0
    while True:
        try:
            stream = await trio.open_tcp_stream(*address)
        except OSError as exc:
            w.probe_errors.append((trio.current_time(), f"connect: {exc}"))
            await trio.sleep(0.1)
            continue
        try:
            next_at = trio.current_time()
            while True:
                cid += 1
                sent = trio.current_time()
                w.probe_outstanding = sent
                await _api_versions(stream, make_frame(cid))
                w.probe_outstanding = None
                w.probes.append((sent, trio.current_time() - sent))
                next_at = max(next_at + PROBE_INTERVAL, trio.current_time())
                await trio.sleep_until(next_at)
        except (OSError, ConnectionError, trio.BrokenResourceError) as exc:
            w.probe_outstanding = None
            w.probe_errors.append((trio.current_time(), f"{type(exc).__name__}: {exc}"))
        finally:
            await trio.aclose_forcefully(stream)


async def newcomers(address: tuple[str, int], w: Watch) -> None:
    """Every 0.5 s a new connection asks ApiVersions once (2 s to answer)."""
    while True:
        began = trio.current_time()
        ok = False
        with trio.move_on_after(2.0):
            try:
                stream = await trio.open_tcp_stream(*address)
                try:
                    await _api_versions(stream, api_versions_frame(1, "newcomer"))
                    ok = True
                finally:
                    await trio.aclose_forcefully(stream)
            except (OSError, ConnectionError, trio.BrokenResourceError):
                pass
        w.newcomers.append((began, ok))
        await trio.sleep_until(began + 0.5)


async def healthz_poller(address: tuple[str, int], w: Watch) -> None:
    """GET /healthz every 0.2 s on a new connection, as a kubelet does (2 s timeout)."""
    while True:
        began = trio.current_time()
        status = "timeout"
        with trio.move_on_after(2.0):
            try:
                stream = await trio.open_tcp_stream(*address)
                try:
                    await stream.send_all(
                        b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n"
                    )
                    buf = b""
                    while b"\r\n" not in buf:
                        chunk = await stream.receive_some(4096)
                        if not chunk:
                            break
                        buf += chunk
                    parts = buf.split(b" ", 2)
                    status = parts[1].decode() if len(parts) > 1 else "closed"
                finally:
                    await trio.aclose_forcefully(stream)
            except (OSError, trio.BrokenResourceError) as exc:
                status = type(exc).__name__
        w.healthz.append((began, status))
        await trio.sleep_until(began + 0.2)


async def sampler(pid: int, upstream_port: int, w: Watch) -> None:
    tick = 0
    while True:
        now = trio.current_time()
        rss = rss_of(pid)
        if rss is not None:
            w.rss.append((now, rss))
        if tick % 10 == 0:
            # Off the probers' loop: with a thousand sockets open, reading the proxy's fds
            # and the kernel's TCP table took 30-200 ms of this process's CPU, which the
            # probers' round trips then counted as the proxy's.
            count = await trio.to_thread.run_sync(connections_to, pid, upstream_port)
            w.upstream.append((now, count))
        tick += 1
        await trio.sleep_until(now + 0.05)


class Victim:
    """A confluent-kafka consumer through the proxy reading ``victim`` in its own thread."""

    def __init__(self, bootstrap: str, topic: str, w: Watch) -> None:
        self.bootstrap, self.topic, self.w = bootstrap, topic, w
        self._stop = threading.Event()
        self.reading = threading.Event()
        """Set once the consumer has received 20 records."""
        self._thread = threading.Thread(target=self._run, name="victim", daemon=True)

    def __enter__(self) -> Victim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "victim",
                "enable.auto.commit": False,
                "client.id": "victim",
                "socket.timeout.ms": 10000,
            }
        )
        try:
            c.assign([TopicPartition(self.topic, 0, OFFSET_END)])
            while not self._stop.is_set():
                msg = c.poll(0.1)
                if msg is None:
                    continue
                if msg.error():
                    self.w.victim_errors.append(str(msg.error()))
                    continue
                self.w.victim.append(trio_clock())
                if len(self.w.victim) >= 20:
                    self.reading.set()
        finally:
            c.close()


class Producer:
    """Writes a record to ``victim`` every 10 ms, straight to the cluster."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self.sent = 0

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        from confluent_kafka import Producer as P

        p = P({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "acks": 1})
        next_at = time.monotonic()
        while not self._stop.is_set():
            p.produce(self.topic, value=b"victim-%d" % self.sent)
            self.sent += 1
            p.poll(0)
            next_at += 0.01
            time.sleep(max(0.0, next_at - time.monotonic()))
        p.flush(5)


def trio_clock() -> float:
    """trio's default clock is time.perf_counter() plus an offset; the victim thread reads
    time.monotonic() against the same origin through this."""
    return time.monotonic() - _CLOCK_SKEW


_CLOCK_SKEW = 0.0


# -- numbers -------------------------------------------------------------------------


def corrected_rtts(w: Watch, start: float, end: float) -> list[float]:
    """Round trips of probes sent in [start, end], with the probes a slow one held back."""
    out: list[float] = []
    for sent, rtt in w.probes:
        if start <= sent <= end:
            out.append(rtt)
            missing = rtt - PROBE_INTERVAL
            while missing > PROBE_INTERVAL:
                out.append(missing)
                missing -= PROBE_INTERVAL
    if w.probe_outstanding is not None and w.probe_outstanding <= end:
        age = end - max(w.probe_outstanding, start)
        out.append(age)
    return out


def _others(w: Watch, start: float, end: float) -> dict[str, float]:
    """The proxy-only and the direct-to-broker probers' round trips over the window."""
    out = {}
    for name, watch in (("own", w.own), ("direct", w.direct)):
        if watch is not None:
            rtts = corrected_rtts(watch, start, end)
            out[f"{name}_p99_ms"] = round(percentile(rtts, 0.99) * 1000, 1)
            out[f"{name}_max_ms"] = round(max(rtts, default=math.nan) * 1000, 1)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _judged_until(samples: Sequence[tuple[float, Any]], start: float, end: float) -> float:
    """The end of the window a watcher's *samples* are judged over: the attack's, or, when
    none was taken within it (a window shorter than the watcher's interval: a fetch
    refused at once), the time of the first one after it began.  A proxy that answers
    nothing after the attack began still has none."""
    if any(start <= t <= end for t, _ in samples):
        return end
    return min((t for t, _ in samples if t >= start), default=end)


def summarize(
    attack: Attack,
    w: Watch,
    window: tuple[float, float],
    settle_end: float,
    budget: int,
    worker: dict[str, Any],
    proxy_exit: int | None,
) -> dict[str, Any]:
    start, end = window
    probed = _judged_until(w.probes, start, end)
    rtts = corrected_rtts(w, start, probed)
    # judged: the round trip the proxy answers alone (the relayed one is reported beside it)
    own = corrected_rtts(w.own, start, probed) if w.own is not None else rtts
    quiet = corrected_rtts(w, start - 1.0, start)
    before = [r for t, r in w.rss if t < start]
    baseline = sorted(before)[len(before) // 2] if before else 0
    during = [r for t, r in w.rss if start <= t <= end]
    after = [r for t, r in w.rss if end < t <= settle_end]
    rss_max = max(during + after) if during or after else 0
    held = (after[-1] if after else rss_max) - baseline
    polled = _judged_until(w.healthz, start, end)
    health = [s for t, s in w.healthz if start <= t <= polled]
    health_counts: dict[str, int] = {}
    for s in health:
        health_counts[s] = health_counts.get(s, 0) + 1
    got = [t for t in w.victim if start <= t <= end]
    edges = [start, *got, end]
    gap = max(b - a for a, b in itertools.pairwise(edges))
    new = [ok for t, ok in w.newcomers if start <= t <= end]
    ups = [n for t, n in w.upstream if start <= t <= settle_end]
    limit = budget + RSS_HEADROOM
    criteria = {
        "rtt_p99": bool(own) and percentile(own, 0.99) < RTT_P99_LIMIT,
        "rss": rss_max < limit,
        "healthz": bool(health) and all(s == "200" for s in health),
        # (a window shorter than the gap allowed, e.g. a fetch refused at once, may see none)
        "victim": (bool(got) or end - start < VICTIM_MAX_GAP) and gap <= VICTIM_MAX_GAP,
    }
    if proxy_exit is not None:
        criteria = dict.fromkeys(criteria, False)
    if attack.retention:
        criteria["rss_held"] = held < RSS_HEADROOM
    if attack.lockout:
        criteria["newcomers"] = bool(new) and all(new)
    return {
        "attack": attack.name,
        "row": attack.row,
        "window_seconds": round(end - start, 2),
        "rtt": {
            "baseline_p99_ms": round(percentile(quiet, 0.99) * 1000, 1),
            "p50_ms": round(percentile(rtts, 0.50) * 1000, 1),
            "p99_ms": round(percentile(rtts, 0.99) * 1000, 1),
            "max_ms": round(max(rtts, default=math.nan) * 1000, 1),
            **_others(w, start, probed),
            "answered": sum(1 for t, _ in w.probes if start <= t <= probed),
            # when the slowest round trips began, in seconds from the attack's start
            "slowest": [
                [round(t - start, 2), round(r * 1000, 1)]
                for t, r in sorted(
                    ((t, r) for t, r in w.probes if start <= t <= probed), key=lambda p: -p[1]
                )[:3]
            ],
            "errors": [e for t, e in w.probe_errors if start <= t <= probed][:5],
        },
        "rss": {
            "baseline_mib": round(baseline / MIB, 1),
            "max_mib": round(rss_max / MIB, 1),
            "limit_mib": round(limit / MIB, 1),
            "held_after_mib": round(held / MIB, 1),
        },
        "healthz": health_counts,
        "victim": {"records": len(got), "max_gap_s": round(gap, 2), "errors": w.victim_errors[:5]},
        "newcomers": {"served": sum(new), "tried": len(new)},
        "upstream_connections_max": max(ups, default=0),
        "worker": worker,
        "proxy_exit": proxy_exit,
        "criteria": criteria,
        "passed": all(criteria.values()),
    }


# -- the run ----------------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_FETCH_PROXY_")}


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, 20000):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20000), hard))


class Proc:
    """A child process that prints ``KEY=VALUE`` lines; stopped by its pid."""

    def __init__(self, argv: list[str], keys: Sequence[str], env: dict[str, str]) -> None:
        from support.procs import read_lines

        self.err = tempfile.NamedTemporaryFile(prefix="attacks-", suffix=".err", delete=False)
        self.proc = subprocess.Popen(
            argv,
            cwd=PROXY_TREE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_normal_priority,
        )
        try:
            self.lines = read_lines(self.proc, keys, 60)
        except (TimeoutError, RuntimeError) as exc:
            self.stop()
            tail = Path(self.err.name).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{argv[:4]} did not start: {exc}\n{tail}") from exc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int | None:
        """Stop it; its exit status if it had already exited by itself."""
        exited = self.proc.poll()
        if exited is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()
        if os.environ.get("ATTACKS_KEEP_LOGS"):
            print(f"log of {self.proc.args[2]}: {self.err.name}", file=sys.stderr)
        else:
            Path(self.err.name).unlink(missing_ok=True)
        return exited


def start_devbroker(partitions: int) -> Proc:
    return Proc(
        [
            sys.executable,
            "-m",
            "devbroker",
            "--nodes",
            "1",
            "--port",
            "0",
            "--topic",
            f"wide:{partitions}",
            "--topic",
            "victim:1",
        ],
        ("bootstrap",),
        _clean_env(),
    )


NICE = 0
"""``--nice``: the priority of the proxy and of this process (the watchers)."""


def start_proxy(upstream: str) -> Proc:
    from support.procs import run_args

    proc = Proc(
        [sys.executable, "-m", "proxy", *run_args(upstream)], ("bootstrap", "metrics"), _clean_env()
    )
    if NICE:
        os.setpriority(os.PRIO_PROCESS, proc.pid, NICE)
    return proc


def broker_listener(bootstrap: str) -> tuple[str, int]:
    """The proxy's listener for the cluster's first broker (from a Metadata answer)."""
    from support.rawclient import RawClient

    with RawClient(bootstrap, timeout=20) as c:
        meta = c.call(
            3,
            12,
            {
                "topics": [],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
    b = meta.brokers[0]
    return b.host, int(b.port)


def _default_budget() -> int:
    from proxy import config

    return int(config.schema()["properties"]["memory_budget_bytes"]["default"])


def _normal_priority() -> None:
    """In a child: back to priority 0 (``--nice`` is for the proxy and the watchers only)."""
    if NICE:
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def _spawn_worker(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_clean_env(),
        preexec_fn=_normal_priority,
    )


async def run_attack(
    attack: Attack,
    params: dict[str, Any],
    upstream: str,
    *,
    baseline: float = 2.0,
    settle: float | None = None,
    proxy: Proc | None = None,
    on_settle: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One attack against a fresh proxy in front of *upstream* (*proxy*: one started for it
    already, which it stops too); its summary.  *on_settle* is called as the watch after
    the attack begins."""
    global _CLOCK_SKEW
    _CLOCK_SKEW = time.monotonic() - trio.current_time()
    if proxy is None:
        proxy = await trio.to_thread.run_sync(start_proxy, upstream)
    proxy_exit: int | None = None
    worker_proc: subprocess.Popen[bytes] | None = None
    try:
        bootstrap = _addr(proxy.lines["bootstrap"])
        http = _addr(proxy.lines["metrics"].split("//", 1)[1].split("/", 1)[0])
        broker = await trio.to_thread.run_sync(broker_listener, proxy.lines["bootstrap"])
        w = Watch()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler, proxy.pid, _addr(upstream)[1], w)
            nursery.start_soon(prober, bootstrap, w)
            w.own, w.direct = Watch(), Watch()
            nursery.start_soon(prober, bootstrap, w.own, own_api_versions_frame)
            nursery.start_soon(prober, _addr(upstream), w.direct)
            nursery.start_soon(newcomers, bootstrap, w)
            nursery.start_soon(healthz_poller, http, w)
            with Victim(proxy.lines["bootstrap"], "victim", w) as victim:
                # the victim is reading before the attack starts
                if not await trio.to_thread.run_sync(victim.reading.wait, 30):
                    raise RuntimeError("the victim consumer received nothing in 30 s")
                argv = [
                    sys.executable,
                    "-m",
                    "bench.attacks",
                    "--worker",
                    attack.name,
                    "--params",
                    json.dumps(params),
                    "--bootstrap",
                    proxy.lines["bootstrap"],
                    "--broker",
                    f"{broker[0]}:{broker[1]}",
                    "--http",
                    f"{http[0]}:{http[1]}",
                ]
                worker_proc = await trio.to_thread.run_sync(_spawn_worker, argv)
                assert worker_proc.stdin is not None and worker_proc.stdout is not None
                ready = await trio.to_thread.run_sync(worker_proc.stdout.readline)
                if ready.strip() != b"ready":
                    raise RuntimeError(f"attack worker did not start: {ready!r}")
                await trio.sleep(baseline)
                start = trio.current_time()
                worker_proc.stdin.write(b"go\n")
                worker_proc.stdin.flush()
                line = b""
                with trio.move_on_after(WORKER_TIMEOUT):
                    line = await trio.to_thread.run_sync(
                        worker_proc.stdout.readline, abandon_on_cancel=True
                    )
                end = trio.current_time()
                worker = json.loads(line) if line.strip() else {"error": "no result in time"}
                if worker_proc.poll() is None:
                    worker_proc.kill()
                await trio.to_thread.run_sync(worker_proc.wait, 30)
                if on_settle is not None:
                    on_settle()
                await trio.sleep(attack.settle if settle is None else settle)
                settle_end = trio.current_time()
                proxy_exit = proxy.proc.poll()
            nursery.cancel_scope.cancel()
        return summarize(attack, w, (start, end), settle_end, _default_budget(), worker, proxy_exit)
    finally:
        if worker_proc is not None and worker_proc.poll() is None:
            worker_proc.kill()
            worker_proc.wait(10)
        proxy.stop()


class _NextProxy:
    """The next attack's proxy, started in a thread while the current attack settles."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.proc: Proc | None = None
        self.error: BaseException | None = None
        self.done = trio.Event()

    async def start(self) -> None:
        try:
            self.proc = await trio.to_thread.run_sync(start_proxy, self.upstream)
        except Exception as exc:
            self.error = exc
        finally:
            self.done.set()

    async def take(self) -> Proc:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.proc is not None
        return self.proc


async def run_all(
    names: Sequence[str], size: str, upstream: str, on_result: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Each attack in turn.  The next attack's proxy process starts while the one before
    settles (about a second an attack): a process of its own, which the watchers of the
    one settling never look at (they watch their proxy's pid and its connections)."""
    results = []
    pending: _NextProxy | None = None
    async with trio.open_nursery() as nursery:
        try:
            for i, name in enumerate(names):
                attack = ATTACKS[name]
                proxy = None
                if pending is not None:
                    taken, pending = pending, None
                    proxy = await taken.take()

                def start_next(i: int = i) -> None:
                    nonlocal pending
                    if i + 1 < len(names):
                        pending = _NextProxy(upstream)
                        nursery.start_soon(pending.start)

                if size == "full":
                    result = await run_attack(
                        attack, attack.full, upstream, proxy=proxy, on_settle=start_next
                    )
                else:
                    result = await run_attack(
                        attack,
                        attack.lean,
                        upstream,
                        baseline=1.0,
                        settle=attack.settle_lean,
                        proxy=proxy,
                        on_settle=start_next,
                    )
                result["params"] = attack.full if size == "full" else attack.lean
                on_result(result)
                results.append(result)
        finally:
            if pending is not None:  # an attack failed while the next proxy started
                with trio.CancelScope(shield=True):
                    await pending.done.wait()
                if pending.proc is not None:
                    pending.proc.stop()
    return results


def table(results: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'attack':<20} {'base':>5} {'own p99':>8} {'own max':>8} {'rel p99':>8} {'dir p99':>8} {'RSS max':>8} {'limit':>6} {'held':>6} "
        f"{'healthz':<18} {'victim':>7} {'gap s':>6} {'new':>7} {'up':>5}  result"
    )
    lines = [head]
    for r in results:
        c = r["criteria"]
        failed = [k for k, ok in c.items() if not ok]
        health = ",".join(f"{k}:{v}" for k, v in sorted(r["healthz"].items()))
        lines.append(
            f"{r['attack']:<20} {r['rtt'].get('baseline_p99_ms', ''):>5} {r['rtt'].get('own_p99_ms', ''):>8} {r['rtt'].get('own_max_ms', ''):>8} "
            f"{r['rtt']['p99_ms']:>8} {r['rtt'].get('direct_p99_ms', ''):>8} "
            f"{r['rss']['max_mib']:>8} {r['rss']['limit_mib']:>6.0f} {r['rss']['held_after_mib']:>6} "
            f"{health:<18} {r['victim']['records']:>7} {r['victim']['max_gap_s']:>6} "
            f"{r['newcomers']['served']:>3}/{r['newcomers']['tried']:<3} "
            f"{r['upstream_connections_max']:>5}  "
            + ("pass" if not failed else "FAIL " + ",".join(failed))
        )
    return "\n".join(lines)


def _cell(r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return ["-"] * 5
    health = ", ".join(f"{k}: {v}" for k, v in sorted(r["healthz"].items()))
    failed = [k for k, ok in r["criteria"].items() if not ok]
    base = r["rtt"].get("baseline_p99_ms")
    rtt = f"{r['rtt']['p99_ms']:,.0f}" + (f" (quiet {base:,.0f})" if base is not None else "")
    if "own_p99_ms" in r["rtt"]:  # the judged one, then the relayed one and the broker's
        rtt = (
            f"{r['rtt']['own_p99_ms']:,.0f} (rel {r['rtt']['p99_ms']:,.0f},"
            f" dir {r['rtt']['direct_p99_ms']:,.0f})"
        )
    return [
        rtt,
        f"{r['rss']['max_mib']:,.0f} (held {r['rss']['held_after_mib']:,.0f})",
        health,
        f"{r['victim']['records']:,} (gap {r['victim']['max_gap_s']} s)",
        "pass" if not failed else "fails " + ", ".join(failed),
    ]


def compare(before: Path, after: Path) -> str:
    """A Markdown table of two results files, row by row (for RELIABILITY.md)."""
    runs = [json.loads(before.read_text()), json.loads(after.read_text())]
    by_name = [{r["attack"]: r for r in run["results"]} for run in runs]
    head = [
        "attack",
        "run",
        "ApiVersions p99 ms",
        "RSS max MiB",
        "/healthz",
        "victim records",
        "criteria",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in ATTACKS:
        if not any(name in b for b in by_name):
            continue
        for label, run, rows in zip(("before", "after"), runs, by_name, strict=True):
            cells = [name if label == "before" else "", f"{label} ({run['commit'][:7]})"]
            lines.append("| " + " | ".join(cells + _cell(rows.get(name))) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__.split("\n")[0])
    p.add_argument("--only", help="comma-separated attacks (default: all): " + ",".join(ATTACKS))
    p.add_argument("--size", choices=["full", "lean"], default="full")
    p.add_argument("--label", default="run", help="results go to var/attacks/<label>.json")
    p.add_argument("--out", type=Path, help="write the results JSON here instead")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other attacks' results already in the file (a row re-run)",
    )
    p.add_argument(
        "--tree",
        type=Path,
        help="run the proxy and dev cluster from this source tree (default: this one)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the proxy and the watchers at this priority (e.g. -10 as root on a machine "
        "busy with other work, so that what is measured is the proxy's loop, not the "
        "scheduler); the attack, the cluster and the clients keep theirs",
    )
    p.add_argument("--kafka", action="store_true", help="real Kafka 4 upstream instead")
    p.add_argument(
        "--kafka-partitions",
        type=int,
        default=1000,
        help="partitions of 'wide' on real Kafka (fetches name the rest, which Kafka answers "
        "UNKNOWN_TOPIC_OR_PARTITION)",
    )
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="print a Markdown table of two results files and exit",
    )
    # worker mode (internal)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--params", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", help=argparse.SUPPRESS)
    p.add_argument("--broker", help=argparse.SUPPRESS)
    p.add_argument("--http", help=argparse.SUPPRESS)
    p.add_argument("--topic", default="wide", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return 0
    _raise_fd_limit()
    if args.worker:
        return worker_main(args)
    global PROXY_TREE, NICE
    if args.tree is not None:
        PROXY_TREE = args.tree.resolve()
    if args.nice:
        NICE = args.nice
        os.setpriority(os.PRIO_PROCESS, 0, NICE)  # before any thread starts
    # The watchers time round trips in this process: its own full collections (80-100 ms
    # each, about one a second while a thousand sockets' results pile up) would be
    # counted as the proxy's, so this process runs the young generations only.
    gc.freeze()
    gc.set_threshold(700, 10, 1_000_000_000)
    names = args.only.split(",") if args.only else list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        p.error(f"unknown attacks {unknown}: one of {list(ATTACKS)}")
    out = args.out or REPO / "var" / "attacks" / f"{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    if args.merge and out.exists():
        kept = [r for r in json.loads(out.read_text())["results"] if r["attack"] not in names]

    def show(result: dict[str, Any]) -> None:
        done.append(result)
        print(table([result]).splitlines()[1], flush=True)
        rows = sorted([*kept, *done], key=lambda r: list(ATTACKS).index(r["attack"]))
        out.write_text(json.dumps(_meta(args, rows), indent=2))

    print(table([]), flush=True)
    if args.kafka:
        from support.kafka import KafkaCluster

        with tempfile.TemporaryDirectory(prefix="attacks-kafka-") as tmp:
            with KafkaCluster(1, workdir=Path(tmp)) as kafka:
                kafka.create_topic("wide", args.kafka_partitions, timeout=120)
                kafka.create_topic("victim", 1)
                with Producer(kafka.bootstrap, "victim"):
                    trio.run(run_all, names, args.size, kafka.bootstrap, show)
    else:
        broker = start_devbroker(WIDE_PARTITIONS if args.size == "full" else LEAN_PARTITIONS)
        try:
            with Producer(broker.lines["bootstrap"], "victim"):
                trio.run(run_all, names, args.size, broker.lines["bootstrap"], show)
        finally:
            broker.stop()
    print(f"\n{table(done)}\n\nresults: {out}")
    return 0 if all(r["passed"] for r in done) else 1


def _meta(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    marker = PROXY_TREE / ".commit"  # written beside a `git archive` export
    commit = (
        marker.read_text().strip()
        if marker.exists()
        else subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "label": args.label,
        "commit": commit[:12],
        "tree": str(PROXY_TREE),
        "upstream": "kafka-4" if args.kafka else "devbroker",
        "size": args.size,
        "nice": args.nice,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }


if __name__ == "__main__":
    sys.exit(main())
