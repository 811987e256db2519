"""The Dockerfile, Kubernetes manifests, compose example and Grafana dashboard agree with the code.

No container engine runs here, so these tests read the files and check them
against what the package really provides: the console script and its ``run``
subcommand, the config keys/flags/env vars (``proxy.config``), the HTTP paths
(``proxy.observe.http``), the metrics (``proxy.observe.metrics``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube_api import fake_kube_api

from proxy import cli, config
from proxy.observe import healthcheck
from proxy.observe.http import HEALTHZ_PATH, METRICS_PATH, PATHS, READYZ_PATH
from proxy.observe.metrics import CATALOGUE, PREFIX, markdown_table, spec
from proxy.observe.settings import ObserveSettings
from proxy.server import nodezone

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose"
DASHBOARD = DEPLOY / "grafana" / "kafka-fetch-proxy-dashboard.json"
ENV_NAMES = {env for _key, _flag, env in config.option_names()}
HEALTHCHECK_MODULE = "proxy.observe.healthcheck"
DECISION_LOG_DIR = "/var/log/kafka-fetch-proxy"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(config.ENV_PREFIX):
            monkeypatch.delenv(name)


def settings_for(args: list[str], env: dict[str, str], files: dict[str, Path]) -> config.Settings:
    """Parse ``kafka-fetch-proxy run ARGS`` with the real parser and load its settings,
    in the image's environment (its ENV lines) under ``env``.

    ``files`` maps in-container paths to files in the repository.
    """
    args = [str(files.get(a, a)) for a in args]
    namespace = cli.build_parser().parse_args(["run", *args])
    assert namespace.func.__module__ == "proxy.server.cli"
    return config.from_args(namespace, {**image_env(), **env})


def check_config_ok(
    args: list[str], env: dict[str, str], files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kafka-fetch-proxy check-config`` accepts the same arguments and environment."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["check-config", *[str(files.get(a, a)) for a in args]]) == 0


def check_config(
    args: list[str],
    env: dict[str, str],
    files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, Any]:
    """What ``kafka-fetch-proxy check-config ARGS`` prints in the container: the image's
    environment (its ENV lines) under the deployment's own, as the container runtime
    merges them."""
    for name, value in {**image_env(), **env}.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert cli.main(["check-config", *[str(files.get(a, a)) for a in args]]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


# -- Dockerfile ----------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        instruction, _, rest = line.partition(" ")
        out.append((instruction.upper(), rest.strip()))
    assert not pending
    return out


def instructions(name: str) -> list[str]:
    return [rest for instr, rest in dockerfile() if instr == name]


def test_dockerfile_entrypoint_is_the_run_command() -> None:
    (entrypoint,) = instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["kafka-fetch-proxy", "run"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["kafka-fetch-proxy"] == "proxy.__main__:run"
    parser = cli.build_parser()
    namespace = parser.parse_args(["run", "--upstream", "broker:9092"])
    assert callable(namespace.func)
    (cmd,) = instructions("CMD")
    assert json.loads(cmd) == []


def test_dockerfile_healthcheck_uses_a_module_of_the_package() -> None:
    (check,) = instructions("HEALTHCHECK")
    options, _, command = check.partition("CMD ")
    assert "--interval" in options
    argv = json.loads(command)
    assert argv[:3] == ["python", "-m", HEALTHCHECK_MODULE]
    assert importlib.util.find_spec(HEALTHCHECK_MODULE) is not None
    path = argv[argv.index("--path") + 1]
    assert path == HEALTHZ_PATH and path in PATHS
    # the module accepts exactly these arguments (nothing listens on port 1)
    assert healthcheck.main([*argv[3:], "--address", "127.0.0.1:1", "--timeout", "1"]) == 1


def image_env() -> dict[str, str]:
    """The environment the Dockerfile's ENV lines give every container of the image."""
    env: dict[str, str] = {}
    for line in instructions("ENV"):
        for item in shlex.split(line):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def test_dockerfile_is_small_non_root_and_configured_by_env() -> None:
    bases = [line.split()[0] for line in instructions("FROM")]
    assert bases and all(base == "python:3.11-slim" for base in bases)
    (user,) = instructions("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert any(f"--uid {uid}" in run for run in instructions("RUN"))
    # the decision-log directory exists and belongs to that user (volumes mount over it)
    assert any(
        f"install -d -o {uid} -g {uid} {DECISION_LOG_DIR}" in run for run in instructions("RUN")
    )
    proxy_env = {k: v for k, v in image_env().items() if k.startswith(config.ENV_PREFIX)}
    assert set(proxy_env) <= ENV_NAMES, set(proxy_env) - ENV_NAMES
    # environment beats the file: the image sets nothing a mounted file should decide
    assert set(proxy_env) == {healthcheck.ENV}, proxy_env
    settings = config.load(env={**proxy_env, "KAFKA_FETCH_PROXY_UPSTREAM": "broker:9092"})
    assert settings.metrics_listen is not None
    exposed = " ".join(instructions("EXPOSE")).split()
    assert str(settings.listen.port) in exposed
    assert str(settings.metrics_listen.port) in exposed
    assert any(p.startswith(f"{settings.broker_port_base}-") for p in exposed)
    # the healthcheck reads the same variable the proxy does
    assert healthcheck.ENV in proxy_env


def test_dockerfile_copies_files_that_exist() -> None:
    for line in instructions("COPY"):
        if line.startswith("--from"):
            continue
        *sources, _dest = line.split()
        for source in sources:
            assert (ROOT / source).exists(), source


# -- Kubernetes ----------------------------------------------------------------------------


def k8s_objects() -> dict[str, dict[str, Any]]:
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                objects[doc["kind"]] = doc
    return objects


def proxy_container(pod: dict[str, Any]) -> dict[str, Any]:
    candidates = [
        c
        for c in pod.get("initContainers", []) + pod["containers"]
        if c["name"] == "kafka-fetch-proxy"
    ]
    (container,) = candidates
    if container in pod.get("initContainers", []):
        assert container["restartPolicy"] == "Always"  # a native sidecar, not a one-shot init
    return container


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


Rendered = tuple[list[str], dict[str, str], dict[str, Path]]
"""A deployment's proxy container: its arguments, its environment (beside the image's),
and the repository or test files standing in for the container's paths."""


def k8s_render(tmp_path: Path) -> Rendered:
    """The sidecar of the Kubernetes example, its ConfigMap written where --config points."""
    objects = k8s_objects()
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    proxy = proxy_container(pod)

    # the config file comes from the ConfigMap, mounted where --config points
    configmap = objects["ConfigMap"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in proxy["volumeMounts"] if "configMap" in volumes[m["name"]]]
    volume = volumes[mount["name"]]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    config_path = proxy["args"][proxy["args"].index("--config") + 1]
    directory, _, key = config_path.rpartition("/")
    assert directory == mount["mountPath"]
    toml_text = configmap["data"][key]

    # the rack file: written by the node-zone init container, run here for real against a
    # fake API server whose node carries the zone label; the file stands in for its path
    rack_path = tomllib.loads(toml_text)["rack_file"]
    rack_file = run_node_zone(pod, tmp_path, zone=TEST_ZONE)
    assert toml_text.count(f'"{rack_path}"') == 1
    toml_text = toml_text.replace(f'"{rack_path}"', json.dumps(str(rack_file)))
    toml_file = tmp_path / key
    toml_file.write_text(toml_text)

    env = {e["name"]: e["value"] for e in proxy.get("env", []) if "value" in e}
    assert set(env) <= ENV_NAMES, set(env) - ENV_NAMES
    return proxy["args"], env, {config_path: toml_file}


TEST_ZONE = "test-zone-1b"


def run_node_zone(pod: dict[str, Any], tmp_path: Path, zone: str) -> Path:
    """Run the pod's node-zone init container's command (the real CLI) against a fake
    API server; return the file it wrote, which stands in for its --output path."""
    (init,) = [c for c in pod["initContainers"] if c["name"] == "node-zone"]
    command = init["command"]
    assert command[:2] == ["kafka-fetch-proxy", "node-zone"]
    output = command[command.index("--output") + 1]
    node_env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in init["env"]}
    assert node_env == {nodezone.NODE_ENV: "spec.nodeName"}  # the downward API
    token = tmp_path / "token"
    written = tmp_path / "rack"
    with fake_kube_api({"node-1": {nodezone.ZONE_LABEL: zone}}) as api:
        token.write_text(api.token)
        argv = [a if a != output else str(written) for a in command[1:]]
        argv += ["--node", "node-1", "--api-server", api.url, "--token-file", str(token)]
        assert cli.main(argv) == 0
    return written


def compose_render(tmp_path: Path) -> Rendered:
    """The proxy service of the compose example, its bind-mounted files from the repository."""
    proxy = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"][
        "kafka-fetch-proxy"
    ]
    files: dict[str, Path] = {}
    for volume in proxy["volumes"]:
        host, container, *_ = volume.split(":")
        if host.startswith("."):
            files[container] = (COMPOSE / host).resolve()
    env = {k: str(v) for k, v in proxy["environment"].items()}
    assert set(env) <= ENV_NAMES, set(env) - ENV_NAMES
    return proxy["command"], env, files


def image_render(tmp_path: Path) -> Rendered:
    """The image run with nothing but its one required setting (``docker run -e UPSTREAM``)."""
    return [], {"KAFKA_FETCH_PROXY_UPSTREAM": "broker:9092"}, {}


LOOPBACK_KAFKA = {
    "bootstrap": "127.0.0.1:9092",
    "brokers": {"host": "127.0.0.1", "port_base": 9093, "ports": {}},
    "kafka_on_loopback_only": True,
}
REACHABLE = {
    # what the README's threat model says about each deployment
    "image": {**LOOPBACK_KAFKA, "metrics": "127.0.0.1:9464", "metrics_on_loopback_only": True},
    # the kubelet's probes and Prometheus reach the HTTP endpoint on the pod IP
    "kubernetes": {**LOOPBACK_KAFKA, "metrics": "0.0.0.0:9464", "metrics_on_loopback_only": False},
    # every interface of the container, published on the host's loopback only (below)
    "compose": {
        "bootstrap": "0.0.0.0:9092",
        "brokers": {"host": "0.0.0.0", "port_base": 9093, "ports": {}},
        "kafka_on_loopback_only": False,
        "metrics": "0.0.0.0:9464",
        "metrics_on_loopback_only": False,
    },
}
RENDER = {"image": image_render, "kubernetes": k8s_render, "compose": compose_render}


@pytest.mark.parametrize("deployment", sorted(RENDER))
def test_each_shipped_deployment_listens_only_where_the_threat_model_says(
    deployment: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Private by default: the image's environment, the deployment's environment and its
    file, merged as the container sees them, through ``check-config``."""
    args, env, files = RENDER[deployment](tmp_path)
    report = check_config(args, env, files, monkeypatch, capsys)
    assert report["effective"]["listeners"] == REACHABLE[deployment]
    if deployment == "compose":  # published on the host's loopback only, every service
        compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
        for name, service in compose["services"].items():
            for mapping in service.get("ports", []):
                assert str(mapping).startswith("127.0.0.1:"), (name, mapping)


def test_the_sidecar_gets_its_nodes_zone_as_its_rack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """node-zone (an init container of the proxy's image, its own token, RBAC: get nodes)
    writes the node's zone label into an emptyDir; the sidecar reads it as rack_file."""
    objects = k8s_objects()
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["initContainers"]]
    assert names.index("node-zone") < names.index("kafka-fetch-proxy")  # runs first
    (init,) = [c for c in pod["initContainers"] if c["name"] == "node-zone"]
    proxy = proxy_container(pod)
    assert "restartPolicy" not in init  # a one-shot init container, not a sidecar
    assert init["image"] == proxy["image"]
    assert init["securityContext"] == proxy["securityContext"]

    # the file it writes is on a volume both mount, where the proxy's rack_file points
    args, env, files = k8s_render(tmp_path)
    report = check_config(args, env, files, monkeypatch, capsys)
    assert report["effective"]["rack"]["rack"] == TEST_ZONE
    assert report["sources"]["rack"].startswith("rack_file ")
    configmap = objects["ConfigMap"]["data"]["proxy.toml"]
    rack_path = tomllib.loads(configmap)["rack_file"]
    output = init["command"][init["command"].index("--output") + 1]
    assert output == rack_path
    volumes = {v["name"]: v for v in pod["volumes"]}

    def volume_at(container: dict[str, Any], path: str) -> dict[str, Any]:
        (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        return {**mount, **volumes[mount["name"]]}

    written, read = volume_at(init, output), volume_at(proxy, rack_path)
    assert written["name"] == read["name"] and "emptyDir" in written
    assert not written.get("readOnly") and read["readOnly"] is True

    # only node-zone holds a service-account token, and that account may get nodes
    assert pod["automountServiceAccountToken"] is False
    token_dir = nodezone.SERVICE_ACCOUNT
    token = volume_at(init, f"{token_dir}/token")
    assert token["mountPath"] == token_dir and token["readOnly"] is True
    sources = token["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}} in sources
    (ca,) = [s["configMap"] for s in sources if "configMap" in s]
    assert ca["name"] == "kube-root-ca.crt" and ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    for container in pod["containers"] + [proxy]:
        assert not any(m["mountPath"] == token_dir for m in container.get("volumeMounts", []))
    account = objects["ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    role, binding = objects["ClusterRole"], objects["ClusterRoleBinding"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["name"] == account["metadata"]["name"]


def test_sidecar_matches_the_proxy_flags_endpoints_and_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = k8s_objects()
    deployment = objects["Deployment"]
    template = deployment["spec"]["template"]
    pod = template["spec"]
    proxy = proxy_container(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}

    args, env, files = k8s_render(tmp_path)
    settings = settings_for(args, env, files)
    check_config_ok(args, {**image_env(), **env}, files, monkeypatch)

    # ports: the Kafka listener the app uses, and the metrics endpoint the probes use
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert settings.metrics_listen is not None
    assert ports["kafka"] == settings.listen.port
    assert ports["proxy-metrics"] == settings.metrics_listen.port
    assert settings.metrics_listen.host == "0.0.0.0"  # the kubelet probes the pod IP
    for probe_name, path in (
        ("startupProbe", HEALTHZ_PATH),
        ("livenessProbe", HEALTHZ_PATH),
        ("readinessProbe", READYZ_PATH),
    ):
        probe = proxy[probe_name]["httpGet"]
        assert probe["path"] == path and path in PATHS
        port = probe["port"]
        assert (ports[port] if isinstance(port, str) else port) == settings.metrics_listen.port

    # the app bootstraps from the sidecar on localhost, which the proxy advertises
    (app,) = pod["containers"]
    app_env = {e["name"]: e["value"] for e in app["env"]}
    assert app_env["KAFKA_BOOTSTRAP_SERVERS"] == f"localhost:{settings.listen.port}"
    assert settings.advertised_host == "localhost"
    assert settings.listen.host == "127.0.0.1"

    # Prometheus annotations point at the metrics endpoint
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(settings.metrics_listen.port)
    assert annotations["prometheus.io/path"] == METRICS_PATH

    # the decision log goes to a writable emptyDir: the root filesystem is read-only
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    observe = ObserveSettings.from_settings(settings, environ={"HOSTNAME": "pod-1"})
    assert observe.decision_log is not None and observe.decision_log.startswith("/")
    log_dir = observe.decision_log.rpartition("/")[0]
    assert log_dir == DECISION_LOG_DIR
    (log_mount,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == log_dir]
    assert not log_mount.get("readOnly", False)
    assert "emptyDir" in volumes[log_mount["name"]]
    assert 0 < observe.decision_log_sample_rate <= 1
    assert observe.instance == "pod-1"  # the pod name, from HOSTNAME
    assert observe.debug_sessions is False

    # runs as the image's non-root user
    (user,) = instructions("USER")
    assert proxy["securityContext"]["runAsUser"] == int(user.split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_service_monitor_reaches_the_metrics_port() -> None:
    objects = k8s_objects()
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    proxy = proxy_container(objects["Deployment"]["spec"]["template"]["spec"])
    container_ports = {p["name"] for p in proxy["ports"]}
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    monitor = objects["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == METRICS_PATH
    assert service_ports[endpoint["port"]]["targetPort"] in container_ports


# -- docker compose ------------------------------------------------------------------------


def test_compose_example_matches_the_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    services = compose["services"]
    proxy = services["kafka-fetch-proxy"]
    assert (COMPOSE / proxy["build"]["context"] / "Dockerfile").is_file()

    named: dict[str, str] = {}  # container path -> named volume
    for volume in proxy["volumes"]:
        host, container, *_ = volume.split(":")
        if not host.startswith("."):
            assert host in compose["volumes"], host
            named[container] = host
    args, env, files = compose_render(tmp_path)
    assert all(path.is_file() for path in files.values())
    settings = settings_for(args, env, files)
    check_config_ok(args, {**image_env(), **env}, files, monkeypatch)

    # the decision log is written to a volume mounted over the image's directory
    observe = ObserveSettings.from_settings(settings, environ={})
    assert observe.decision_log is not None
    assert observe.decision_log.rpartition("/")[0] == DECISION_LOG_DIR in named

    # upstream is the Kafka service's advertised listener
    kafka_env = services["kafka"]["environment"]
    assert f"PLAINTEXT://{settings.upstream[0]}" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]

    # clients on the host reach every advertised port under the same number
    published = {}
    for mapping in proxy["ports"]:
        host_ip, host_port, container_port = str(mapping).split(":")
        assert host_ip == "127.0.0.1"
        published[int(container_port)] = int(host_port)
    assert settings.metrics_listen is not None
    broker_port = settings.broker_port(int(kafka_env["KAFKA_NODE_ID"]))
    for port in (settings.listen.port, broker_port, settings.metrics_listen.port):
        assert published.get(port) == port, port
    assert settings.advertised_host == "localhost"

    test = proxy["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", HEALTHCHECK_MODULE]
    assert test[test.index("--path") + 1] == HEALTHZ_PATH

    prometheus = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == METRICS_PATH
    assert job["static_configs"][0]["targets"] == [
        f"kafka-fetch-proxy:{settings.metrics_listen.port}"
    ]

    grafana = services["grafana"]
    provider = yaml.safe_load((COMPOSE / "grafana" / "dashboards.yml").read_text())
    dashboards_dir = provider["providers"][0]["options"]["path"]
    mounts = dict(v.split(":")[1::-1] for v in grafana["volumes"])
    assert (COMPOSE / mounts[dashboards_dir] / DASHBOARD.name).is_file()


# -- Grafana dashboard and metrics docs ----------------------------------------------------


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


SERIES = {name: s for s in CATALOGUE for name in s.series_names()}
SCRAPE_LABELS = {"job", "instance"}


def test_dashboard_references_only_metrics_that_exist() -> None:
    used: set[str] = set()
    for expr in dashboard_exprs():
        names = re.findall(rf"{PREFIX}[a-z0-9_]+", expr)
        assert names, expr
        for name in names:
            assert name in SERIES, f"{name} in {expr!r} is not a metric"
            used.add(SERIES[name].name)
        allowed = SCRAPE_LABELS | {"le"} | {label for n in names for label in SERIES[n].labels}
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
            for label in grouping.split(","):
                assert label.strip() in allowed, (label, expr)
        for name, selector in re.findall(rf"({PREFIX}[a-z0-9_]+)\{{([^}}]*)\}}", expr):
            for label in re.findall(r"([a-z_]+)\s*=~?", selector):
                assert label in SCRAPE_LABELS | {"le"} | set(SERIES[name].labels), (label, expr)
    # and it shows every metric of the catalogue
    assert used == {s.name for s in CATALOGUE}


def test_dashboard_structure() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= variables
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"


def test_metrics_table_in_the_docs_is_generated_from_the_catalogue() -> None:
    text = (DEPLOY.parent / "README.md").read_text()
    begin, end = "<!-- metrics-table:begin -->\n", "<!-- metrics-table:end -->"
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert table == markdown_table()
    assert spec(f"{PREFIX}trimmed_records_total").name in table


def test_dashboard_panels_do_not_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, (panel["title"], taken.get((x, y)))
                taken[(x, y)] = panel["title"]


def test_dashboard_shows_in_rack_and_cross_rack_bytes_and_the_cost_avoided() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    row = next(i for i, p in enumerate(panels) if p["type"] == "row" and "Rack" in p["title"])
    end = next((i for i in range(row + 1, len(panels)) if panels[i]["type"] == "row"), len(panels))
    exprs = [t["expr"] for p in panels[row + 1 : end] for t in p["targets"]]
    rack_bytes = f"{PREFIX}broker_to_proxy_fetch_rack_record_bytes_total"
    assert any(rack_bytes in e and "by (locality)" in e for e in exprs)
    assert any('locality="same_rack"' in e for e in exprs)  # the in-rack share
    cost = [p for p in panels[row + 1 : end] if "cost avoided" in p["title"].lower()]
    assert cost and all(p["fieldConfig"]["defaults"]["unit"].startswith("currency") for p in cost)
    assert any(f"{PREFIX}cross_zone_cost_avoided" in t["expr"] for p in cost for t in p["targets"])
    assert any(f"{PREFIX}cross_zone_price_per_gb" in t["expr"] for p in cost for t in p["targets"])
    reasons = [e for e in exprs if f"{PREFIX}preferred_replica_fallbacks_total" in e]
    assert reasons and all("by (reason)" in e for e in reasons)
