"""``kafka-fetch-proxy node-zone``: the node's zone label into a file, for ``rack_file``
(against a fake API server on loopback; the Kubernetes manifests' test runs it too)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from support.kube_api import fake_kube_api

from proxy import cli, config

ZONE = "topology.kubernetes.io/zone"


def flags(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", "--upstream", "k:1", *argv])


def node_zone(api_url: str, token_file: Path, output: Path, *extra: str) -> int:
    return cli.main(
        [
            "node-zone",
            "--api-server",
            api_url,
            "--token-file",
            str(token_file),
            "--output",
            str(output),
            *extra,
        ]
    )


def test_node_zone_writes_the_nodes_zone_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    out = tmp_path / "rack"
    monkeypatch.setenv("NODE_NAME", "node-a")
    with fake_kube_api({"node-a": {ZONE: "us-east-1c"}, "node-b": {}}) as api:
        assert node_zone(api.url, token, out) == 0
        assert out.read_text() == "us-east-1c"
        assert capsys.readouterr().out == "zone=us-east-1c\n"
        # a node without the label: an empty rack (off), or a failure with --require
        assert node_zone(api.url, token, out, "--node", "node-b") == 0
        assert out.read_text() == ""
        assert "has no label topology.kubernetes.io/zone" in capsys.readouterr().err
        assert node_zone(api.url, token, out, "--node", "node-b", "--require") == 1
        assert api.asked == ["/api/v1/nodes/node-a", *["/api/v1/nodes/node-b"] * 2]
    # what node-zone wrote is what the proxy reads
    assert config.load(env={}, flags=flags("--rack-file", str(out))).rack == ""


def test_node_zone_failures_name_the_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("wrong")
    out = tmp_path / "rack"
    monkeypatch.delenv("NODE_NAME", raising=False)
    with fake_kube_api({"node-a": {ZONE: "zone a"}}) as api:
        assert node_zone(api.url, token, out, "--node", "node-a") == 1
        err = capsys.readouterr().err
        assert "GET node node-a: HTTP 403" in err and "service account needs get on nodes" in err
        token.write_text(api.token)
        assert node_zone(api.url, token, out, "--node", "node-a") == 1  # not a rack name
        assert "not a rack name (no whitespace" in capsys.readouterr().err
        assert node_zone(api.url, token, out, "--node", "node-x") == 1
        assert "HTTP 404" in capsys.readouterr().err
        assert node_zone(api.url, token, out) == 2  # no node name
        assert "--node or $NODE_NAME" in capsys.readouterr().err
    assert not out.exists()
