"""The fleet report: aggregate decision logs from any number of proxies with Spark.

Input: decision-log files (JSON lines, ``schemas/decision-log.schema.json``),
given as files, directories or globs.  Output directory:

* ``starvation_by_partition/`` (Parquet): per topic-partition (topics by name, with
  their id when known), events in which it was starved, max and p99 of the rounds it
  had gone unserved while data waited;
* ``limit_hits_by_policy/``: per client policy and limit, how many shaped
  responses that limit held data back in (weighted by 1/sample_rate);
* ``savings/``: per proxy instance, upstream fetch bytes saved by incremental
  sessions (sessionless-equivalent minus actual) and record bytes served from
  the reuse buffer instead of fetched again (weighted);
* ``trimmed/``: per policy, record bytes and records held back by limits (weighted);
* ``latency_by_client/``: per client id, p50/p90/p99/max shaped-fetch latency (ms);
* ``rack_by_client/``: per client id, upstream record bytes from a broker in the
  proxy's rack, in another rack and of unknown rack, the in-rack share, the
  cross-zone bytes avoided and their estimated cost, and the partitions redirected
  to a preferred read replica (weighted);
* ``rack_by_topic/`` and ``rack_by_client_topic/``: the same bytes and cost per
  topic and per (client id, topic), from each event's ``rack_by_topic`` (topics by
  name, named from ids as in the starvation table);
* ``report.html`` with PNG charts beside it.

Cost avoided is each event's ``cross_zone_avoided_record_bytes`` / 1e9 times the
``cross_zone_price_per_gb`` it carries (the proxy's setting when it wrote it), or
``--cross-zone-price-per-gb`` (default 0.02) for events that carry none.  Events of
schema version 1 (before rack-aware fetching) count all their upstream bytes as of
unknown rack.

Run: ``python -m pipeline.fleet_report --input logs/ --output report/`` (``local[*]``)
or ``spark-submit --master spark://... pipeline/fleet_report.py --input ... --output ...``.
"""

from __future__ import annotations

import argparse
import glob
import html
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pipeline.spark import session, spark_schema
else:
    from .spark import session, spark_schema

SCHEMA_FILE = "decision-log.schema.json"
SUPPORTED_SCHEMA_VERSIONS = (1, 2)
"""Version 2 added rack-aware fetching's fields; version 1 events read them as null (0)."""
TABLES = (
    "starvation_by_partition",
    "limit_hits_by_policy",
    "savings",
    "trimmed",
    "latency_by_client",
    "rack_by_client",
    "rack_by_topic",
    "rack_by_client_topic",
)
DEFAULT_PRICE_PER_GB = 0.02
BYTES_PER_GB = 1e9
RACK_COLUMNS = (
    "same_rack_record_bytes",
    "other_rack_record_bytes",
    "unknown_rack_record_bytes",
    "cross_zone_avoided_record_bytes",
)


class Progress:
    """Stage-by-stage progress on stderr, with elapsed time, for long runs."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.done = 0
        self.start = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        print(f"[{self.done}/{self.stages} {elapsed:6.1f}s] {what}", file=sys.stderr, flush=True)


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Files from files, directories (every file below, recursively) and globs; sorted, unique."""
    found: set[str] = set()
    for item in inputs:
        matches = glob.glob(item, recursive=True) or [item]
        for m in matches:
            p = Path(m)
            if p.is_dir():
                found.update(
                    str(f) for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")
                )
            elif p.is_file():
                found.add(str(p))
            else:
                raise FileNotFoundError(f"input {item!r} matches no file")
    if not found:
        raise FileNotFoundError("no input files")
    return sorted(found)


def load_events(spark: SparkSession, files: list[str]) -> tuple[DataFrame, int, int]:
    """(valid events of the supported version, malformed lines, events of other versions)."""
    schema = spark_schema(SCHEMA_FILE).add("_corrupt_record", "string")
    raw = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .json(files)
        .cache()
    )
    malformed = raw.filter(F.col("_corrupt_record").isNotNull()).count()
    ok = raw.filter(F.col("_corrupt_record").isNull()).drop("_corrupt_record")
    supported = F.col("schema_version").isin(*SUPPORTED_SCHEMA_VERSIONS)
    other = ok.filter(~supported).count()
    events = ok.filter(supported)
    return events.withColumn("weight", 1.0 / F.col("sample_rate")), malformed, other


def starvation_by_partition(events: DataFrame) -> DataFrame:
    """Per topic-partition starvation, topics by name.

    Fetch v13+ clients name topics by id; the proxy writes the name in ``topic``
    when it knows it and the id in ``topic_id``.  An event whose ``topic`` is
    still the id (written before the proxy learnt the name, or by a proxy that
    did not record ``topic_id``) is named from any other event that pairs that id
    with a name; an id nobody named stays as it is.
    """
    s = events.select(F.explode("starved_partitions").alias("s")).select("s.*")
    names = (
        s.filter(F.col("topic_id").isNotNull() & (F.col("topic") != F.col("topic_id")))
        .groupBy(F.col("topic_id").alias("named_id"))
        .agg(F.max("topic").alias("name"))
    )
    named = s.join(
        names, F.coalesce(F.col("topic_id"), F.col("topic")) == F.col("named_id"), "left"
    ).select(
        F.coalesce("name", "topic").alias("topic"),
        F.coalesce("topic_id", "named_id").alias("topic_id"),
        "partition",
        "rounds",
    )
    return (
        named.groupBy("topic", "partition")
        .agg(
            F.count("*").alias("starved_events"),
            F.max("rounds").alias("max_rounds"),
            F.percentile("rounds", 0.99).alias("p99_rounds"),
            F.max("topic_id").alias("topic_id"),
        )
        .orderBy(F.desc("max_rounds"), "topic", "partition")
    )


def limit_hits_by_policy(events: DataFrame) -> DataFrame:
    return (
        events.select("policy", "weight", F.explode("limits_applied").alias("limit"))
        .groupBy("policy", "limit")
        .agg(F.count("*").alias("events"), F.sum("weight").alias("estimated_responses"))
        .orderBy("policy", "limit")
    )


def savings(events: DataFrame) -> DataFrame:
    return (
        events.groupBy(F.coalesce("instance", F.lit("(unnamed)")).alias("instance"))
        .agg(
            F.count("*").alias("events"),
            F.sum(F.col("weight") * F.col("sessionless_fetch_bytes")).alias(
                "sessionless_fetch_bytes"
            ),
            F.sum(F.col("weight") * F.col("upstream_fetch_bytes")).alias("upstream_fetch_bytes"),
            F.sum(
                F.col("weight") * (F.col("sessionless_fetch_bytes") - F.col("upstream_fetch_bytes"))
            ).alias("session_saved_bytes"),
            F.sum(F.col("weight") * F.col("reused_record_bytes")).alias("reuse_saved_bytes"),
        )
        .orderBy("instance")
    )


def trimmed(events: DataFrame) -> DataFrame:
    held_bytes = (
        F.col("upstream_record_bytes")
        + F.col("reused_record_bytes")
        - F.col("delivered_record_bytes")
    )
    return (
        events.groupBy("policy")
        .agg(
            F.count("*").alias("events"),
            F.sum(F.col("weight") * held_bytes).alias("trimmed_record_bytes"),
            F.sum(F.col("weight") * F.col("buffered_record_bytes")).alias("buffered_record_bytes"),
            F.sum(F.col("weight") * F.col("dropped_partial_bytes")).alias("dropped_partial_bytes"),
            F.sum(F.col("weight") * F.col("delivered_records")).alias("delivered_records"),
            F.sum(F.col("weight") * F.col("upstream_records")).alias("upstream_records"),
        )
        .orderBy("policy")
    )


def latency_by_client(events: DataFrame) -> DataFrame:
    return (
        events.groupBy(F.coalesce("client_id", F.lit("(null)")).alias("client_id"))
        .agg(
            F.count("*").alias("events"),
            F.percentile("latency_ms", 0.5).alias("p50_ms"),
            F.percentile("latency_ms", 0.9).alias("p90_ms"),
            F.percentile("latency_ms", 0.99).alias("p99_ms"),
            F.max("latency_ms").alias("max_ms"),
        )
        .orderBy("client_id")
    )


def _price(default_price: float) -> Column:
    return F.coalesce(F.col("cross_zone_price_per_gb"), F.lit(float(default_price)))


def _rack_sums(avoided_cost: Column) -> list[Column]:
    """Weighted sums of the rack byte columns, the in-rack share and the cost avoided."""
    sums = [F.sum(F.col("weight") * F.col(c)).alias(c) for c in RACK_COLUMNS]
    known = F.sum(
        F.col("weight") * (F.col("same_rack_record_bytes") + F.col("other_rack_record_bytes"))
    )
    same = F.sum(F.col("weight") * F.col("same_rack_record_bytes"))
    share = F.when(known > 0, same / known)  # null: no byte of known rack
    return [*sums, share.alias("in_rack_share"), F.sum(avoided_cost).alias("cost_avoided")]


def rack_by_client(events: DataFrame, default_price: float = DEFAULT_PRICE_PER_GB) -> DataFrame:
    """Per client id: where its upstream record bytes came from and the cost avoided."""
    e = events.select(
        F.coalesce("client_id", F.lit("(null)")).alias("client_id"),
        "weight",
        F.coalesce("same_rack_record_bytes", F.lit(0)).alias("same_rack_record_bytes"),
        F.coalesce("other_rack_record_bytes", F.lit(0)).alias("other_rack_record_bytes"),
        # version 1 events: every upstream byte is of unknown rack
        F.coalesce("unknown_rack_record_bytes", "upstream_record_bytes").alias(
            "unknown_rack_record_bytes"
        ),
        F.coalesce("cross_zone_avoided_record_bytes", F.lit(0)).alias(
            "cross_zone_avoided_record_bytes"
        ),
        F.coalesce("preferred_replica_redirects", F.lit(0)).alias("preferred_replica_redirects"),
        _price(default_price).alias("price"),
    )
    cost = (
        F.col("weight") * F.col("cross_zone_avoided_record_bytes") / BYTES_PER_GB * F.col("price")
    )
    return (
        e.groupBy("client_id")
        .agg(
            F.count("*").alias("events"),
            *_rack_sums(cost),
            F.sum(F.col("weight") * F.col("preferred_replica_redirects")).alias(
                "preferred_replica_redirects"
            ),
        )
        .orderBy("client_id")
    )


def _rack_topic_rows(events: DataFrame, default_price: float) -> DataFrame:
    """One row per (event, topic) of ``rack_by_topic``, topics named as in the starvation table."""
    rows = events.select(
        F.coalesce("client_id", F.lit("(null)")).alias("client_id"),
        "weight",
        _price(default_price).alias("price"),
        F.explode("rack_by_topic").alias("t"),
    ).select("client_id", "weight", "price", "t.*")
    names = (
        rows.filter(F.col("topic_id").isNotNull() & (F.col("topic") != F.col("topic_id")))
        .groupBy(F.col("topic_id").alias("named_id"))
        .agg(F.max("topic").alias("name"))
    )
    return rows.join(
        names, F.coalesce(F.col("topic_id"), F.col("topic")) == F.col("named_id"), "left"
    ).select(
        "client_id",
        "weight",
        "price",
        F.coalesce("name", "topic", F.lit("(other topics)")).alias("topic"),
        *RACK_COLUMNS,
    )


def rack_by_topic(events: DataFrame, default_price: float = DEFAULT_PRICE_PER_GB) -> DataFrame:
    rows = _rack_topic_rows(events, default_price)
    cost = (
        F.col("weight") * F.col("cross_zone_avoided_record_bytes") / BYTES_PER_GB * F.col("price")
    )
    return rows.groupBy("topic").agg(*_rack_sums(cost)).orderBy("topic")


def rack_by_client_topic(
    events: DataFrame, default_price: float = DEFAULT_PRICE_PER_GB
) -> DataFrame:
    rows = _rack_topic_rows(events, default_price)
    cost = (
        F.col("weight") * F.col("cross_zone_avoided_record_bytes") / BYTES_PER_GB * F.col("price")
    )
    return rows.groupBy("client_id", "topic").agg(*_rack_sums(cost)).orderBy("client_id", "topic")


def partition_labels(rows: list[dict[str, object]]) -> list[str]:
    """Chart labels of starvation rows: ``topic-partition``, the topic by name when known."""
    return [
        f"{r['topic'] if r['topic'] is not None else '(unknown)'}-{r['partition']}" for r in rows
    ]


CHART_OF = {
    "starvation": "starvation_by_partition",
    "limit_hits": "limit_hits_by_policy",
    "latency": "latency_by_client",
    "savings": "savings",
    "racks": "rack_by_client",
}
"""Each chart and the table it draws (drawn only when that table was built)."""


def _charts(out: Path, tables: dict[str, list[dict[str, object]]]) -> list[tuple[str, str]]:
    drawn = {chart for chart, table in CHART_OF.items() if table in tables}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    charts = []

    def bar(name: str, title: str, labels: list[str], series: dict[str, list[float]]) -> None:
        if name not in drawn:
            return
        fig, ax = plt.subplots(figsize=(8, 3.5))
        n = max(len(labels), 1)
        width = 0.8 / max(len(series), 1)
        for i, (label, values) in enumerate(series.items()):
            ax.bar([x + i * width for x in range(len(values))], values, width, label=label)
        ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))])
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        if len(series) > 1:
            ax.legend(fontsize=8)
        ax.set_xlim(-0.5, n)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
        charts.append((f"{name}.png", title))

    starv = tables.get("starvation_by_partition", [])[:20]
    bar(
        "starvation",
        "Starvation: rounds unserved while data waited (top 20 partitions)",
        partition_labels(starv),
        {
            "max": [float(r["max_rounds"] or 0) for r in starv],  # type: ignore[arg-type]
            "p99": [float(r["p99_rounds"] or 0) for r in starv],  # type: ignore[arg-type]
        },
    )
    hits = tables.get("limit_hits_by_policy", [])
    bar(
        "limit_hits",
        "Limit hits by client policy (estimated responses)",
        [f"{r['policy']}/{r['limit']}" for r in hits],
        {"responses": [float(r["estimated_responses"] or 0) for r in hits]},  # type: ignore[arg-type]
    )
    lat = tables.get("latency_by_client", [])[:20]
    bar(
        "latency",
        "Shaped-fetch latency per client (ms)",
        [str(r["client_id"]) for r in lat],
        {
            q: [float(r[f"{q}_ms"] or 0) for r in lat]  # type: ignore[arg-type]
            for q in ("p50", "p90", "p99")
        },
    )
    sav = tables.get("savings", [])
    bar(
        "savings",
        "Upstream bytes saved per proxy instance",
        [str(r["instance"]) for r in sav],
        {
            "incremental sessions": [float(r["session_saved_bytes"] or 0) for r in sav],  # type: ignore[arg-type]
            "reuse buffer": [float(r["reuse_saved_bytes"] or 0) for r in sav],  # type: ignore[arg-type]
        },
    )
    racks = tables.get("rack_by_client", [])[:20]
    bar(
        "racks",
        "Upstream record bytes per client: proxy's rack vs other racks",
        [str(r["client_id"]) for r in racks],
        {
            "same rack": [float(r["same_rack_record_bytes"] or 0) for r in racks],  # type: ignore[arg-type]
            "other rack": [float(r["other_rack_record_bytes"] or 0) for r in racks],  # type: ignore[arg-type]
            "unknown": [float(r["unknown_rack_record_bytes"] or 0) for r in racks],  # type: ignore[arg-type]
        },
    )
    return charts


def _html_table(rows: list[dict[str, object]], limit: int = 50) -> str:
    if not rows:
        return "<p><em>no rows</em></p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}"
        return html.escape(str(v))

    body = "".join(
        "<tr>" + "".join(f"<td>{cell(r[c])}</td>" for c in cols) + "</tr>" for r in rows[:limit]
    )
    more = (
        f"<p>({len(rows) - limit} more rows in the Parquet table)</p>" if len(rows) > limit else ""
    )
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def write_html(
    out: Path,
    tables: dict[str, list[dict[str, object]]],
    charts: list[tuple[str, str]],
    summary: dict[str, object],
) -> Path:
    parts = [
        "<!doctype html><meta charset='utf-8'><title>kafka-fetch-proxy fleet report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style>",
        "<h1>kafka-fetch-proxy fleet report</h1><ul>",
        *(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in summary.items()),
        "</ul>",
    ]
    for png, title in charts:
        parts.append(f"<h3>{html.escape(title)}</h3><img src='{html.escape(png)}' alt=''>")
    for name in (t for t in TABLES if t in tables):
        parts.append(f"<h2>{html.escape(name)}</h2>{_html_table(tables[name])}")
    path = out / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def run(
    inputs: Sequence[str],
    output: str,
    master: str | None = None,
    *,
    cross_zone_price_per_gb: float = DEFAULT_PRICE_PER_GB,
    tables_wanted: Sequence[str] | None = None,
) -> dict[str, object]:
    """Build the tables (*tables_wanted*, default all of :data:`TABLES`), charts and HTML."""
    chosen = list(TABLES) if tables_wanted is None else [t for t in TABLES if t in tables_wanted]
    unknown = set(tables_wanted or ()) - set(TABLES)
    if unknown:
        raise ValueError(f"unknown tables {sorted(unknown)}; known: {', '.join(TABLES)}")
    progress = Progress(stages=4 + len(chosen))
    files = expand_inputs(inputs)
    progress.step(f"found {len(files)} input file(s)")
    spark = session("kafka-fetch-proxy fleet report", master)
    events, malformed, other = load_events(spark, files)
    n = events.count()
    progress.step(f"read {n} events ({malformed} malformed lines, {other} of other versions)")
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    builders = {
        "starvation_by_partition": starvation_by_partition,
        "limit_hits_by_policy": limit_hits_by_policy,
        "savings": savings,
        "trimmed": trimmed,
        "latency_by_client": latency_by_client,
        "rack_by_client": lambda e: rack_by_client(e, cross_zone_price_per_gb),
        "rack_by_topic": lambda e: rack_by_topic(e, cross_zone_price_per_gb),
        "rack_by_client_topic": lambda e: rack_by_client_topic(e, cross_zone_price_per_gb),
    }
    tables: dict[str, list[dict[str, object]]] = {}
    for name in chosen:
        df = builders[name](events)
        df.write.mode("overwrite").parquet(str(out / name))
        tables[name] = [r.asDict() for r in spark.read.parquet(str(out / name)).collect()]
        progress.step(f"wrote {name} ({len(tables[name])} rows)")
    charts = _charts(out, tables)
    progress.step(f"drew {len(charts)} charts")
    summary: dict[str, object] = {
        "input files": len(files),
        "events": n,
        "malformed lines": malformed,
        "events of other schema versions (skipped)": other,
    }
    report = write_html(out, tables, charts, summary)
    progress.step(f"wrote {report}")
    events.unpersist()
    return {"events": n, "malformed": malformed, "other_versions": other, "tables": tables}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="files, directories or globs")
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument(
        "--cross-zone-price-per-gb",
        type=float,
        default=DEFAULT_PRICE_PER_GB,
        help="US dollars per GB crossing zones, for events that carry no price "
        f"(default {DEFAULT_PRICE_PER_GB})",
    )
    parser.add_argument(
        "--tables",
        default=None,
        help=f"comma-separated subset of the tables (default: all: {','.join(TABLES)})",
    )
    args = parser.parse_args(argv)
    wanted = None if args.tables is None else [t for t in args.tables.split(",") if t]
    if wanted is not None and set(wanted) - set(TABLES):
        parser.error(
            f"unknown tables {sorted(set(wanted) - set(TABLES))}; known: {','.join(TABLES)}"
        )
    if args.cross_zone_price_per_gb < 0:
        parser.error(f"--cross-zone-price-per-gb must be >= 0, not {args.cross_zone_price_per_gb}")
    try:
        run(
            args.input,
            args.output,
            args.master,
            cross_zone_price_per_gb=args.cross_zone_price_per_gb,
            tables_wanted=wanted,
        )
    except FileNotFoundError as exc:
        print(f"fleet-report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
