"""Where the pipeline finds Spark's Kafka connector (pipeline/spark.py), without starting Spark."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from pipeline import read_topic
from pipeline.spark import (
    CONNECTOR,
    JARS_ENV,
    ConnectorMissing,
    installed_kafka_connector,
    kafka_connector_jars,
)

VERSION = pyspark.__version__
DEPS = ("commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory in place of ~/.cache/kafka-fetch-proxy."""
    monkeypatch.setenv("KAFKA_FETCH_PROXY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(JARS_ENV, raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    return tmp_path / "cache"


def _jars(directory: Path, version: str = VERSION) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"{CONNECTOR}-{version}.jar", *DEPS, "notes.txt"]
    for name in names:
        (directory / name).write_bytes(b"PK")
    return sorted(directory / n for n in names if n.endswith(".jar"))


def test_the_cache_scripts_setup_fills(cache: Path) -> None:
    jars = _jars(cache / "jvm" / "spark-kafka" / "lib")
    assert kafka_connector_jars() == jars
    assert installed_kafka_connector() == jars


def test_missing_cache_names_the_setup_command(cache: Path) -> None:
    with pytest.raises(ConnectorMissing) as info:
        kafka_connector_jars()
    message = str(info.value)
    assert "scripts/setup --test" in message
    assert str(cache / "jvm" / "spark-kafka" / "lib") in message
    assert installed_kafka_connector() == []


def test_a_connector_for_another_spark_is_refused(cache: Path) -> None:
    _jars(cache / "jvm" / "spark-kafka" / "lib", version="3.5.1")
    with pytest.raises(ConnectorMissing, match=f"3.5.1 .*PySpark is {VERSION}"):
        kafka_connector_jars()


def test_a_directory_without_the_connector_is_refused(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / DEPS[0]).write_bytes(b"PK")
    with pytest.raises(ConnectorMissing, match=f"no {CONNECTOR} jar in .*--jars"):
        kafka_connector_jars(str(tmp_path / "other"))


def test_explicit_jars_then_the_environment_win_over_the_cache(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _jars(cache / "jvm" / "spark-kafka" / "lib", version="3.5.1")  # stale: must not be used
    chosen = _jars(tmp_path / "chosen")
    listed = ",".join(str(j) for j in chosen)
    assert kafka_connector_jars(listed) == chosen
    monkeypatch.setenv(JARS_ENV, str(tmp_path / "chosen"))
    assert kafka_connector_jars() == chosen
    monkeypatch.setenv(JARS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConnectorMissing, match=f"\\${JARS_ENV}"):
        kafka_connector_jars()


def test_read_topic_refuses_before_starting_spark(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--bootstrap", "127.0.0.1:1", "--topic", "t", "--output", str(cache / "out")]
    with pytest.raises(SystemExit) as info:
        read_topic.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--source kafka" in err and "scripts/setup --test" in err
    assert not (cache / "out").exists()
