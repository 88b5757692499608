"""Run the fault-injection suite (tests/faults) and tabulate what it proved.

    python -m pyzlog.tools.faultreport [--repo DIR] [--results DIR] [PYTEST ARGS...]

Runs pytest on the repository's tests/faults with ZLOG_FAULT_REPORT naming a
file: each fault test appends a JSON row there (its checker's Report: the
operations run, the acknowledged appends, the anomalies found) and its outcome.
Prints a table and writes it to RESULTS/faults.md (Markdown) and
RESULTS/faults.json. The repository is --repo, or the first of the current
directory and its parents that holds tests/faults. Exits non-zero when a test
failed or any anomaly was found. Extra arguments go to pytest (e.g. -k osd).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPORT_ENV = "ZLOG_FAULT_REPORT"
FAULT_DIR = Path("tests") / "faults"


def find_repo(start: Path) -> Path | None:
    """The first of `start` and its parents that holds tests/faults."""
    start = start.resolve()
    for d in (start, *start.parents):
        if (d / FAULT_DIR / "conftest.py").is_file():
            return d
    return None


def pytest_command() -> list[str]:
    """The pytest of this interpreter's environment (never the source tree's
    pyzlog: -P keeps the working directory off sys.path)."""
    exe = Path(sys.executable).parent / "pytest"
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-P", "-m", "pytest"]


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def build_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per fault test: its report joined with its outcome."""
    outcomes: dict[str, str] = {}
    durations: dict[str, float] = {}
    for r in rows:
        if r.get("kind") == "outcome":
            test = r["test"]
            if r["outcome"] != "passed" or test not in outcomes:
                outcomes[test] = r["outcome"] if r["when"] == "call" else f"{r['outcome']} ({r['when']})"
            if r["when"] == "call":
                durations[test] = r.get("duration", 0.0)
    table: list[dict[str, Any]] = []
    seen = set()
    for r in rows:
        if r.get("kind") != "fault":
            continue
        seen.add(r["test"])
        table.append({**r, "result": outcomes.get(r["test"], "?"),
                      "duration": durations.get(r["test"], r.get("seconds"))})
    for test, outcome in outcomes.items():  # tests that failed before reporting
        if test not in seen:
            table.append({"test": test, "fault": test.split("::")[-1], "result": outcome, "ops": None,
                          "acknowledged": None, "failed": None, "unknown": None, "final_positions": None,
                          "final_gaps": None, "anomalies": None, "found": {},
                          "duration": durations.get(test)})
    return table


def _cell(v: Any) -> str:
    return "—" if v is None else str(v)


def markdown(table: list[dict[str, Any]]) -> str:
    head = ("| Fault | Result | Operations | Acknowledged appends | Failed / unknown appends "
            "| Final scan (gaps) | Anomalies | Seconds |")
    lines = [head, "|" + "---|" * 8]
    for t in table:
        anomalies = _cell(t.get("anomalies"))
        if t.get("found"):
            anomalies += " (" + ", ".join(f"{k} {v}" for k, v in t["found"].items()) + ")"
        fu = ("—" if t.get("failed") is None else f"{t['failed']} / {t['unknown']}")
        fs = ("—" if t.get("final_positions") is None else f"{t['final_positions']} ({t['final_gaps']})")
        lines.append(f"| {t['fault']} | {t['result']} | {_cell(t.get('ops'))} | {_cell(t.get('acknowledged'))} "
                     f"| {fu} | {fs} | {anomalies} | {_cell(t.get('duration'))} |")
    # a row's `timings` (event -> seconds after the fault), e.g. an OSD marked down, out, backfilled
    timed = [t for t in table if t.get("timings")]
    if timed:
        lines.append("")
        lines.append("Timings, in seconds after the fault began:")
        lines.append("")
        for t in timed:
            lines.append(f"- {t['fault']}: " + ", ".join(f"{k} {v}" for k, v in t["timings"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyzlog.tools.faultreport",
                                 description="run tests/faults and tabulate the anomalies found")
    ap.add_argument("--repo", type=Path, default=None,
                    help="repository root (default: the current directory or a parent holding tests/faults)")
    ap.add_argument("--results", type=Path, default=None, help="output directory (default: REPO/results)")
    args, extra = ap.parse_known_args(argv)
    repo = args.repo.resolve() if args.repo else find_repo(Path.cwd())
    if repo is None or not (repo / FAULT_DIR).is_dir():
        print(f"no {FAULT_DIR} found from {Path.cwd()} (pass --repo)", file=sys.stderr)
        return 2
    results = (args.results or repo / "results").resolve()

    with tempfile.TemporaryDirectory(prefix="zlog-faults-") as tmp:
        rows_path = Path(tmp) / "rows.jsonl"
        env = dict(os.environ, **{REPORT_ENV: str(rows_path)})
        cmd = [*pytest_command(), str(FAULT_DIR), "-q", "-rA", *extra]
        print("$ " + " ".join(cmd), flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(cmd, cwd=repo, env=env, stdin=subprocess.DEVNULL)
        elapsed = time.monotonic() - t0
        rows = read_rows(rows_path)

    table = build_table(rows)
    anomalies = sum(t.get("anomalies") or 0 for t in table)
    md = markdown(table)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    summary = (f"{len(table)} fault tests in {elapsed:.0f} s, pytest exit {rc}, "
               f"{anomalies} anomalies found")
    print()
    print(md)
    print()
    print(summary)
    results.mkdir(parents=True, exist_ok=True)
    (results / "faults.md").write_text(f"# Fault-injection results\n\n{stamp}: {summary}.\n\n{md}\n")
    (results / "faults.json").write_text(json.dumps(
        {"when": stamp, "seconds": round(elapsed, 1), "pytest_exit": rc, "anomalies": anomalies,
         "faults": table}, indent=2) + "\n")
    print(f"written: {results / 'faults.md'}, {results / 'faults.json'}")
    if rc != 0:
        return rc
    return 1 if anomalies or not table else 0


if __name__ == "__main__":
    sys.exit(main())
