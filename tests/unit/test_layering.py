"""The dev cluster (``devbroker/``) builds on the proxy's core, never the other way round.

``proxy`` is what runs in a sidecar; ``devbroker`` is the in-memory Kafka cluster of
the demo and the tests, a top-level package of its own with its own command.

In ``tests/``, a test module takes shared code from the harnesses in ``tests/support/``
(``support.…``) or the fuzzing package (``fuzz.…``), never from another test module.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

from devbroker import cli

ROOT = Path(__file__).resolve().parents[2]


def _names_of(path: Path) -> Iterator[str]:
    """Modules *path* imports by absolute name, and string constants that look like one
    (``importlib.import_module("...")``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_proxy_never_imports_devbroker() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "proxy").rglob("*.py"))
        for name in _names_of(path)
        if name == "devbroker" or name.startswith("devbroker.")
    ]
    assert not found


def test_devbroker_reaches_proxy_by_absolute_imports_only() -> None:
    """Relative imports stay inside devbroker (``from ..x`` would name a sibling of it)."""
    escaping = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "devbroker").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 1
    ]
    assert not escaping


def test_devbroker_is_installed_with_its_own_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["kafka-devbroker"] == "devbroker.cli:main"
    assert "devbroker*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "devbroker" in project["tool"]["mypy"]["packages"]
    args = cli.build_parser().parse_args(["--nodes", "1", "--port", "0", "--topic", "t:2"])
    assert (args.nodes, args.port, args.topic) == (1, 0, [("t", 2)])


def test_test_modules_import_harnesses_not_each_other() -> None:
    tests = ROOT / "tests"
    local = {p.stem for d in (tests, tests / "unit", tests / "integration") for p in d.glob("*.py")}
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = [module, *(f"{module}.{a.name}" for a in node.names)]
            else:
                continue
            found += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in names
                if name.split(".")[0] in local
                or any(part.startswith("test_") for part in name.split("."))
            ]
    assert not found
