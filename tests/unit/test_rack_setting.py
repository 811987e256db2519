"""The proxy knows its rack (issue 18 part 1): ``rack``, ``rack_file``, ``cross_zone_price_per_gb``,
what ``check-config`` shows and the ``rack_brokers`` line."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from proxy import cli, config
from proxy.server.cli import check_report
from proxy.server.proxy import rack_brokers


def flags(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", "--upstream", "k:1", *argv])


def test_rack_is_off_by_default_and_the_price_is_two_cents() -> None:
    s = config.load(env={}, flags=flags())
    assert s.rack == "" and s.cross_zone_price_per_gb == 0.02
    report = check_report(s)
    assert report["settings"]["rack"] == "" and report["settings"]["rack_file"] == ""
    assert report["settings"]["cross_zone_price_per_gb"] == 0.02
    assert report["effective"]["rack"] == {
        "rack": None,
        "source": "default",
        "meaning": "off: no rack id is added to fetches",
        "cross_zone_price_per_gb": 0.02,
    }


def test_rack_and_price_from_flag_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('upstream = ["k:1"]\nrack = "file-zone"\ncross_zone_price_per_gb = 0.01\n')
    s = config.load(config_file=path, env={})
    assert (s.rack, s.cross_zone_price_per_gb) == ("file-zone", 0.01)
    s = config.load(config_file=path, env={"KAFKA_FETCH_PROXY_RACK": "env-zone"})
    assert s.rack == "env-zone" and s.sources["rack"] == "environment KAFKA_FETCH_PROXY_RACK"
    s = config.load(
        config_file=path,
        env={"KAFKA_FETCH_PROXY_RACK": "env-zone"},
        flags=cli.build_parser().parse_args(
            ["run", "--rack", "us-east-1a", "--cross-zone-price-per-gb", "0"]
        ),
    )
    assert (s.rack, s.cross_zone_price_per_gb) == ("us-east-1a", 0.0)
    assert s.raw["rack"] == "us-east-1a"  # what the fetch path's config reads
    effective = check_report(s)["effective"]["rack"]
    assert effective["rack"] == "us-east-1a" and effective["source"] == "flag --rack"
    assert effective["cross_zone_price_per_gb"] == 0.0


def test_rack_from_a_file_is_stripped_and_shown_with_its_source(tmp_path: Path) -> None:
    rack = tmp_path / "rack"
    rack.write_text("eu-west-1b\n")  # as `echo` writes it
    s = config.load(env={"KAFKA_FETCH_PROXY_RACK_FILE": str(rack)}, flags=flags())
    assert s.rack == "eu-west-1b" and s.raw["rack"] == "eu-west-1b"
    report = check_report(s)
    assert report["settings"]["rack"] == "eu-west-1b"
    assert report["sources"]["rack"] == f"rack_file {rack}"
    assert report["settings"]["rack_file"] == str(rack)
    assert report["effective"]["rack"]["source"] == f"rack_file {rack}"
    rack.write_text("")  # a node without a zone label: off
    assert config.load(env={}, flags=flags("--rack-file", str(rack))).rack == ""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--rack", "us east"], ["key 'rack' (from flag --rack)", '"us east"', "no whitespace"]),
        (["--rack", "a\x07b"], ["key 'rack'", "control characters"]),
        (["--rack", "z" * 256], ["key 'rack'", "at most 255 characters"]),
        (["--rack", "a", "--rack-file", "/x"], ["'rack'", "'rack_file'", "both set"]),
        (["--rack-file", "/nonexistent/rack"], ["key 'rack_file'", "cannot read /nonexistent"]),
        (["--cross-zone-price-per-gb", "-0.5"], ["cross_zone_price_per_gb", "-0.5", ">= 0"]),
        (["--cross-zone-price-per-gb", "cheap"], ["cross_zone_price_per_gb", "type number"]),
    ],
)
def test_invalid_racks_and_prices_are_refused(argv: list[str], expected: list[str]) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(env={}, flags=flags(*argv))
    for part in expected:
        assert part in str(info.value), str(info.value)


def test_a_rack_file_with_a_space_inside_is_refused_naming_the_file(tmp_path: Path) -> None:
    rack = tmp_path / "rack"
    rack.write_text("zone a\n")
    with pytest.raises(config.ConfigError) as info:
        config.load(env={}, flags=flags("--rack-file", str(rack)))
    assert f"key 'rack' (from rack_file {rack})" in str(info.value)


def test_rack_brokers_names_the_brokers_in_the_proxys_rack() -> None:
    racks = {3: "b", 1: "a", 2: "b", 4: None}
    level, fields = rack_brokers("b", racks)
    assert level == logging.INFO
    assert fields == {
        "rack": "b",
        "node_ids": [2, 3],
        "broker_racks": {"1": "a", "2": "b", "3": "b", "4": None},
    }
    level, fields = rack_brokers("c", racks)  # set, but no broker announces it
    assert level == logging.WARNING and fields["node_ids"] == []
    assert "no broker announces broker.rack 'c'" in fields["hint"]
    level, fields = rack_brokers("", racks)  # off
    assert level == logging.INFO and fields["rack"] is None and fields["node_ids"] == []
