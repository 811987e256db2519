"""Builds the JVM class archives the tests' JVMs start from (``support.kafka``'s "class
archives"): ``python -m support.class_archives``, run by ``scripts/setup --test``.

For each broker line (:data:`support.kafka.VERSIONS`): one single-node cluster started and
stopped with ``-XX:ArchiveClassesAtExit``; the JVM writes the classes it loaded as it
exits on SIGTERM.  For Kafka's tools (the ``kafka-tools`` jars, at :data:`LINE`): a
console consumer that reads a record of that line's cluster, so the client's classes are
in it.  Each archive is
written beside its final name and renamed once whole, and is checked to map
(``-Xshare:on``, which fails when it cannot) before it is kept.  An archive already built
for the same JDK and jars is left as it is, so a second run starts nothing.

A failure is reported and the archive left out: the JVMs then start without one, slower,
as before.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .kafka import (
    TOOL_JVM_OPTS,
    VERSIONS,
    KafkaCluster,
    class_archive,
    java,
    jvm_lib,
)

TIMEOUT = 120.0
LINE = "4"


def _maps_for(lib: Path, main: str) -> Callable[[Path], bool]:
    """Whether a JVM of *lib* (*main* ``--version``) starts with an archive mapped
    (``-Xshare:on`` refuses to start otherwise)."""

    def maps(archive: Path) -> bool:
        command = [java(), "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", f"{lib}/*"]
        done = subprocess.run(
            [*command, main, "--version"],
            capture_output=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return done.returncode == 0

    return maps


def _keep(written: Path, final: Path, check: Callable[[Path], bool]) -> None:
    """Rename *written* to *final* if the JVM wrote it and it maps."""
    if not written.is_file():
        why = "the JVM wrote none"
    elif not check(written):
        why = "it does not map"
    else:
        written.replace(final)
        print(f"class_archives: {final.name} ({final.stat().st_size >> 20} MiB)", file=sys.stderr)
        return
    written.unlink(missing_ok=True)
    print(f"class_archives: {final.name} left out: {why}", file=sys.stderr)


def _consume(bootstrap: str, topic: str, extra: list[str], lib: Path) -> None:
    tools = "org.apache.kafka.tools."
    subprocess.run(
        [
            java(),
            *TOOL_JVM_OPTS,
            *extra,
            "-cp",
            f"{lib}/*",
            tools + "consumer.ConsoleConsumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "1",
            "--timeout-ms",
            "20000",
        ],
        capture_output=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _produce_one(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"x")
    producer.flush(30)


def build(line: str, work: Path, *, with_tools: bool) -> None:
    lib = jvm_lib(VERSIONS[line])
    broker = class_archive(lib)
    tools_lib = jvm_lib("kafka-tools") if with_tools else None
    tools = class_archive(tools_lib) if tools_lib is not None else None
    need_tools = tools is not None and not tools.is_file()
    if broker.is_file() and not need_tools:
        return
    broker.parent.mkdir(parents=True, exist_ok=True)
    written = broker.with_suffix(".tmp")
    cluster = KafkaCluster(1, workdir=work / f"kafka-{line}", version=line, name=f"archive-{line}")
    if not broker.is_file():
        cluster.archive_at_exit = [f"-XX:ArchiveClassesAtExit={written}"]
    with cluster:
        if need_tools:
            assert tools is not None and tools_lib is not None
            topic = "class-archive"
            cluster.create_topic(topic, 1)
            _produce_one(cluster.bootstrap, topic)
            tools_written = tools.with_suffix(".tmp")
            _consume(
                cluster.bootstrap, topic, [f"-XX:ArchiveClassesAtExit={tools_written}"], tools_lib
            )
            _keep(tools_written, tools, _maps_for(tools_lib, "org.apache.kafka.tools.TopicCommand"))
    if cluster.archive_at_exit:
        _keep(written, broker, _maps_for(lib, "kafka.Kafka"))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="class-archives-") as tmp:
        for line in VERSIONS:
            build(line, Path(tmp), with_tools=line == LINE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
