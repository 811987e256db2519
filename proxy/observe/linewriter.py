"""Text lines written to a sink by a thread of their own, never on the event loop.

``put(line)`` never blocks and never waits: the line joins a queue bounded in
bytes, or is refused (``False``) when the queue is full or the writer closed, and
the caller counts what it lost.  One daemon thread takes everything queued at
once, writes it in one call and flushes the sink, so a slow or stuck disk holds up
that thread alone.  A batch counts against the bound until its write returns, so
the memory held is at most ``max_queued_bytes`` (lines are ASCII: characters are
bytes) however long the sink takes.

``flush()`` waits until every line queued so far is written (for tests and
callers that read the sink); ``close()`` refuses further lines, lets the thread
write what is queued (up to a timeout: a stuck disk must not hold up the
process's exit), then closes the sink when the writer owns it.

The lock is held only to append a line or to take the queue, never during a
write.  The thread starts with the first line, so a writer nobody writes to
costs no thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO


def _ignore(count: int) -> None:
    pass


def _ignore_error(count: int, error: BaseException) -> None:
    pass


class LineWriter:
    """Queues lines for a background thread that writes them to ``sink``, in order."""

    def __init__(
        self,
        sink: IO[str],
        *,
        max_queued_bytes: int,
        on_written: Callable[[int], None] = _ignore,
        on_failed: Callable[[int, BaseException], None] = _ignore_error,
        close_sink: bool = False,
        name: str = "line-writer",
    ) -> None:
        if max_queued_bytes <= 0:
            raise ValueError("max_queued_bytes must be positive")
        self.sink = sink
        self.max_queued_bytes = max_queued_bytes
        self._on_written = on_written
        """Called from the thread with the number of lines a write took."""
        self._on_failed = on_failed
        """Called from the thread with the number of lines a failed write lost, and why."""
        self._close_sink = close_sink
        self._name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._lines: list[str] = []
        self.queued_bytes = 0
        """Bytes queued or being written (what the bound applies to)."""
        self._writing = 0
        """Lines of the batch being written."""
        self._closed = False
        self._thread: threading.Thread | None = None

    def put(self, line: str) -> bool:
        """Queue ``line``; False (and nothing queued) when the queue is full or closed."""
        size = len(line)
        with self._lock:
            if self._closed or self.queued_bytes + size > self.max_queued_bytes:
                return False
            self._lines.append(line)
            self.queued_bytes += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            else:
                self._work.notify()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every line queued so far is written (False: the timeout passed first)."""
        with self._lock:
            return self._done.wait_for(lambda: self.queued_bytes == 0, timeout)

    def close(self, timeout: float | None = None) -> int:
        """Refuse further lines, write what is queued, close the sink; returns the lines left.

        Left (not 0) only when the thread did not finish within ``timeout``: the
        sink is then left open for the thread, which may still write them.
        """
        with self._lock:
            self._closed = True
            self._work.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                with self._lock:
                    return len(self._lines) + self._writing
        if self._close_sink:
            self.sink.close()
        return 0

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._lines and not self._closed:
                    self._work.wait()
                if not self._lines:  # closed, and everything is written
                    return
                batch, self._lines = self._lines, []
                self._writing = len(batch)
            size = sum(map(len, batch))
            try:
                self.sink.write("".join(batch))
                self.sink.flush()
            except Exception as exc:  # the sink failed (OSError, ValueError on a closed file)
                self._report(self._on_failed, len(batch), exc)
            else:
                self._report(self._on_written, len(batch))
            with self._lock:
                self.queued_bytes -= size
                self._writing = 0
                self._done.notify_all()

    @staticmethod
    def _report(callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception:  # counting must never stop the writer
            pass
