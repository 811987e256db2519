"""Settings of ``kafka-fetch-proxy run``: defaults < TOML file < KAFKA_FETCH_PROXY_* env < flags.

The JSON Schema in ``proxy/schemas/config.schema.json`` (also reachable as
``schemas/config.schema.json`` at the repository root, a symlink) is the single
source of truth: it lists every key with its type, default, allowed values and
description, and the command-line flags and environment variables are derived
from it (key ``broker_port_base`` -> ``--broker-port-base`` and
``KAFKA_FETCH_PROXY_BROKER_PORT_BASE``; key ``ca_file`` of table
``upstream_tls`` -> ``--upstream-tls-ca-file`` and
``KAFKA_FETCH_PROXY_UPSTREAM_TLS_CA_FILE``).  Lists are comma-separated and
maps are ``KEY=VALUE,...`` in flags and env.

The merged settings are validated against the schema as a whole; every error
names the key, where the value came from, the value, and what is allowed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from .shaping.limits import LIMIT_NAMES, InvalidLimits, Limits
from .shaping.policy import DEFAULT_POLICY, Policy

ENV_PREFIX = "KAFKA_FETCH_PROXY_"

NOT_SETTINGS = frozenset(
    {
        "KAFKA_FETCH_PROXY_CACHE",  # scripts/setup, tests/support: where downloads are cached
        "KAFKA_FETCH_PROXY_SPARK_JARS",  # pipeline/spark.py: the Spark Kafka connector's jars
        "KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS",  # tests/support/kafka.py, bench/: the brokers' JVM
        "KAFKA_FETCH_PROXY_FAULT_RECORDS",  # tests/support/verifier.py: the fault tests' length
        "KAFKA_FETCH_PROXY_FAULT_RATE",
        "KAFKA_FETCH_PROXY_FAULT_MAX_RECORDS",
    }
)
"""Variables with the proxy's prefix that belong to the project's scripts and tests, not to
a setting: the proxy started by those (which inherits their environment) ignores them.  Any
other ``KAFKA_FETCH_PROXY_*`` variable that names no setting is refused at start."""


class ConfigError(Exception):
    """The configuration is invalid; ``errors`` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> HostPort:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{text!r} is not HOST:PORT with a port in 0-65535")
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    enabled: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class DownstreamTls:
    enabled: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    upstream: tuple[HostPort, ...]
    listen: HostPort = HostPort("127.0.0.1", 9092)
    advertised_host: str = "127.0.0.1"
    broker_port_base: int = 9093
    broker_ports: Mapping[int, int] = field(default_factory=dict)
    metrics_listen: HostPort | None = None
    max_frame_bytes: int = 104857600
    max_in_flight: int = 100
    max_connections: int = 1000
    idle_timeout_seconds: float = 600.0
    """0: never close an idle client connection."""
    first_request_timeout_seconds: float = 10.0
    """A client connection must send a whole request this soon after its accept (0: no limit)."""
    max_client_buffer_bytes: int = 1048576
    client_write_timeout_seconds: float = 30.0
    """A write of responses to a client must complete this soon (0: no limit)."""
    max_request_frame_bytes: int = 8388608
    """Largest client request that is not a Produce (Produce: ``max_frame_bytes``)."""
    request_frame_timeout_seconds: float = 30.0
    """A request frame must be complete this long after its first bytes (0: no limit)."""
    max_buffered_request_bytes: int = 33554432
    """Request bytes all connections may hold beyond their 16 KiB shares."""
    max_queued_request_bytes: int = 8388608
    """Request bytes one connection may hold (unless one frame alone is larger)."""
    max_fetch_session_partitions: int = 10000
    connect_timeout_seconds: float = 10.0
    retry_backoff_initial_seconds: float = 0.1
    retry_backoff_max_seconds: float = 10.0
    shutdown_grace_seconds: float = 10.0
    """On SIGTERM/SIGINT: how long in-flight requests may take before they are cut."""
    log_level: str = "info"
    rack: str = ""
    """The proxy's rack: the zone it runs in, named as the brokers' ``broker.rack`` names
    theirs (``rack``, or the content of ``rack_file``); empty: rack-aware fetching off.
    The fetch path sends it as the rack id of Fetch v11+ (KIP-392) for clients that send
    none; discovery logs which brokers share it.  Compared exactly, as Kafka does."""
    cross_zone_price_per_gb: float = 0.02
    """US dollars per GB (1e9 bytes) crossing zones (``cross_zone_price_per_gb``): the
    price the metrics multiply cross-zone bytes avoided by."""
    upstream_tls: UpstreamTls = UpstreamTls()
    downstream_tls: DownstreamTls = DownstreamTls()
    raw: Mapping[str, Any] = field(default_factory=dict)
    """Every validated key, including those later features read themselves."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Where each key given came from (``file F``, ``environment VAR``, ``flag --f``), by
    key (``upstream_tls.ca_file`` for a table's key); keys not in it have their default."""

    def broker_port(self, node_id: int) -> int:
        """The listener port for a broker (0: pick a free one)."""
        if node_id in self.broker_ports:
            return self.broker_ports[node_id]
        if self.broker_port_base == 0:
            return 0
        return self.broker_port_base + node_id


# --- the fetch path's settings -----------------------------------------------------------

DEFAULT_REUSE_BUFFER_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_UPSTREAM_WAIT_MS = 500
"""The Java consumer's fetch.max.wait.ms: the longest the proxy's own fetches long-poll."""
DEFAULT_MAX_CACHED_SESSION_PARTITIONS = 100_000
DEFAULT_MAX_FETCH_PARTITIONS = 20_000
DEFAULT_MAX_PARTITIONS_IN_FLIGHT = 20_000
"""About 28 MiB of per-partition fetch state at about 1.4 KiB a partition."""


class InvalidFetchConfig(ValueError):
    """A fetch-path setting is invalid; the message names the key, the value and what is allowed."""


@dataclass(frozen=True, slots=True)
class FetchPathConfig:
    """What ``proxy.fetchpath.FetchPath`` reads: limits, policies, sessions, the budget."""

    limits: Limits = field(default_factory=Limits)
    policies: tuple[Policy, ...] = ()
    fetch_sessions: bool = True
    memory_budget_bytes: int | None = None
    reuse_buffer_bytes: int = DEFAULT_REUSE_BUFFER_BYTES
    max_upstream_wait_ms: int = DEFAULT_MAX_UPSTREAM_WAIT_MS
    """``max_upstream_wait_ms``: the most max_wait of a fetch the proxy sends upstream."""
    run_ahead: bool = True
    """``run_ahead``: after a response that delivered data, fetch the next records upstream
    before the client asks, into the reuse buffer (``FetchPathHandler``'s run-ahead)."""
    rack: str = ""
    """The proxy's rack (``rack``): sent upstream in Fetch v11+ for clients that send none."""
    cross_zone_price_per_gb: float = 0.02
    """``cross_zone_price_per_gb``: what the metrics and the decision log value a GB of
    cross-zone bytes avoided at."""
    max_cached_session_partitions: int = DEFAULT_MAX_CACHED_SESSION_PARTITIONS
    """Partitions all client fetch sessions together may hold (a restart applies a change)."""
    max_fetch_partitions: int = DEFAULT_MAX_FETCH_PARTITIONS
    """Partitions one client Fetch may name; more closes the connection (at the next fetch
    after a reload)."""
    max_partitions_in_flight: int = DEFAULT_MAX_PARTITIONS_IN_FLIGHT
    """Partitions the large fetches being processed may name together (a fetch that does not
    fit waits; one larger than this is let in alone)."""

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> FetchPathConfig:
        """From the validated settings' ``raw`` mapping (schema-checked already)."""
        try:
            limits = Limits(**{k: raw[k] for k in LIMIT_NAMES if k in raw})
        except InvalidLimits as exc:
            raise InvalidFetchConfig(f"key {exc}") from exc
        budget = raw.get("memory_budget_bytes")
        return cls(
            limits=limits,
            policies=_policies(raw.get("policies") or ()),
            fetch_sessions=bool(raw.get("fetch_sessions", True)),
            memory_budget_bytes=None if budget is None else int(budget),
            reuse_buffer_bytes=int(raw.get("reuse_buffer_bytes", DEFAULT_REUSE_BUFFER_BYTES)),
            max_upstream_wait_ms=int(raw.get("max_upstream_wait_ms", DEFAULT_MAX_UPSTREAM_WAIT_MS)),
            run_ahead=bool(raw.get("run_ahead", True)),
            rack=str(raw.get("rack") or ""),
            cross_zone_price_per_gb=float(raw.get("cross_zone_price_per_gb", 0.02)),
            max_cached_session_partitions=int(
                raw.get("max_cached_session_partitions", DEFAULT_MAX_CACHED_SESSION_PARTITIONS)
            ),
            max_fetch_partitions=int(raw.get("max_fetch_partitions", DEFAULT_MAX_FETCH_PARTITIONS)),
            max_partitions_in_flight=int(
                raw.get("max_partitions_in_flight", DEFAULT_MAX_PARTITIONS_IN_FLIGHT)
            ),
        )


def _policies(entries: Sequence[Any]) -> tuple[Policy, ...]:
    policies: list[Policy] = []
    seen: set[str] = set()
    for n, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise InvalidFetchConfig(
                f"key 'policies[{n}]': value {entry!r} is not allowed;"
                " expected a table with a string 'name'"
            )
        name = entry["name"]
        if name in seen or name == DEFAULT_POLICY:
            raise InvalidFetchConfig(
                f"key 'policies[{n}].name': value {name!r} is not allowed;"
                f" expected a name unique among the policies and not {DEFAULT_POLICY!r}"
            )
        seen.add(name)
        body = {k: v for k, v in entry.items() if k != "name"}
        try:
            policies.append(Policy.from_mapping(name, body))
        except InvalidLimits as exc:
            raise InvalidFetchConfig(f"key 'policies[{n}]': {exc}") from exc
    return tuple(policies)


# --- the schema ---------------------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    text = resources.files("proxy").joinpath("schemas/config.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@dataclass(frozen=True, slots=True)
class _Option:
    path: tuple[str, ...]
    spec: dict[str, Any]

    @property
    def flag(self) -> str:
        return "--" + "-".join(self.path).replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + "_".join(self.path).upper()

    @property
    def dest(self) -> str:
        return "cfg__" + "__".join(self.path)

    @property
    def key(self) -> str:
        return ".".join(self.path)


def _options() -> list[_Option]:
    out = []
    for name, spec in schema()["properties"].items():
        if spec.get("type") == "object" and "properties" in spec:
            out += [_Option((name, sub), s) for sub, s in spec["properties"].items()]
        else:
            out.append(_Option((name,), spec))
    return out


def _convert(option: _Option, text: str) -> Any:
    """A flag or env string to the JSON type the schema expects (validation comes later)."""
    kind = option.spec.get("type")
    if kind == "array" and option.spec.get("items", {}).get("type") == "object":
        try:  # a list of tables (e.g. policies): JSON on the command line / in the env
            return json.loads(text)
        except ValueError:
            return text  # the schema check names it
    if kind == "array":
        return [item.strip() for item in text.split(",") if item.strip()]
    if kind == "object":
        pairs = [item.strip() for item in text.split(",") if item.strip()]
        out: dict[str, Any] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            out[key.strip()] = _number(value.strip())
        return out
    if kind == "integer" or kind == "number":
        return _number(text.strip())
    if kind == "boolean":
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        return text
    return text


def _number(text: str) -> Any:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text  # left as a string: the schema check names it


# --- command line -------------------------------------------------------------------------


def metavar(option: _Option) -> str:
    """The placeholder ``--help`` shows for a flag's value, from the schema's type and key."""
    spec = option.spec
    name = option.path[-1]
    kind = spec.get("type")
    host_port = schema()["properties"]["listen"]["pattern"]
    if kind == "array" and spec.get("items", {}).get("type") == "object":
        return "JSON"
    if kind == "array":
        item = spec.get("items", {})
        one = "HOST:PORT" if item.get("pattern") == host_port else "VALUE"
        return f"{one}[,{one}...]"
    if kind == "object":
        return "NODE=PORT[,...]" if name == "broker_ports" else "KEY=VALUE[,...]"
    if spec.get("pattern") == host_port:
        return "HOST:PORT"
    if "enum" in spec:
        return "{" + ",".join(str(v) for v in spec["enum"]) + "}"
    if name.endswith("_bytes"):
        return "BYTES"
    if name.endswith("_seconds"):
        return "SECONDS"
    if name.endswith("_file"):
        return "PATH"
    if name == "decision_log":
        return "PATH|-"
    if name.endswith("_rate"):
        return "RATE"
    if name.endswith("_port") or name.endswith("_port_base"):
        return "PORT"
    if name.endswith("_host"):
        return "HOST"
    if kind == "integer":
        return "N"
    if kind == "number":
        return "NUMBER"
    return "NAME" if name == "instance" else "TEXT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per schema key."""
    parser.add_argument("--config", metavar="PATH", help="TOML configuration file")
    for option in _options():
        help_text = option.spec.get("description", "")
        if option.key == "upstream":
            help_text = "required (flag, env or config file): " + help_text
        if "default" in option.spec and option.spec["default"] not in ({}, [], ""):
            help_text += f" (default: {option.spec['default']})"
        help_text += f" [env {option.env}]"
        if option.spec.get("type") == "boolean":
            parser.add_argument(
                option.flag,
                dest=option.dest,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag, dest=option.dest, metavar=metavar(option), help=help_text
            )


# --- loading ------------------------------------------------------------------------------


def _put(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        nested = target.setdefault(part, {})
        if not isinstance(nested, dict):
            return  # a wrong type in the file: the schema reports it
        target = nested
    target[path[-1]] = value


def load(
    *,
    config_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: argparse.Namespace | None = None,
) -> Settings:
    """Merge defaults < file < env < flags, validate, and build Settings (or raise ConfigError)."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    if config_file is not None:
        try:
            with open(config_file, "rb") as fh:
                file_values = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError([f"cannot read config file {config_file}: {exc.strerror}"]) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"config file {config_file} is not valid TOML: {exc}"]) from exc
        for key, value in file_values.items():
            if isinstance(value, dict):
                merged[key] = dict(value)
                for sub in value:
                    source[f"{key}.{sub}"] = f"file {config_file}"
            else:
                merged[key] = value
            source[key] = f"file {config_file}"
    options = _options()
    for option in options:
        if env is not None and option.env in env:
            _put(merged, option.path, _convert(option, env[option.env]))
            source[option.key] = f"environment {option.env}"
    for option in options:
        value = getattr(flags, option.dest, None) if flags is not None else None
        if value is not None:
            if not isinstance(value, bool):
                value = _convert(option, value)
            _put(merged, option.path, value)
            source[option.key] = f"flag {option.flag}"
    unknown = unknown_env_errors(env or {}, options)
    try:
        settings = validate(merged, source)
    except ConfigError as exc:
        raise ConfigError(unknown + exc.errors) from None
    if unknown:
        raise ConfigError(unknown)
    return settings


def unknown_env_errors(
    env: Mapping[str, str], options: Sequence[_Option] | None = None
) -> list[str]:
    """One message per ``KAFKA_FETCH_PROXY_*`` variable in *env* that names no setting.

    A typo must not start the proxy as if the variable were absent (an unknown key in
    the file is refused too); each message names the variable and the closest setting's
    variable.  The project's own tooling variables (``NOT_SETTINGS``) are not settings.
    """
    by_env = {o.env: o for o in (options if options is not None else _options())}
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in by_env or name in NOT_SETTINGS:
            continue
        # compared without the prefix, which every name shares
        suffixes = {o.removeprefix(ENV_PREFIX): o for o in by_env}
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1)
        hint = (
            f"no setting has this name; did you mean {suffixes[close[0]]}"
            f" (key '{by_env[suffixes[close[0]]].key}')?"
            if close
            else "no setting has this or a similar name"
        )
        out.append(
            f"unknown environment variable {name}: {hint}"
            f" (each key's variable is {ENV_PREFIX} + the key in upper case;"
            " `kafka-fetch-proxy run --help` lists them)"
        )
    return out


def validate(values: Mapping[str, Any], source: Mapping[str, str] | None = None) -> Settings:
    source = source or {}
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(dict(values)), key=lambda e: list(e.absolute_path))
    messages = [_explain(e, source) for e in errors]
    if "upstream" not in values:
        messages.insert(
            0,
            "key 'upstream' is required: the real Kafka cluster's bootstrap HOST:PORT list"
            f" (flag --upstream, env {ENV_PREFIX}UPSTREAM, or upstream = [...] in the file)",
        )
    if not messages:
        rack, rack_source, rack_errors = _rack(values, source)
        messages = _semantic_errors(values, source) + rack_errors
    if messages:
        raise ConfigError(messages)
    if values.get("rack_file"):  # the rack read from the file is the rack
        values = {**values, "rack": rack}
        source = {**source, "rack": rack_source}
    return _build(values, source)


def _explain(error: jsonschema.ValidationError, source: Mapping[str, str]) -> str:
    path = [str(p) for p in error.absolute_path]
    key = ".".join(path) or "(top level)"
    origin = source.get(key) or (source.get(path[0]) if path else None)
    where = f" (from {origin})" if origin else ""
    spec = error.schema if isinstance(error.schema, dict) else {}
    v = error.validator
    allowed: str
    if v == "additionalProperties":
        known = sorted(spec.get("properties", {}))
        extra = sorted(set(error.instance) - set(known)) if isinstance(error.instance, dict) else []
        scope = f"table '{key}'" if path else "the top level"
        return (
            f"unknown key(s) {', '.join(_with_closest(x, known) for x in extra)} in {scope}{where};"
            f" allowed keys: {', '.join(known)}"
        )
    if v == "required":
        return f"key '{key}': {error.message}{where}"
    if v == "type":
        allowed = f"a value of type {spec.get('type')}"
    elif v == "enum":
        allowed = "one of " + ", ".join(repr(x) for x in spec.get("enum", []))
    elif v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        words = {
            "minimum": ">=",
            "exclusiveMinimum": ">",
            "maximum": "<=",
            "exclusiveMaximum": "<",
        }
        allowed = f"a number {words[v]} {error.validator_value}"
    elif v == "pattern":
        allowed = spec.get("description") or f"a string matching {spec.get('pattern')}"
    elif v == "minItems":
        allowed = f"at least {error.validator_value} item(s)"
    elif v == "minLength":
        allowed = "a non-empty string"
    elif v == "maxLength":
        allowed = f"a string of at most {error.validator_value} characters"
    else:
        allowed = error.message
    desc = ""
    if path and v != "pattern":
        top = schema()["properties"].get(path[0], {})
        desc_spec = top.get("properties", {}).get(path[1], {}) if len(path) > 1 else top
        if isinstance(desc_spec, dict) and desc_spec.get("description"):
            desc = f" ({desc_spec['description']})"
    return f"key '{key}'{where}: value {json.dumps(error.instance)} is not allowed; expected {allowed}{desc}"


def _with_closest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)


RACK_MAX_CHARS = 255
"""A rack (Kafka's ``broker.rack`` / ``client.rack``) longer than this is refused: Kafka
itself bounds it only by the protocol's string length; zone names are short."""


def rack_problem(rack: str) -> str | None:
    """What is wrong with *rack* as a rack name, or None.

    Kafka checks nothing beyond "a string" for ``client.rack`` and ``broker.rack`` and
    compares racks exactly, so a stray space or newline (a file written with ``echo``)
    would silently match no broker: whitespace and control characters are refused, as
    is a name longer than ``RACK_MAX_CHARS``.  Empty means no rack.
    """
    if len(rack) > RACK_MAX_CHARS:
        return f"at most {RACK_MAX_CHARS} characters"
    if any(c.isspace() or not c.isprintable() for c in rack):
        return "no whitespace or control characters"
    return None


def _rack(values: Mapping[str, Any], source: Mapping[str, str]) -> tuple[str, str, list[str]]:
    """(the rack, where it came from, errors): ``rack``, or the content of ``rack_file``."""
    rack, path = values.get("rack", ""), values.get("rack_file", "")
    origin = source.get("rack", "default")
    expect = "expected a rack name as the brokers' broker.rack (e.g. us-east-1a) with"
    if rack and path:
        return (
            "",
            origin,
            [
                f"keys 'rack' (from {origin}) and 'rack_file' (from"
                f" {source.get('rack_file', 'default')}) are both set; set one of them"
            ],
        )
    if path:
        origin = f"rack_file {path}"
        try:
            with open(path, encoding="utf-8") as fh:
                rack = fh.read(RACK_MAX_CHARS + 64).strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            return (
                "",
                origin,
                [
                    f"key 'rack_file' (from {source.get('rack_file', 'default')}):"
                    f" cannot read {path}: {reason}"
                ],
            )
    problem = rack_problem(rack)
    if problem is not None:
        return (
            "",
            origin,
            [
                f"key 'rack' (from {origin}): value {json.dumps(rack)} is not allowed; {expect} {problem}"
            ],
        )
    return rack, origin, []


def _semantic_errors(values: Mapping[str, Any], source: Mapping[str, str]) -> list[str]:
    out = []
    for key in ("listen", "metrics_listen"):
        if key in values:
            try:
                HostPort.parse(values[key])
            except ValueError as exc:
                out.append(f"key '{key}' (from {source.get(key, 'default')}): {exc}")
    for item in values.get("upstream", []):
        try:
            if HostPort.parse(item).port == 0:
                raise ValueError(f"{item!r}: port 0 is not a broker port")
        except ValueError as exc:
            out.append(f"key 'upstream' (from {source.get('upstream', 'default')}): {exc}")
    base = values.get("broker_port_base", schema()["properties"]["broker_port_base"]["default"])
    return out + ([] if base == 0 or base <= 65535 else [f"key 'broker_port_base': {base} > 65535"])


def _with_budget(values: Mapping[str, Any]) -> dict[str, Any]:
    """*values* with the memory budget's default filled in.

    The fetch path reads the budget from ``raw`` (absent: no budget), so the
    default that protects a sidecar must be there even when nobody set it.
    """
    raw = dict(values)
    raw.setdefault("memory_budget_bytes", _default("memory_budget_bytes"))
    return raw


def _default(key: str) -> Any:
    return schema()["properties"][key].get("default")


def _build(values: Mapping[str, Any], source: Mapping[str, str]) -> Settings:
    def get(key: str) -> Any:
        return values.get(key, _default(key))

    listen = HostPort.parse(get("listen"))
    advertised = values.get("advertised_host")
    if advertised is None:
        advertised = "localhost" if listen.host in ("0.0.0.0", "::", "") else listen.host
    up_tls = dict(values.get("upstream_tls", {}))
    down_tls = dict(values.get("downstream_tls", {}))
    metrics = values.get("metrics_listen")
    return Settings(
        upstream=tuple(HostPort.parse(u) for u in values["upstream"]),
        listen=listen,
        advertised_host=advertised,
        broker_port_base=int(get("broker_port_base")),
        broker_ports={int(k): int(v) for k, v in (get("broker_ports") or {}).items()},
        metrics_listen=HostPort.parse(metrics) if metrics else None,
        max_frame_bytes=int(get("max_frame_bytes")),
        max_in_flight=int(get("max_in_flight")),
        max_connections=int(get("max_connections")),
        idle_timeout_seconds=float(get("idle_timeout_seconds")),
        first_request_timeout_seconds=float(get("first_request_timeout_seconds")),
        max_client_buffer_bytes=int(get("max_client_buffer_bytes")),
        client_write_timeout_seconds=float(get("client_write_timeout_seconds")),
        max_request_frame_bytes=int(get("max_request_frame_bytes")),
        request_frame_timeout_seconds=float(get("request_frame_timeout_seconds")),
        max_buffered_request_bytes=int(get("max_buffered_request_bytes")),
        max_queued_request_bytes=int(get("max_queued_request_bytes")),
        max_fetch_session_partitions=int(get("max_fetch_session_partitions")),
        connect_timeout_seconds=float(get("connect_timeout_seconds")),
        retry_backoff_initial_seconds=float(get("retry_backoff_initial_seconds")),
        retry_backoff_max_seconds=float(get("retry_backoff_max_seconds")),
        shutdown_grace_seconds=float(get("shutdown_grace_seconds")),
        log_level=str(get("log_level")),
        rack=str(get("rack") or ""),
        cross_zone_price_per_gb=float(get("cross_zone_price_per_gb")),
        upstream_tls=UpstreamTls(**up_tls),
        downstream_tls=DownstreamTls(**down_tls),
        raw=_with_budget(values),
        sources=dict(source),
    )


def from_args(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    return load(config_file=getattr(args, "config", None), env=env, flags=args)


def effective(settings: Settings) -> tuple[dict[str, Any], dict[str, str]]:
    """(every setting as the proxy uses it, where each came from), for ``check-config``.

    Every key of the schema appears, with its default when not given (tables key by
    key); ``advertised_host`` is the derived value when unset.  Sources are
    ``file F``, ``environment VAR``, ``flag --f``, ``default`` or ``derived``.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    given = settings.sources
    for key, spec in schema()["properties"].items():
        if spec.get("type") == "object" and "properties" in spec:
            table = settings.raw.get(key) or {}
            values[key] = {}
            for sub, sub_spec in spec["properties"].items():
                values[key][sub] = table.get(sub, sub_spec.get("default"))
                sources[f"{key}.{sub}"] = given.get(f"{key}.{sub}", "default")
            continue
        values[key] = settings.raw.get(key, spec.get("default"))
        sources[key] = given.get(key, "default")
    values["listen"] = str(settings.listen)
    values["upstream"] = [str(u) for u in settings.upstream]
    values["advertised_host"] = settings.advertised_host
    if "advertised_host" not in settings.raw:
        sources["advertised_host"] = "derived (from listen)"
    return values, sources


def option_names() -> Sequence[tuple[str, str, str]]:
    """(key, flag, env var) for every setting: for docs and tests."""
    return [(o.key, o.flag, o.env) for o in _options()]
