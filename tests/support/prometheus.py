"""Run Debian's real ``prometheus`` against HTTP targets, and query it, for integration tests.

Usage (from a trio test whose targets are served on the same event loop, call
the blocking helpers in a worker thread so the loop keeps serving scrapes)::

    with run_prometheus([f"127.0.0.1:{port}"], tmp_path) as prom:
        await trio.to_thread.run_sync(prom.wait_for_scrape)
        value = await trio.to_thread.run_sync(prom.value, 'sum(kafka_fetch_proxy_...)')

The binary comes from the Debian package ``prometheus``; ``scripts/setup --test``
(run by ``scripts/test``) installs it when missing.  Prometheus listens on a free
loopback port, keeps its TSDB in the test's tmp dir and scrapes every second;
every wait polls with an absolute deadline and fails with the tail of
Prometheus's own log.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .loopback import free_port

JOB = "kafka-fetch-proxy"
POLL_SECONDS = 0.1
START_TIMEOUT = 60.0
WAIT_TIMEOUT = 30.0


class PrometheusError(AssertionError):
    pass


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail(
            "Debian's `prometheus` binary is not installed: run scripts/setup --test "
            "(or apt-get install prometheus)"
        )
    return path


def scrape_config(
    targets: Sequence[str], *, scrape_interval: str = "1s", metrics_path: str = "/metrics"
) -> str:
    """A prometheus.yml scraping ``targets`` (host:port) as job ``kafka-fetch-proxy``."""
    config = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": metrics_path,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    return json.dumps(config, indent=2)  # YAML is a superset of JSON


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def api(self, path: str, params: dict[str, str] | None = None) -> Any:
        """``GET /api/v1/<path>``; returns ``data`` or raises with Prometheus's error."""
        try:
            body = self._get("/api/v1/" + path, params)
        except urllib.error.HTTPError as e:
            with e:
                raise PrometheusError(f"{path} {params}: HTTP {e.code}: {e.read()!r}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; a list of ``{"metric": {...labels}, "value": [ts, "v"]}``."""
        data = self.api("query", {"query": expr})
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} is not a vector query: {data['resultType']}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single value of ``expr``, or None when it has no series (yet)."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{expr!r} returned {len(result)} series: {result}")
        return float(result[0]["value"][1])

    def wait_until(
        self,
        expr: str,
        predicate: Callable[[float], bool] = lambda v: True,
        *,
        timeout: float = WAIT_TIMEOUT,
    ) -> float:
        """Poll ``expr`` until it has a value satisfying ``predicate``; return that value."""
        deadline = time.monotonic() + timeout
        last: float | None = None
        while True:
            last = self.value(expr)
            if last is not None and predicate(last):
                return last
            if time.monotonic() >= deadline:
                raise PrometheusError(
                    f"{expr!r} did not reach the expected value within {timeout}s "
                    f"(last: {last}); targets: {self.targets()}\n{self.log_tail()}"
                )
            time.sleep(POLL_SECONDS)

    def wait_for_scrape(self, *, count: int = 1, timeout: float = WAIT_TIMEOUT) -> None:
        """Wait until ``count`` targets of the job have been scraped successfully."""
        self.wait_until(f'sum(up{{job="{JOB}"}})', lambda v: v >= count, timeout=timeout)

    def series_names(self) -> set[str]:
        names: list[str] = self.api("label/__name__/values")
        return set(names)

    def targets(self) -> list[dict[str, Any]]:
        try:
            active: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        except (OSError, PrometheusError) as e:
            return [{"error": repr(e)}]
        return [
            {k: t.get(k) for k in ("scrapeUrl", "health", "lastError", "lastScrape")}
            for t in active
        ]


def _wait_ready(server: PrometheusServer, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(server.url + "/-/ready", timeout=5) as r:
                if r.status == 200:
                    return True
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(POLL_SECONDS)
    raise PrometheusError(f"prometheus not ready after {timeout}s\n{server.log_tail()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@contextmanager
def run_prometheus(
    targets: Sequence[str],
    workdir: Path,
    *,
    scrape_interval: str = "1s",
    metrics_path: str = "/metrics",
    start_timeout: float = START_TIMEOUT,
) -> Iterator[PrometheusServer]:
    """Start Prometheus scraping ``targets``; stop it (and wait for it) on exit."""
    binary = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(
        scrape_config(targets, scrape_interval=scrape_interval, metrics_path=metrics_path)
    )
    for attempt in range(3):  # the free port may be taken between probe and bind
        port = free_port()
        log_path = workdir / f"prometheus-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / f'tsdb-{attempt}'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=info",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        server = PrometheusServer(f"http://127.0.0.1:{port}", process, log_path)
        try:
            if not _wait_ready(server, start_timeout):
                if "address already in use" in server.log_tail():
                    continue
                raise PrometheusError(
                    f"prometheus exited with {process.returncode}\n{server.log_tail()}"
                )
            yield server
            return
        finally:
            _stop(process)
    raise PrometheusError("prometheus could not bind a free port in 3 attempts")
