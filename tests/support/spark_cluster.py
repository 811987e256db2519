"""A real standalone Spark cluster on loopback: one master and N workers, from PySpark's scripts.

    with standalone_cluster(tmp_path, workers=2) as cluster:
        fleet_report.run(..., master=cluster.master_url)

PySpark's wheel ships ``bin/spark-class`` (not the ``sbin/start-*.sh`` wrappers of
a full Spark distribution), which execs the JVM of the class it is given: the
master and each worker are started with it, so the pid of each process started
here is the JVM's and each is stopped by that pid (SIGTERM, then SIGKILL).  Every
port is 0 (chosen by the JVM); the master's URL and the workers' registrations are
read from the master's log, each awaited with an absolute deadline.  Each
worker's ``work_dir`` holds one directory per executor it ran (``app-*/N``), which
is how a test shows the job ran on the workers and not in the driver.

A test process keeps one driver JVM for every Spark job it runs (starting one costs tens
of CPU-seconds): :func:`end_application` ends a job's application (its SparkContext) and
keeps the JVM, so the next job, on ``local[*]`` or on a standalone master, starts in it;
:func:`stop_driver` stops the JVM by its pid (tests/conftest.py, at the session's end).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
WORKER_MEMORY = "1g"
"""Each worker offers this much; the executors' default (1g) must fit."""


_ENDED: list[object] = []
"""The last SparkSession :func:`end_application` stopped (whose driver JVM still runs)."""


def end_application() -> None:
    """Stop this process's SparkSession, if any: its application ends (a standalone
    cluster's executors with it), the driver JVM stays for the next session."""
    from pyspark.sql import SparkSession

    spark = SparkSession._instantiatedSession
    if spark is not None:
        spark.stop()
        _ENDED[:] = [spark]


def stop_driver() -> None:
    """Stop this process's SparkSession and the driver JVM PySpark started, by its pid."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from pipeline.spark import stop

    spark = SparkSession._instantiatedSession or (_ENDED[0] if _ENDED else None)
    _ENDED.clear()
    if isinstance(spark, SparkSession) and SparkContext._gateway is not None:
        stop(spark)


class ClusterError(RuntimeError):
    """The cluster did not come up; the message has the tail of the master's log."""


@dataclass
class StandaloneCluster:
    master_url: str
    dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    work_dirs: list[Path] = field(default_factory=list)

    def executor_dirs(self) -> list[list[Path]]:
        """Per worker, the executor directories it created (``app-*/N``)."""
        return [sorted(d.glob("app-*/*")) for d in self.work_dirs]


def _env(base: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(base / "local"),
        SPARK_DAEMON_MEMORY="256m",
        # the master and workers only place executors: the client compiler is plenty
        # (the executors' own options come from the application's conf)
        SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        # no REST submission server (it binds the fixed port 6066) and no web UI work
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        SPARK_NO_DAEMONIZE="1",
        PYSPARK_PYTHON=sys.executable,
    )
    env.pop("SPARK_CONF_DIR", None)
    return env


def _await_log(
    path: Path, pattern: str, count: int, deadline: float, proc: subprocess.Popen[bytes]
) -> list[re.Match[str]]:
    """The first ``count`` matches of *pattern* in the log at *path*, awaited until *deadline*."""
    regex = re.compile(pattern)
    while True:
        text = path.read_text(errors="replace") if path.exists() else ""
        found = list(regex.finditer(text))
        if len(found) >= count:
            return found[:count]
        if proc.poll() is not None:
            raise ClusterError(f"{path.name}: process exited ({proc.returncode}):\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{path.name}: no {count} x {pattern!r} in time:\n{text[-3000:]}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


@contextmanager
def standalone_cluster(base: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    """A master and *workers* workers (one core each) on 127.0.0.1, stopped at the end."""
    if not SPARK_CLASS.is_file():
        raise ClusterError(f"{SPARK_CLASS} is missing: PySpark's wheel should ship it")
    base.mkdir(parents=True, exist_ok=True)
    (base / "local").mkdir(exist_ok=True)
    env = _env(base)
    deadline = time.monotonic() + START_TIMEOUT_S
    with ExitStack() as stack:

        def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
            log = base / f"{name}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [str(SPARK_CLASS), *args],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=base,
                )
            stack.callback(_stop, proc)
            return proc, log

        master, master_log = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
        )
        [m] = _await_log(
            master_log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", 1, deadline, master
        )
        cluster = StandaloneCluster(m.group(1), base, [master])
        for i in range(workers):
            work = base / f"worker-{i}"
            work.mkdir(exist_ok=True)
            proc, _ = start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                cluster.master_url,
                *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
                *("--cores", "1", "--memory", WORKER_MEMORY, "--work-dir", str(work)),
            )
            cluster.procs.append(proc)
            cluster.work_dirs.append(work)
        _await_log(master_log, r"Registering worker 127\.0\.0\.1:\d+", workers, deadline, master)
        yield cluster
