"""Configuration: precedence (flags > env > file > defaults) and validation messages."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy import config
from proxy.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def flags(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = config.load(env={}, flags=flags("--upstream", "k1:9092,k2:9092"))
    assert [str(u) for u in s.upstream] == ["k1:9092", "k2:9092"]
    assert str(s.listen) == "127.0.0.1:9092" and s.advertised_host == "127.0.0.1"
    assert s.broker_port_base == 9093 and s.broker_port(2) == 9095
    assert s.max_frame_bytes == 100 * 1024 * 1024 and s.log_level == "info"
    assert not s.upstream_tls.enabled and s.upstream_tls.check_hostname


def test_limits_that_protect_the_proxy_have_sidecar_defaults() -> None:
    s = config.load(env={}, flags=flags("--upstream", "k:9092"))
    assert s.max_connections == 1000 and s.max_in_flight == 100
    assert s.idle_timeout_seconds == 600  # Kafka's connections.max.idle.ms
    assert s.max_client_buffer_bytes == 1 << 20
    assert s.max_fetch_session_partitions == 10_000
    assert s.raw["memory_budget_bytes"] == 128 << 20  # what the fetch path reads


def test_limits_from_flags_env_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'upstream = ["k:1"]\nidle_timeout_seconds = 0\nmax_connections = 7\n')
    s = config.load(
        config_file=path,
        env={
            "KAFKA_FETCH_PROXY_MAX_CLIENT_BUFFER_BYTES": "65536",
            "KAFKA_FETCH_PROXY_MEMORY_BUDGET_BYTES": "1048576",
        },
        flags=flags("--max-fetch-session-partitions", "50"),
    )
    assert s.idle_timeout_seconds == 0 and s.max_connections == 7
    assert s.max_client_buffer_bytes == 65536 and s.raw["memory_budget_bytes"] == 1 << 20
    assert s.max_fetch_session_partitions == 50
    assert s.sources["max_fetch_session_partitions"] == "flag --max-fetch-session-partitions"


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'upstream = ["file:1"]\nlisten = "0.0.0.0:7000"\nbroker_port_base = 100\n'
        'log_level = "debug"\n[upstream_tls]\nenabled = true\nca_file = "/file/ca.pem"\n',
    )
    env = {
        "KAFKA_FETCH_PROXY_BROKER_PORT_BASE": "200",
        "KAFKA_FETCH_PROXY_LOG_LEVEL": "warning",
        "KAFKA_FETCH_PROXY_UPSTREAM_TLS_CA_FILE": "/env/ca.pem",
    }
    s = config.load(
        config_file=path,
        env=env,
        flags=flags("--broker-port-base", "300", "--no-upstream-tls-enabled"),
    )
    assert [str(u) for u in s.upstream] == ["file:1"]  # file only
    assert str(s.listen) == "0.0.0.0:7000" and s.advertised_host == "localhost"  # wildcard
    assert s.broker_port_base == 300  # flag beats env beats file
    assert s.log_level == "warning"  # env beats file
    assert s.upstream_tls.ca_file == "/env/ca.pem"  # nested env beats nested file
    assert s.upstream_tls.enabled is False  # boolean flag beats file


def test_explicit_broker_port_map_and_ephemeral_base() -> None:
    s = config.load(
        env={"KAFKA_FETCH_PROXY_BROKER_PORTS": "1001=9201, 2002=9202"},
        flags=flags("--upstream", "k:1", "--broker-port-base", "0"),
    )
    assert s.broker_port(1001) == 9201 and s.broker_port(2002) == 9202
    assert s.broker_port(7) == 0


def test_every_schema_key_has_a_flag_and_an_env_var() -> None:
    names = config.option_names()
    schema = config.schema()
    top = set(schema["properties"])
    assert {key.split(".")[0] for key, _, _ in names} == top
    for key, flag, env in names:
        assert flag == "--" + key.replace(".", "-").replace("_", "-")
        assert env == "KAFKA_FETCH_PROXY_" + key.replace(".", "_").upper()


def test_repository_schema_is_the_packaged_schema() -> None:
    assert json.loads((REPO / "schemas" / "config.schema.json").read_text()) == config.schema()


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            'upstream = ["k:1"]\nbroker_port_base = 70000\n',
            ["broker_port_base", "70000", "<= 65535"],
        ),
        (
            'upstream = ["k:1"]\nlog_level = "loud"\n',
            ["log_level", '"loud"', "'debug', 'info', 'warning', 'error'"],
        ),
        ('upstream = ["k:1"]\nlisten = "no-port"\n', ["listen", '"no-port"', "HOST:PORT"]),
        (
            'upstream = ["k:1"]\nmax_in_flight = "many"\n',
            ["max_in_flight", '"many"', "type integer"],
        ),
        (
            'upstream = ["k:1"]\nlisten_port = 3\n',
            ["'listen_port'", "allowed keys:", "broker_port_base"],
        ),
        (
            'upstream = ["k:1"]\n[upstream_tls]\ncafile = "x"\n',
            ["'cafile'", "upstream_tls", "ca_file"],
        ),
        ("upstream = []\n", ["upstream", "[]", "at least 1"]),
        ('upstream = ["k:1"]\n[downstream_tls]\nenabled = true\n', ["downstream_tls", "cert_file"]),
        ("broker_port_base = 1\n", ["'upstream' is required"]),
        (
            'upstream = ["k:1"]\nidle_timeout_seconds = -5\n',
            ["idle_timeout_seconds", "-5", ">= 0", "connections.max.idle.ms"],
        ),
        (
            'upstream = ["k:1"]\nmax_client_buffer_bytes = "1M"\n',
            ["max_client_buffer_bytes", '"1M"', "type integer"],
        ),
        (
            'upstream = ["k:1"]\nmax_fetch_session_partitions = 0\n',
            ["max_fetch_session_partitions", " 0 ", ">= 1", "session id 0"],
        ),
        ('upstream = ["k:1"]\nmax_connections = 0\n', ["max_connections", " 0 ", ">= 1"]),
        (
            'upstream = ["k:1"]\nmemory_budget_bytes = 1000\n',
            ["memory_budget_bytes", "1000", ">= 65536"],
        ),
    ],
)
def test_invalid_file_messages_name_key_value_and_allowed(
    tmp_path: Path, toml: str, expected: list[str]
) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(config_file=write(tmp_path, toml), env={})
    message = str(info.value)
    for part in expected:
        assert part in message, message


def test_env_and_flag_errors_name_their_source() -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(
            env={"KAFKA_FETCH_PROXY_MAX_FRAME_BYTES": "12"},
            flags=flags("--upstream", "k:1", "--connect-timeout-seconds", "-1"),
        )
    text = str(info.value)
    assert "environment KAFKA_FETCH_PROXY_MAX_FRAME_BYTES" in text and ">= 1024" in text
    assert "flag --connect-timeout-seconds" in text and "> 0" in text


def test_unreadable_or_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load(config_file=tmp_path / "missing.toml", env={})
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(config_file=write(tmp_path, "upstream = ["), env={})


# -- typos refused: unknown KAFKA_FETCH_PROXY_* variables -----------------------------------


def test_an_unknown_env_var_is_refused_naming_it_and_the_closest_setting() -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(
            env={
                "KAFKA_FETCH_PROXY_UPSTREAM": "k:1",
                "KAFKA_FETCH_PROXY_LISTN": "0.0.0.0:9092",
                "KAFKA_FETCH_PROXY_UPSTREAM_TLS_CAFILE": "/ca.pem",
                "KAFKA_FETCH_PROXY_ZQXJ": "1",
                "KAFKA_FETCH_PROXYLISTEN": "not our prefix",  # not ours: ignored
            }
        )
    errors = info.value.errors
    assert len(errors) == 3, errors
    listen, cafile, zqxj = errors  # sorted by variable name
    assert listen.startswith("unknown environment variable KAFKA_FETCH_PROXY_LISTN:")
    assert "did you mean KAFKA_FETCH_PROXY_LISTEN (key 'listen')?" in listen
    assert "did you mean KAFKA_FETCH_PROXY_UPSTREAM_TLS_CA_FILE" in cafile
    assert "'upstream_tls.ca_file'" in cafile
    assert "KAFKA_FETCH_PROXY_ZQXJ: no setting has this or a similar name" in zqxj


def test_an_unknown_env_var_is_reported_with_the_other_errors() -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(
            env={"KAFKA_FETCH_PROXY_LOG_LEVLE": "debug", "KAFKA_FETCH_PROXY_LOG_LEVEL": "x"}
        )
    text = str(info.value)
    assert "KAFKA_FETCH_PROXY_LOG_LEVLE" in text and "KAFKA_FETCH_PROXY_LOG_LEVEL" in text
    assert "'upstream' is required" in text and '"x"' in text


def test_an_unknown_file_key_names_the_closest_key(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(config_file=write(tmp_path, 'upstream = ["k:1"]\nlisen = "x"\n'), env={})
    assert "'lisen' (did you mean 'listen'?)" in str(info.value)


TYPO_TESTS = {"tests/unit/test_config.py"}
"""The test that misspells variables on purpose."""
DOCUMENTED_TYPOS = {"KAFKA_FETCH_PROXY_MAX_RECORD"}
"""The README's example of the refusal."""


def test_the_projects_own_variables_are_settings_or_known_tooling() -> None:
    """Every KAFKA_FETCH_PROXY_* name the repository mentions is a setting's variable or one
    of the scripts' and tests' own (which the proxy they start inherits): none of them may
    become a start-up error by accident."""
    import re

    settings = {env for _key, _flag, env in config.option_names()}
    placeholders = {
        "KAFKA_FETCH_PROXY_",
        "KAFKA_FETCH_PROXY_KEY_NAME",
        "KAFKA_FETCH_PROXY_TABLE_KEY",
    }
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    seen: dict[str, str] = {}
    for name in listed:
        path = REPO / name
        if not path.is_file() or path.suffix in {".png", ".jar", ".gz"} or name in TYPO_TESTS:
            continue
        text = path.read_text(errors="replace")
        for var in re.findall(r"KAFKA_FETCH_PROXY_[A-Z0-9_]*", text):
            seen.setdefault(var, name)
    assert config.NOT_SETTINGS <= set(seen)  # the allowance names only what is used
    allowed = settings | config.NOT_SETTINGS | placeholders | DOCUMENTED_TYPOS
    strays = {v: f for v, f in seen.items() if v not in allowed}
    assert not strays, strays
    assert not config.NOT_SETTINGS & settings
    # and the tooling variables are accepted
    s = config.load(
        env={"KAFKA_FETCH_PROXY_UPSTREAM": "k:1", **dict.fromkeys(config.NOT_SETTINGS, "1")}
    )
    assert [str(u) for u in s.upstream] == ["k:1"]


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed ``kafka-fetch-proxy`` command as its own process, in a clean environment."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "kafka-fetch-proxy"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("KAFKA_FETCH_PROXY_")},
            **(env or {}),
        },
        cwd=REPO,
    )


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """:func:`run_cli` in this process: ``proxy.cli.main`` (what the installed command runs)
    with the same argv, environment and directory, its exit code (returned or raised, as
    argparse does) and what it wrote.  For what needs no process of its own (check-config,
    --help): a Python start-up and the proxy's imports each time cost a second of CPU."""

    def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        for key in [k for k in os.environ if k.startswith("KAFKA_FETCH_PROXY_")]:
            monkeypatch.delenv(key)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(REPO)
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["kafka-fetch-proxy", *argv], code, out, err)

    return run


def test_the_installed_command_exits_0_or_2_as_check_config_finds(tmp_path: Path) -> None:
    good = run_cli("check-config", "--config", str(write(tmp_path, 'upstream = ["k:9092"]\n')))
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["ok"] is True
    bad = run_cli(
        "check-config",
        env={"KAFKA_FETCH_PROXY_UPSTREAM": "k:1", "KAFKA_FETCH_PROXY_LOG_LEVEL": "x"},
    )
    assert bad.returncode == 2
    assert "log_level" in bad.stderr and '"x"' in bad.stderr


def test_check_config_and_run_refuse_a_misspelt_env_var(
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    env = {"KAFKA_FETCH_PROXY_UPSTREAM": "k:1", "KAFKA_FETCH_PROXY_MAX_RECORD": "5"}
    # run as a process of its own: were it not refused, it would start serving
    for command, done in (
        ("check-config", cli("check-config", env=env)),
        ("run", run_cli("run", env=env)),
    ):
        assert done.returncode == 2, (command, done.stderr)
        assert done.stdout == ""  # nothing printed as if it had started
        assert "unknown environment variable KAFKA_FETCH_PROXY_MAX_RECORD:" in done.stderr
        assert "did you mean KAFKA_FETCH_PROXY_MAX_RECORDS (key 'max_records')?" in done.stderr
        assert "Traceback" not in done.stderr


def test_run_refuses_an_invalid_file_before_starting(tmp_path: Path) -> None:
    bad = run_cli(
        "run", "--config", str(write(tmp_path, 'upstream = ["k:1"]\nbroker_port_base = -5\n'))
    )
    assert bad.returncode == 2
    assert "broker_port_base" in bad.stderr and "-5" in bad.stderr and ">= 0" in bad.stderr


def test_check_config_prints_every_effective_setting_and_its_source(
    tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """A user confirms their limits, policies, budget and decision log were read as meant."""
    path = write(
        tmp_path,
        """
upstream = ["k:9092"]
max_records = 500
memory_budget_bytes = 67108864
fetch_sessions = false
decision_log = "/var/log/decisions.jsonl"
decision_log_sample_rate = 0.1
instance = "pod-1"

[[policies]]
name = "batch-jobs"
client_id = "spark-*"
max_records = 10000

[[policies]]
name = "broker-2-tight"
listener = "broker-2"
max_partition_bytes = 65536

[upstream_tls]
enabled = true
""",
    )
    done = cli(
        "check-config",
        "--config",
        str(path),
        "--reuse-buffer-bytes",
        "0",
        env={"KAFKA_FETCH_PROXY_MAX_PARTITION_RECORDS": "50"},
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] is True
    settings, sources, effective = out["settings"], out["sources"], out["effective"]
    # every key of the schema, tables key by key, defaults filled in
    schema = config.schema()["properties"]
    assert set(settings) == set(schema)
    assert set(settings["upstream_tls"]) == set(schema["upstream_tls"]["properties"])
    assert settings["upstream"] == ["k:9092"] and settings["listen"] == "127.0.0.1:9092"
    assert settings["max_records"] == 500 and settings["max_response_bytes"] is None
    assert settings["max_partition_records"] == 50
    assert settings["memory_budget_bytes"] == 67108864 and settings["reuse_buffer_bytes"] == 0
    assert settings["fetch_sessions"] is False and settings["max_in_flight"] == 100
    assert settings["decision_log"] == "/var/log/decisions.jsonl"
    assert settings["decision_log_sample_rate"] == 0.1
    assert settings["upstream_tls"] == {
        "enabled": True,
        "ca_file": None,
        "cert_file": None,
        "key_file": None,
        "check_hostname": True,
    }
    # where each came from
    assert sources["max_records"] == f"file {path}"
    assert sources["max_partition_records"] == "environment KAFKA_FETCH_PROXY_MAX_PARTITION_RECORDS"
    assert sources["reuse_buffer_bytes"] == "flag --reuse-buffer-bytes"
    assert sources["max_in_flight"] == "default"
    assert sources["upstream_tls.enabled"] == f"file {path}"
    assert sources["upstream_tls.ca_file"] == "default"
    assert sources["advertised_host"] == "derived (from listen)"
    # what the fetch path and the decision log will do with them
    assert effective["limits"] == {
        "max_response_bytes": None,
        "max_partition_bytes": None,
        "max_records": 500,
        "max_partition_records": 50,
    }
    assert effective["policies"] == [
        {
            "name": "batch-jobs",
            "matches": {"client_id": "spark-*", "listener": "*"},
            "limits": {
                "max_response_bytes": None,
                "max_partition_bytes": None,
                "max_records": 10000,
                "max_partition_records": 50,
            },
            "rack_override": False,
        },
        {
            "name": "broker-2-tight",
            "matches": {"client_id": "*", "listener": "broker-2"},
            "limits": {
                "max_response_bytes": None,
                "max_partition_bytes": 65536,
                "max_records": 500,
                "max_partition_records": 50,
            },
            "rack_override": False,
        },
    ]
    assert effective["fetch_sessions"] is False and effective["reuse_buffer_bytes"] == 0
    assert effective["memory_budget"] == {
        "budget_bytes": 67108864,
        "max_fetch_grant_bytes": 67108864 // 16,
    }
    assert effective["decision_log"] == {
        "target": "/var/log/decisions.jsonl",
        "sample_rate": 0.1,
        "instance": "pod-1",
    }


def test_check_config_with_defaults_has_the_default_budget_and_no_decision_log(
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = cli("check-config", "--upstream", "k:9092")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    effective = out["effective"]
    # a sidecar is protected without configuration: 128 MiB, 8 MiB per fetch
    assert effective["memory_budget"] == {
        "budget_bytes": 128 << 20,
        "max_fetch_grant_bytes": 8 << 20,
    }
    assert out["sources"]["memory_budget_bytes"] == "default"
    assert effective["decision_log"]["target"] == "off"
    assert effective["policies"] == []


def test_run_help_shows_what_each_value_is_and_that_upstream_is_required(
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = cli("run", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps lines
    assert "VALUE" not in text
    for flag, metavar in [
        ("--upstream", "HOST:PORT[,HOST:PORT...]"),
        ("--listen", "HOST:PORT"),
        ("--metrics-listen", "HOST:PORT"),
        ("--advertised-host", "HOST"),
        ("--broker-port-base", "PORT"),
        ("--broker-ports", "NODE=PORT[,...]"),
        ("--max-records", "N"),
        ("--max-response-bytes", "BYTES"),
        ("--memory-budget-bytes", "BYTES"),
        ("--connect-timeout-seconds", "SECONDS"),
        ("--upstream-tls-ca-file", "PATH"),
        ("--decision-log-sample-rate", "RATE"),
        ("--policies", "JSON"),
        ("--log-level", "{debug,info,warning,error}"),
        ("--config", "PATH"),
    ]:
        assert f"{flag} {metavar}" in text, flag
    assert "--upstream HOST:PORT[,HOST:PORT...] required (flag, env or config file):" in text
    # every flag with a value has a placeholder derived from the schema
    for _key, flag, _env in config.option_names():
        assert flag in text
