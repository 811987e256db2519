"""The README's examples are true: its config file validates, its flags exist."""

from __future__ import annotations

import re
from pathlib import Path

from proxy import config
from proxy.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_example_validates(tmp_path: Path) -> None:
    block = re.search(r"```toml\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    path = tmp_path / "proxy.toml"
    path.write_text(block.group(1))
    settings = config.load(config_file=path, env={})
    assert settings.raw["max_records"] == 2000
    assert settings.raw["policies"][0]["client_id"] == "spark-*"


def test_readme_run_flags_exist() -> None:
    text = README.read_text()
    used = set(re.findall(r"kafka-fetch-proxy run[^\n]*(?:\n\s+--[^\n]*)*", text))
    flags = {f for block in used for f in re.findall(r"(--[a-z][a-z-]+)", block)}
    assert {"--max-records", "--memory-budget-bytes", "--upstream"} <= flags
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    known = {s for action in run._actions for s in action.option_strings}
    assert flags <= known, flags - known
