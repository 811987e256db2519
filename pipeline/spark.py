"""Spark session and schema helpers shared by the pipeline jobs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark import SparkConf
from pyspark.sql import SparkSession
from pyspark.sql import types as T

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"


def session(app_name: str, master: str | None = None) -> SparkSession:
    """A SparkSession: *master* if given, spark-submit's master if set, else ``local[*]``.

    Python workers run with this interpreter, so the data sources' dependencies
    (confluent-kafka) are importable on executors in local mode.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        builder = builder.master("local[*]")
    resolved = master or SparkConf().get("spark.master", "local[*]")
    if resolved.startswith("local"):
        # Local mode needs no network beyond loopback; without this Spark binds to
        # the host's first non-loopback interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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
