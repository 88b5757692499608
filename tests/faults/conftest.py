"""Fixtures of the fault-injection suite (tests/faults).

Every test here is marked `faults` (select with -m faults, leave out with
-m "not faults") and runs with the default suite. The OSD faults get their own
3-OSD file-backed bluestore cluster (pool size 3, min_size 2), module-scoped;
the others use the session cluster of tests/conftest.py.

Each test hands its checker Report to the `fault_report` fixture; when the
environment names a file in ZLOG_FAULT_REPORT, the row (and each test's
outcome) is appended there as JSON lines, which `python -m
pyzlog.bench.faultreport` turns into results/faults.md and results/faults.json.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from history import History, Report, check, dump
from seqr_proc import SeqrProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REPORT_ENV = "ZLOG_FAULT_REPORT"
#: the per-test time limit (pytest-timeout); each test aims at well under a minute
FAULT_TEST_TIMEOUT = 300
_report_lock = threading.Lock()


from vstartmod import vstart  # noqa: E402  (tests/ is on sys.path via the parent conftest)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault-injection tests (tests/faults); run by default")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.faults)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(FAULT_TEST_TIMEOUT))


def _write_row(row: dict[str, Any]) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with _report_lock, open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each fault test's outcome, for the report table."""
    if HERE not in Path(report.fspath).resolve().parents and Path(report.fspath).resolve().parent != HERE:
        return
    if report.when == "call" or report.outcome != "passed":
        _write_row({"kind": "outcome", "test": report.nodeid, "when": report.when,
                    "outcome": report.outcome, "duration": round(report.duration, 1)})


@dataclass
class FaultRecorder:
    node: str
    tmp: Path
    started: float

    def __call__(self, fault: str, h: History, final: dict[int, Any], **extra: Any) -> Report:
        """Check the history, record the row, print the summary; the caller
        asserts `report.ok` (after its own assertions, if any)."""
        rep = check(h, final)
        row = {"kind": "fault", "test": self.node, "fault": fault, "ops": rep.ops,
               "acknowledged": rep.acknowledged, "failed": rep.failed_appends,
               "unknown": rep.unknown_appends, "reads": rep.reads,
               "final_positions": rep.final_positions, "final_gaps": rep.final_gaps,
               "anomalies": rep.anomalies, "found": rep.found, "examples": rep.examples,
               "seconds": round(time.monotonic() - self.started, 1), **extra}
        _write_row(row)
        print(f"\n[{fault}] {rep.summary()}")
        if not rep.ok:
            dump(h, str(self.tmp / "history.jsonl"))
            print(f"history written to {self.tmp / 'history.jsonl'}")
        return rep


@pytest.fixture
def fault_report(request: pytest.FixtureRequest, tmp_path: Path) -> FaultRecorder:
    return FaultRecorder(request.node.nodeid, tmp_path, time.monotonic())


@pytest.fixture
def seqr(ceph, tmp_path: Path) -> Iterator[SeqrProcess]:  # type: ignore[no-untyped-def]
    """A zlog-seqr process on the session cluster, killed by its pid at the end."""
    p = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    yield p
    p.kill()


@pytest.fixture
def log_name() -> str:
    return f"fault-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------- the 3-OSD cluster
@dataclass
class OsdCluster:
    cluster: Any  # vstart.Cluster
    conf: str
    pool: str
    osds: int

    def up_osds(self) -> int:
        try:
            st = json.loads(self.cluster.ceph("osd", "stat", "-f", "json", timeout=30))
        except Exception:  # noqa: BLE001 - the mon may be busy; ask again
            return -1
        return int(st.get("num_up_osds", -1))

    def ensure_running(self) -> None:
        """Every OSD process running and not paused."""
        running = self.cluster.daemons()
        for i in range(self.osds):
            pid = running.get(f"osd.{i}")
            if pid is None:
                self.cluster.start_osd(i)
            else:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    self.cluster.start_osd(i)


@pytest.fixture(scope="module")
def osd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OsdCluster]:
    """1 mon and 3 file-backed bluestore OSDs (survive kill -9); pool size 3,
    min_size 2. Stopped at the end by the pids vstart started."""
    c = vstart.Cluster(tmp_path_factory.mktemp("osd3"))
    try:
        st = c.start(osds=3, bluestore=True, owner_pid=os.getpid())
        yield OsdCluster(c, st["conf"], st["pool"], 3)
    finally:
        c.stop()
