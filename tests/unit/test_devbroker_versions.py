"""The dev cluster's table of supported API versions is what kio's schemas and its caps give."""

from __future__ import annotations

from devbroker.versions import SUPPORTED, derive_supported


def test_the_supported_versions_table_is_kios_ranges_under_the_caps() -> None:
    derived = derive_supported()
    assert SUPPORTED == derived, (
        "kio's schemas (or devbroker.versions._CAPS) changed: set devbroker.versions.SUPPORTED "
        f"to {derived}"
    )
