"""A pytest plugin that turns the shaping limits on in every proxy a test starts.

    .venv/bin/pytest -p support.shaped_limits tests/integration/test_proxy_clients.py

The compatibility suites run with the proxy's defaults, where no record or byte cap
applies.  With this plugin every ``config.validate`` call (which every test stack goes
through) gets the caps of the fetch engine's benchmark, ``max_records`` 500 and
``max_partition_bytes`` 64 KiB, unless the test sets a cap itself.  The clients must
still receive every record exactly once and in order: a cap only changes how many
rounds that takes.  ``scripts/compat-shaped`` runs the compatibility suites this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHAPED = {"max_records": 500, "max_partition_bytes": 65_536}
CAPS = ("max_records", "max_partition_records", "max_partition_bytes", "max_response_bytes")
shaped_proxies = 0
"""How many proxies got the caps (printed at the end, so a run shows the plugin acted)."""


def pytest_configure() -> None:
    """Patch before any fixture starts a stack (stacks are module- and session-scoped).

    ``proxy.config`` is imported here, not at the top: it imports kio, which imports
    hypothesis and builds strategies, and a ``-p`` plugin is imported before hypothesis's
    own pytest plugin, which then refuses to load (``HypothesisSideeffectWarning``, an
    error under the suite's ``filterwarnings``)."""
    from proxy import config

    plain = config.validate

    def shaped(values: Mapping[str, Any], source: Mapping[str, str] | None = None) -> Any:
        global shaped_proxies
        if not any(key in values for key in CAPS):
            values = {**SHAPED, **values}
            shaped_proxies += 1
        return plain(values, source)

    config.validate = shaped  # type: ignore[assignment]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(
        f"shaped_limits: {SHAPED} applied to {shaped_proxies} proxy configurations "
        "(in this process; with xdist, in each worker's own output)"
    )
