"""A dev cluster served by trio in a background thread, for blocking clients.

    with ThreadedCluster(nodes=3, topics={"orders": 12}) as cluster:
        Producer({"bootstrap.servers": cluster.bootstrap})
        cluster.stop_node(1)

Fault hooks run on the trio thread (``trio.from_thread``), so they are safe to
call from the test's thread.  Start and stop are bounded in time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import trio

from devbroker.cluster import DevCluster

START_TIMEOUT = 15.0
STOP_TIMEOUT = 15.0


class ThreadedCluster:
    def __init__(
        self, nodes: int = 3, topics: Mapping[str, int] | None = None, **kwargs: Any
    ) -> None:
        self._args = (nodes, dict(topics or {}), kwargs)
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self.cluster: DevCluster | None = None

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> ThreadedCluster:
        self._thread = threading.Thread(target=self._run, name="dev-cluster", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise TimeoutError("dev cluster did not start in time")
        if self._error is not None:
            raise RuntimeError("dev cluster failed to start") from self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._thread is None:
            return
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(STOP_TIMEOUT)
        alive = self._thread.is_alive()
        self._thread = None
        if alive:
            raise TimeoutError("dev cluster did not stop in time")
        if self._error is not None:
            raise RuntimeError("dev cluster crashed") from self._error

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test thread
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        nodes, topics, kwargs = self._args
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with DevCluster(nodes=nodes, topics=topics, **kwargs) as cluster:
            self.cluster = cluster
            self._ready.set()
            await self._stop.wait()

    # -- calls into the trio thread ---------------------------------------------------

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._token is not None
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def run(self, afn: Callable[..., Any], *args: Any) -> Any:
        assert self._token is not None
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    @property
    def _cluster(self) -> DevCluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def bootstrap(self) -> str:
        return self._cluster.bootstrap

    @property
    def bootstrap_servers(self) -> str:
        return self._cluster.bootstrap_servers

    def create_topic(self, name: str, partitions: int) -> None:
        self.run_sync(self._cluster.create_topic, name, partitions)

    def leader_of(self, topic: str, partition: int) -> int:
        return int(self.run_sync(self._cluster.leader_of, topic, partition))

    def high_watermark(self, topic: str, partition: int) -> int:
        def hw() -> int:
            p = self._cluster.state.partition(topic, partition)
            assert p is not None
            return p.log.high_watermark

        return int(self.run_sync(hw))

    # -- fault hooks -------------------------------------------------------------------

    def evict_fetch_sessions(self) -> None:
        self.run_sync(self._cluster.evict_fetch_sessions)

    def stop_node(self, node_id: int) -> None:
        self.run(self._cluster.stop_node, node_id)

    def restart_node(self, node_id: int) -> None:
        self.run(self._cluster.restart_node, node_id)

    def set_delay(self, node_id: int, seconds: float) -> None:
        self.run_sync(self._cluster.set_delay, node_id, seconds)

    def drop_connections(self, node_id: int | None = None) -> None:
        self.run_sync(self._cluster.drop_connections, node_id)
