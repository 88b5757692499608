"""The fault report's table (pyzlog.bench.faultreport): a row's timings are
printed under the table, and a table without any prints no such section."""
from __future__ import annotations

from pyzlog.bench.faultreport import build_table, markdown


def _row(fault: str, **extra: object) -> dict[str, object]:
    return {"kind": "fault", "test": f"t::{fault}", "fault": fault, "ops": 10, "acknowledged": 5,
            "failed": 0, "unknown": 1, "final_positions": 6, "final_gaps": 0, "anomalies": 0,
            "found": {}, "seconds": 3.0, **extra}


def test_timings_listed_under_the_table() -> None:
    rows = [_row("plain"), _row("osd death", timings={"marked down": 11.2, "backfilled": 80.5}),
            {"kind": "outcome", "test": "t::osd death", "when": "call", "outcome": "passed", "duration": 90.0}]
    md = markdown(build_table(rows))
    assert "| osd death | passed | 10 | 5 | 0 / 1 | 6 (0) | 0 | 90.0 |" in md
    assert md.endswith("- osd death: marked down 11.2, backfilled 80.5")
    assert md.count("Timings") == 1


def test_no_timings_no_section() -> None:
    assert "Timings" not in markdown(build_table([_row("plain")]))
