"""Builds the JVM class archives the tests' JVMs start from (``support.kafka``'s "class
archives"): ``python -m support.class_archives``, run by ``scripts/setup --test``.

For each broker line (:data:`support.kafka.VERSIONS`): one single-node cluster started and
stopped with ``-XX:ArchiveClassesAtExit``; the JVM writes the classes it loaded as it
exits on SIGTERM.  For Kafka's tools (the ``kafka-tools`` jars, at :data:`LINE`): a
console consumer that reads a record of that line's cluster, so the client's classes are
in it; for the Java test client (``tests/clients/java``, its jar before the
``kafka-clients`` jars): a produce and an assign step against the same cluster.  Each archive is
written beside its final name and renamed once whole, and is checked to map
(``-Xshare:on``, which fails when it cannot) before it is kept.  An archive already built
for the same JDK and jars is left as it is, so a second run starts nothing.

A failure is reported and the archive left out: the JVMs then start without one, slower,
as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import clients
from .kafka import (
    QUIET_CDS,
    VERSIONS,
    KafkaCluster,
    class_archive,
    java,
    jvm_lib,
    tool_command,
)

TIMEOUT = 120.0
LINE = "4"


def _maps_for(classpath: str) -> Callable[[Path], bool]:
    """Whether a JVM of *classpath* starts with an archive mapped: ``-Xshare:on`` refuses
    to start when it cannot map it, or when the class path is not the archive's."""

    def maps(archive: Path) -> bool:
        command = [java(), "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", classpath]
        done = subprocess.run(
            [*command, "-version"],
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


def _consume(bootstrap: str, topic: str, archive: list[str], lib: Path) -> None:
    """A console consumer of Kafka's tools reads a record of *topic* (*archive*: the
    options that write its class archive)."""
    subprocess.run(
        tool_command(
            lib,
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "1",
            "--timeout-ms",
            "20000",
            archive=archive,
        ),
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


def _java_client(bootstrap: str, topic: str, archive: Path) -> None:
    """The Java test client (``support.clients``) produces and reads back a few records,
    writing its class archive as it exits."""
    clients.run(
        clients.java_command(f"-XX:ArchiveClassesAtExit={archive}", *QUIET_CDS),
        bootstrap,
        clients.produce(topic, 1, 10, "a"),
        clients.assign(topic, 1, 10),
        client_id="class-archive",
    )


def build(line: str, work: Path, *, clients_too: bool) -> None:
    """The archives of *line*'s broker and, with *clients_too*, of the tools and the Java
    test client (each only when missing)."""
    lib = jvm_lib(VERSIONS[line])
    broker = class_archive(lib)
    tools_lib = jvm_lib("kafka-tools") if clients_too else None
    tools = class_archive(tools_lib) if tools_lib is not None else None
    client_jar, client_lib = clients.java_jar(), jvm_lib("clients")
    client = class_archive(client_lib, client_jar) if clients_too else None
    need_tools = tools is not None and not tools.is_file()
    need_client = client is not None and not client.is_file()
    if broker.is_file() and not need_tools and not need_client:
        return
    broker.parent.mkdir(parents=True, exist_ok=True)
    written = broker.with_suffix(".tmp")
    cluster = KafkaCluster(1, workdir=work / f"kafka-{line}", version=line, name=f"archive-{line}")
    if not broker.is_file():
        cluster.archive_at_exit = [f"-XX:ArchiveClassesAtExit={written}", *QUIET_CDS]
    with cluster:
        if need_tools:
            assert tools is not None and tools_lib is not None
            topic = "class-archive"
            cluster.create_topic(topic, 1)
            _produce_one(cluster.bootstrap, topic)
            tools_written = tools.with_suffix(".tmp")
            _consume(
                cluster.bootstrap,
                topic,
                [f"-XX:ArchiveClassesAtExit={tools_written}", *QUIET_CDS],
                tools_lib,
            )
            _keep(tools_written, tools, _maps_for(f"{tools_lib}/*"))
        if need_client:
            assert client is not None
            topic = "class-archive-client"
            cluster.create_topic(topic, 1)
            client_written = client.with_suffix(".tmp")
            try:
                _java_client(cluster.bootstrap, topic, client_written)
            except clients.ClientFailed as e:
                print(f"class_archives: the Java client failed: {e}", file=sys.stderr)
            classpath = f"{client_jar}{os.pathsep}{client_lib}/*"
            _keep(client_written, client, _maps_for(classpath))
    if cluster.archive_at_exit:
        _keep(written, broker, _maps_for(f"{lib}/*"))


def main() -> int:
    """Each line's archives, the lines at once: each build mostly waits on its JVMs, and
    on a fresh 2-core machine the lines one after the other took 31 s of set-up, the
    newest line's 22 of them."""
    with (
        tempfile.TemporaryDirectory(prefix="class-archives-") as tmp,
        ThreadPoolExecutor(len(VERSIONS)) as pool,
    ):
        builds = [
            pool.submit(build, line, Path(tmp), clients_too=line == LINE) for line in VERSIONS
        ]
        for done in builds:
            done.result()  # (what one raised is raised here)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
