"""Test modules take shared code from the harnesses, never from each other.

In ``tests/``, a test module takes shared code from the harnesses in ``tests/support/``
(``support.…``) or the fuzzing package (``fuzz.…``), never from another test module.
The packages' layering (``proxy``, ``devbroker``, ``bench``, ``pipeline``) is checked by
``lint-imports`` (the contracts in ``pyproject.toml``); test modules are no package it
can see, so this rule is checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
