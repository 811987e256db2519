"""The Java, franz-go and sarama test programs (tests/clients/) as processes.

    run = java(stack.bootstrap, produce(topic, 4, 400, "j"), assign(topic, 4, 400))
    run.records("assign")        # [(partition, offset, key, value), ...] in arrival order
    run.nodes()                  # every broker address the client reported or connected to

``tests/clients/build`` (called by ``scripts/setup --test``) builds them into the cache
(``$KAFKA_FETCH_PROXY_CACHE/clients``); a missing build is a :class:`SetupError`.  Every
program runs its steps in order, prints JSON lines, and exits non-zero on any error;
:func:`run` bounds it with an absolute timeout and kills it by its pid if it overruns.
A step is ``op,topic,partitions,count[,extra]`` (see tests/clients/java/ProxyClient.java).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kafka import SetupError, archive_flags, cache_dir, jar_version, java, jvm_lib

SETUP_HINT = "run `scripts/setup --test` (it runs tests/clients/build)"
JVM_OPTS = ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
GO_PROGRAMS = ("franz-go", "sarama")
Record = tuple[int, int, str, str]
"""(partition, offset, key, value) as a client received it."""


class ClientFailed(AssertionError):
    """A client program exited non-zero or overran its timeout."""


def clients_dir() -> Path:
    return cache_dir() / "clients"


def _built(path: Path, what: str) -> Path:
    if not path.exists():
        raise SetupError(f"{what} is not built ({path} is missing): {SETUP_HINT}")
    return path


def java_jar() -> Path:
    """The Java test clients' classes as one jar (``tests/clients/build``)."""
    return _built(clients_dir() / "java" / "clients.jar", "the Java client")


def java_command(*jvm_options: str) -> list[str]:
    """tests/clients/java/ProxyClient.java, from its class archive when there is one
    (*jvm_options*: more options of the JVM)."""
    jar, lib = java_jar(), jvm_lib("clients")
    return [
        java(),
        *JVM_OPTS,
        *(jvm_options or archive_flags(lib, jar)),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        f"{jar}{os.pathsep}{lib}/*",
        "ProxyClient",
    ]


def java_soak_command() -> list[str]:
    """tests/clients/java/SoakClient.java: a producer and a consumer side by side for a while
    (one step, ``soak,TOPIC,PARTITIONS,SECONDS,RATE[,PROPERTIES_FILE]``)."""
    command = java_command()
    _built(clients_dir() / "java" / "classes" / "SoakClient.class", "the Java soak client")
    return [*command[:-1], "SoakClient"]


def go_command(program: str) -> list[str]:
    if program not in GO_PROGRAMS:
        raise ValueError(f"no Go client {program!r}; there are {GO_PROGRAMS}")
    return [str(_built(clients_dir() / "go" / "bin" / program, f"the Go client {program}"))]


def versions() -> dict[str, str]:
    """The client library versions the programs were built with."""
    out = {"kafka-clients": jar_version(jvm_lib("clients"), "kafka-clients")}
    listing = _built(clients_dir() / "go" / "versions", "the Go clients' version list")
    for line in listing.read_text().splitlines():
        path, _, version = line.partition(" ")
        out[{"github.com/twmb/franz-go": "franz-go", "github.com/IBM/sarama": "sarama"}[path]] = (
            version
        )
    return out


# -- steps ----------------------------------------------------------------------------------


def produce(topic: str, partitions: int, count: int, tag: str) -> str:
    return f"produce,{topic},{partitions},{count},{tag}"


def assign(topic: str, partitions: int, count: int) -> str:
    return f"assign,{topic},{partitions},{count}"


def group(topic: str, partitions: int, count: int, protocol: str = "classic") -> str:
    return f"group,{topic},{partitions},{count},{protocol}"


def share(topic: str, partitions: int, count: int) -> str:
    return f"share,{topic},{partitions},{count}"


def expected(partitions: int, count: int, tag: str) -> list[tuple[int, str, str]]:
    """What a produce step writes, as (partition, key, value), in send order."""
    out = []
    for i in range(count):
        p, seq = i % partitions, i // partitions
        out.append((p, f"k{p}-{seq}", f"{tag}|{p}|{seq}|" + "v" * (seq % 40)))
    return out


# -- running --------------------------------------------------------------------------------


@dataclass
class ClientRun:
    lines: list[dict[str, Any]]
    stderr: str
    seconds: float

    def of(self, op: str, step: str | None = None) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines
            if line["op"] == op and (step is None or line.get("step") == step)
        ]

    def records(self, step: str) -> list[Record]:
        return [(r["p"], r["o"], r["k"], r["v"]) for r in self.of("record", step)]

    def one(self, op: str, step: str | None = None) -> dict[str, Any]:
        found = self.of(op, step)
        assert len(found) == 1, f"{len(found)} {op!r} lines, expected one"
        return found[0]

    def nodes(self) -> set[tuple[str, int]]:
        """Every broker address the client reported (metadata) or connected to."""
        out = {(n["host"], n["port"]) for m in self.of("metadata") for n in m["nodes"]}
        out |= {(c["host"], c["port"]) for c in self.of("connect")}
        return out

    def step_ms(self) -> dict[str, int]:
        return {d["step"]: d["ms"] for d in self.of("done")}


def run(
    command: list[str],
    bootstrap: str,
    *steps: str,
    client_id: str,
    timeout: float = 90.0,
) -> ClientRun:
    """Run a client program's *steps* against *bootstrap*; its parsed output.

    Each step may take up to *timeout* seconds inside the program; the process as a whole
    gets that plus a margin, then it is killed by its pid.
    """
    args = [
        *command,
        "--bootstrap",
        bootstrap,
        "--client-id",
        client_id,
        "--timeout",
        str(timeout),
        *steps,
    ]
    overall = timeout * len(steps) + 30.0
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        try:
            code = proc.wait(overall)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            code = None
        finally:
            if proc.poll() is None:  # interrupted: never leave it running
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    seconds = time.monotonic() - started
    name = Path(command[-1]).name
    tail = "\n".join(stdout.splitlines()[-5:])
    if code is None:
        raise ClientFailed(
            f"{name} overran {overall:.0f} s and was killed\nstdout tail:\n{tail}\n"
            f"stderr tail:\n{stderr[-3000:]}"
        )
    if code != 0:
        raise ClientFailed(
            f"{name} exited {code} after {seconds:.1f} s\nstdout tail:\n{tail}\n"
            f"stderr tail:\n{stderr[-3000:]}"
        )
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    return ClientRun(lines, stderr, seconds)


def java_client(bootstrap: str, *steps: str, client_id: str, timeout: float = 90.0) -> ClientRun:
    return run(java_command(), bootstrap, *steps, client_id=client_id, timeout=timeout)


def go_client(
    program: str, bootstrap: str, *steps: str, client_id: str, timeout: float = 90.0
) -> ClientRun:
    return run(go_command(program), bootstrap, *steps, client_id=client_id, timeout=timeout)
