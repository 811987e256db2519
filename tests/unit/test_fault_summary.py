"""The fault run's closing table (support.verifier.summary_table) over both kinds of report."""

from __future__ import annotations

from support import verifier


def _report(fault: str, received: int, consumers: int = 1) -> dict[str, object]:
    assign = {"kind": "assign", "received": received, "lost": 0, "duplicated": 0}
    return {
        "fault": fault,
        "produced": received,
        "acknowledged": received,
        "consumers": {
            **{f"assign-{i}": {**assign, "out_of_order": 0} for i in range(consumers)},
            "group-1": {"kind": "group", "received": received, "lost": None, "duplicated": 0},
        },
        "group": {"distinct": received, "duplicates": 0, "gaps": 0},
    }


def test_records_faults_are_rows_and_the_others_lines_below() -> None:
    lines = verifier.summary_table(
        {
            "leader-killed": _report("leader-killed", 50000),
            "session-cache-full": _report("session-cache-full", 1500, consumers=10),
            "sigterm-drain": {"fault": "sigterm-drain", "staged": "s", "exit_code": 0},
        }
    )
    assert lines[0].split()[:3] == ["fault", "produced", "acked"]
    assert lines[1].split() == ["leader-killed", *["50000"] * 3, "0", "0", "0", "50000", "0", "0"]
    assert "10 x 1500" in lines[2]
    assert lines[3] == "sigterm-drain: exit_code 0"
    assert len(lines) == 4
