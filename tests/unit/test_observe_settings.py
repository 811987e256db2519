"""The observability config keys: defaults, sources, the decision log they open, the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import structlog

from proxy import cli, config
from proxy.observe.metrics import Metrics
from proxy.observe.settings import ObserveSettings


def load(**values: object) -> config.Settings:
    return config.validate({"upstream": ["broker:9092"], **values})


def test_defaults_are_off() -> None:
    observe = ObserveSettings.from_settings(load(), environ={})
    assert observe == ObserveSettings(
        debug_sessions=False, decision_log=None, decision_log_sample_rate=1.0, instance=None
    )
    assert observe.open_decision_log(None) is None


def test_instance_defaults_to_hostname_and_the_key_wins() -> None:
    assert ObserveSettings.from_settings(load(), {"HOSTNAME": "pod-7"}).instance == "pod-7"
    named = ObserveSettings.from_settings(load(instance="proxy-a"), {"HOSTNAME": "pod-7"})
    assert named.instance == "proxy-a"


def test_keys_come_from_flags_and_env(tmp_path: Path) -> None:
    target = tmp_path / "decisions.jsonl"
    args = cli.build_parser().parse_args(
        ["run", "--upstream", "b:9092", "--debug-sessions", "--decision-log", str(target)]
    )
    env = {
        "KAFKA_FETCH_PROXY_DECISION_LOG_SAMPLE_RATE": "0.25",
        "KAFKA_FETCH_PROXY_INSTANCE": "sidecar-1",
    }
    observe = ObserveSettings.from_settings(config.from_args(args, env), environ={})
    assert observe == ObserveSettings(True, str(target), 0.25, "sidecar-1")
    metrics = Metrics(process_metrics=False)
    log = observe.open_decision_log(metrics)
    assert log is not None
    try:
        assert log.instance == "sidecar-1" and log.sampler.rate == 0.25
        assert log.metrics is metrics
    finally:
        log.close()
    assert target.exists()


@pytest.mark.parametrize(
    ("key", "bad"),
    [("decision_log_sample_rate", 1.5), ("decision_log_sample_rate", -0.1), ("instance", "")],
)
def test_invalid_values_name_the_key(key: str, bad: object) -> None:
    with pytest.raises(config.ConfigError) as info:
        load(**{key: bad})
    assert f"key '{key}'" in str(info.value)


def test_stdout_decision_log() -> None:
    observe = ObserveSettings.from_settings(load(decision_log="-"), environ={})
    log = observe.open_decision_log(None)
    assert log is not None and log.sink is sys.stdout


def test_run_refuses_a_decision_log_it_cannot_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing-dir" / "decisions.jsonl"
    saved = structlog.get_config()  # `run` configures logging to this test's stderr
    try:
        code = cli.main(["run", "--upstream", "127.0.0.1:1", "--decision-log", str(target)])
    finally:
        structlog.configure(**saved)
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot open the decision log (setting decision_log)" in err and str(target) in err


def test_check_config_accepts_and_validates_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--upstream", "b:9092", "--decision-log", "-", "--decision-log-sample-rate", "0.5"]
    assert cli.main(["check-config", *args]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is True
    assert cli.main(["check-config", "--upstream", "b:9092", "--decision-log-sample-rate", "2"])
    assert "decision_log_sample_rate" in capsys.readouterr().err


def test_client_id_label_is_opt_in_and_capped() -> None:
    assert ObserveSettings.from_settings(load(), environ={}).client_id_label_cap == 0
    args = cli.build_parser().parse_args(
        ["run", "--upstream", "b:9092", "--metrics-client-id-label-cap", "2"]
    )
    observe = ObserveSettings.from_settings(config.from_args(args, {}), environ={})
    assert observe.client_id_label_cap == 2
    metrics = Metrics(client_id_label_cap=observe.client_id_label_cap, process_metrics=False)
    for client in ("a", "b", "c", "d"):
        metrics.delivered_fetch_data(1, 10, client_id=client)
    name = "kafka_fetch_proxy_proxy_to_client_fetch_record_bytes_by_client_total"
    value = metrics.registry.get_sample_value
    assert value(name, {"client_id": "a"}) == 10 and value(name, {"client_id": "b"}) == 10
    assert value(name, {"client_id": "other"}) == 20
    with pytest.raises(config.ConfigError):
        load(metrics_client_id_label_cap=-1)
