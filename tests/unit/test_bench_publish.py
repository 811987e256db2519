"""Publishing a benchmark run keeps BENCHMARKS.md's hand-written discussion."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``bench.run`` (bench/ is a directory of the repository, not an installed package)."""
    monkeypatch.syspath_prepend(str(REPO))
    return importlib.import_module("bench.run")


def test_the_discussion_from_its_mark_on_is_kept(run: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    discussion = f"{run.DISCUSSION_MARK}\n## Discussion\n\nLatency: missed by 0.04 ms.\n"
    page.write_text("# Benchmarks\n\n| old | table |\n\n" + discussion)
    assert run.kept_discussion(page) == discussion


def test_nothing_is_kept_without_the_mark_or_the_file(run: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    assert run.kept_discussion(page) == ""
    page.write_text("# Benchmarks\n\n## Discussion\n\nno mark\n")
    assert run.kept_discussion(page) == ""
