"""Spark session and schema helpers shared by the pipeline jobs.

Spark's own Kafka source (``format("kafka")``) lives in a Maven artifact that PySpark
does not ship, ``org.apache.spark:spark-sql-kafka-0-10_2.13`` at PySpark's exact version.
``scripts/setup --test`` (``scripts/resolve-jvm spark-kafka``) resolves it and what it
needs (spark-token-provider-kafka, kafka-clients, commons-pool2) into the cache,
``$KAFKA_FETCH_PROXY_CACHE/jvm/spark-kafka/lib`` (default cache ``~/.cache/kafka-fetch-proxy``);
:func:`kafka_connector_jars` finds those jars and :func:`session` puts them on ``spark.jars``,
so jobs and tests run offline (never ``spark.jars.packages``, which downloads at run time).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession
from pyspark.sql import types as T

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"

CONNECTOR = "spark-sql-kafka-0-10_2.13"
"""The artifact of Spark's built-in Kafka source."""
JARS_ENV = "KAFKA_FETCH_PROXY_SPARK_JARS"
"""A directory of jars, or comma-separated jar files, to use instead of the cache."""


class ConnectorMissing(RuntimeError):
    """Spark's Kafka connector jars are not where the job looks, or are for another Spark."""


def cache_dir() -> Path:
    """``$KAFKA_FETCH_PROXY_CACHE``, default ``~/.cache/kafka-fetch-proxy`` (as scripts/setup)."""
    env = os.environ.get("KAFKA_FETCH_PROXY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kafka-fetch-proxy"


def kafka_connector_jars(jars: str | None = None) -> list[Path]:
    """The jar files of Spark's Kafka connector for the installed PySpark.

    *jars* (a directory or comma-separated jar files), else ``$KAFKA_FETCH_PROXY_SPARK_JARS``,
    else the cache that ``scripts/setup --test`` fills.  Raises :class:`ConnectorMissing`,
    naming what to run, when there is no connector jar or it is for another Spark version.
    """
    cached = cache_dir() / "jvm" / "spark-kafka" / "lib"
    if jars:
        spec, origin = jars, "--jars"
    elif os.environ.get(JARS_ENV):
        spec, origin = os.environ[JARS_ENV], f"${JARS_ENV}"
    else:
        spec, origin = str(cached), "the cache"
    where = f"{spec} ({origin})"
    setup = (
        f"run `scripts/setup --test` (it resolves Spark's Kafka connector for PySpark "
        f"{pyspark.__version__} into {cached}), or give the jars with --jars / ${JARS_ENV}"
    )
    found: list[Path] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        path = Path(part).expanduser()
        if path.is_dir():
            found += sorted(path.glob("*.jar"))
        elif path.is_file() and path.suffix == ".jar":
            found.append(path)
        else:
            raise ConnectorMissing(f"{path} is no directory and no jar, in {where}: {setup}")
    versions = [
        m.group(1)
        for jar in found
        if (m := re.fullmatch(re.escape(CONNECTOR) + r"-(\d[\w.\-]*)\.jar", jar.name))
    ]
    if not versions:
        raise ConnectorMissing(f"no {CONNECTOR} jar in {where}: {setup}")
    if versions != [pyspark.__version__]:
        raise ConnectorMissing(
            f"{CONNECTOR} {', '.join(versions)} in {where}, but PySpark is "
            f"{pyspark.__version__} and the connector must be exactly Spark's version: {setup}"
        )
    return found


def installed_kafka_connector() -> list[Path]:
    """:func:`kafka_connector_jars` when they are installed, else no jars."""
    try:
        return kafka_connector_jars()
    except ConnectorMissing:
        return []


def under_spark_submit() -> bool:
    """Whether spark-submit started this process (its JVM runs already, with its conf).

    spark-submit hands the JVM's port to Python; the JVM's conf (``--master``, ``--jars``)
    is not visible from Python before the first SparkContext, so it must not be overridden.
    """
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session(
    app_name: str, master: str | None = None, jars: Sequence[Path] | None = None
) -> SparkSession:
    """A SparkSession: *master* if given, spark-submit's master if set, else ``local[*]``.

    Python workers run with this interpreter, so the data sources' dependencies
    (confluent-kafka) are importable on executors in local mode.

    *jars* go on ``spark.jars`` (default: Spark's Kafka connector when it is installed,
    :func:`installed_kafka_connector`).  Spark puts them on the driver's class path only
    when its JVM starts, that is for the first SparkSession of the process, so every
    session made here carries the connector and the order in which jobs or tests create
    sessions does not matter.  Under spark-submit the JVM is already running with
    spark-submit's own ``--master`` and ``--jars``/``--packages``: those are left alone.
    :func:`require_kafka_source` says whether ``format("kafka")`` can be loaded.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = under_spark_submit()
    builder = SparkSession.builder.appName(app_name)
    if master is None and not submitted:
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local") or _on_loopback(master):
            # Local mode (or a cluster on this machine's loopback) needs no network beyond
            # loopback; without this Spark binds to the host's first non-loopback interface.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
    if not submitted:
        jars = installed_kafka_connector() if jars is None else jars
        if jars:
            builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _on_loopback(master: str) -> bool:
    """A standalone master on this machine's loopback (``spark://127.0.0.1:PORT``)."""
    return bool(re.fullmatch(r"spark://(127\.\d+\.\d+\.\d+|localhost|\[::1\]):\d+", master))


def stop(spark: SparkSession, timeout: float = 30.0) -> None:
    """Stop *spark* and the JVM that PySpark started for it (by its pid), if it started one.

    The next :func:`session` of the process then starts a fresh JVM, with that session's
    jars on the driver's class path.  Under spark-submit the JVM is spark-submit's: only
    the session stops.
    """
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None or under_spark_submit():
        return
    proc = gateway.proc  # the spark-submit process launch_gateway() started
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()  # the JVM exits when its stdin closes
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def require_kafka_source(spark: SparkSession) -> None:
    """Raise :class:`ConnectorMissing` unless the driver can load ``format("kafka")``."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "kafka", spark._jsparkSession.sessionState().conf()
        )
    except (AnalysisException, Py4JJavaError) as exc:  # PySpark converts most to the former
        first = str(exc).strip().splitlines()[0]
        raise ConnectorMissing(
            f"Spark's `kafka` source is not on the driver's class path ({first}). Its jars "
            "must be there when Spark's JVM starts: create the process's first SparkSession "
            "with pipeline.spark.session() after `scripts/setup --test` (or --jars / "
            f"{JARS_ENV}); under spark-submit pass them with --jars."
        ) from exc


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def spark_type(node: dict[str, Any], defs: dict[str, Any]) -> T.DataType:
    """The Spark type of a JSON Schema node (the subset our schemas use)."""
    node = _resolve(node, defs)
    if "const" in node and "type" not in node:
        value = node["const"]
        return T.LongType() if isinstance(value, int) else T.StringType()
    types = node.get("type")
    if isinstance(types, list):
        non_null = [t for t in types if t != "null"]
        if len(non_null) != 1:
            raise ValueError(f"unsupported union type {types}")
        types = non_null[0]
    if types == "integer":
        return T.LongType()
    if types == "number":
        return T.DoubleType()
    if types == "string":
        return T.StringType()
    if types == "boolean":
        return T.BooleanType()
    if types == "array":
        return T.ArrayType(spark_type(node["items"], defs))
    if types == "object":
        if "properties" in node:
            return struct_from(node, defs)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return T.MapType(T.StringType(), spark_type(extra, defs))
    raise ValueError(f"unsupported JSON Schema node: {json.dumps(node)[:200]}")


def struct_from(node: dict[str, Any], defs: dict[str, Any]) -> T.StructType:
    return T.StructType(
        [
            T.StructField(name, spark_type(sub, defs), True)
            for name, sub in node["properties"].items()
        ]
    )


def load_json_schema(name: str) -> dict[str, Any]:
    with open(SCHEMAS_DIR / name, encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def spark_schema(name: str) -> T.StructType:
    """The Spark schema of the events described by ``schemas/<name>``."""
    doc = load_json_schema(name)
    return struct_from(doc, doc.get("$defs", {}))
