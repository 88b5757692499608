"""Where a benchmark's CPU went: this process, and the OSDs of the cluster
when they run on this host (a dev cluster), read from /proc. A case whose
OSDs are busy while the client idles is bound by the cluster, not by pyzlog.
Other local servers a case talks to (a sequencer, redis-server) can be
measured beside them, by pid."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def local_osd_pids(conf: str | os.PathLike[str]) -> list[int]:
    """The ceph-osd processes on this host started with `-c conf` (vstart's)."""
    want = os.path.realpath(conf)
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not args or not args[0].endswith(b"ceph-osd"):
            continue
        for flag, value in zip(args, args[1:]):
            if flag in (b"-c", b"--conf") and os.path.realpath(os.fsdecode(value)) == want:
                pids.append(int(proc.name))
    return sorted(pids)


def _cpu_s(pid: int) -> float:
    # utime + stime (fields 14 and 15 of stat; the command name may hold spaces)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


@dataclass
class _Sample:
    wall_s: float
    client_s: float
    osd_s: float | None
    machine: tuple[int, int]
    others: dict[str, float | None] = field(default_factory=dict)


@dataclass
class _Spent:
    wall_s: float = 0.0
    client_s: float = 0.0
    osd_s: float | None = 0.0  # None: not known for every round of the case
    busy: int = 0  # jiffies the machine's CPUs were busy, of `total`
    total: int = 0
    others: dict[str, float | None] = field(default_factory=dict)


def _add(spent: float | None, before: float | None, after: float | None) -> float | None:
    return None if spent is None or before is None or after is None else spent + after - before


class CpuMeter:
    """Accumulates, per case, the CPU seconds of this process and of the
    local OSDs while the case ran, and how busy the whole machine was;
    figures() turns them into µs per entry and cores.

    `others` names more local processes to measure (name -> pids), such as
    the sequencer or a peer system's server; figures() reports each as
    `NAME_us_per_entry` and `NAME_cores`."""

    def __init__(self, conf: str | os.PathLike[str] | None,
                 others: dict[str, list[int]] | None = None) -> None:
        self.osd_pids = local_osd_pids(conf) if conf else []
        self.others = {name: list(pids) for name, pids in (others or {}).items()}
        self._spent: dict[str, _Spent] = {}

    def start(self) -> _Sample:
        try:
            osd: float | None = sum(_cpu_s(p) for p in self.osd_pids) if self.osd_pids else None
        except OSError:  # an OSD went away: no OSD figures from now on
            self.osd_pids, osd = [], None
        others: dict[str, float | None] = {}
        for name, pids in self.others.items():
            try:
                others[name] = sum(_cpu_s(p) for p in pids) if pids else None
            except OSError:  # gone: unknown from now on, never a made-up zero
                self.others[name], others[name] = [], None
        return _Sample(time.monotonic(), time.process_time(), osd, _machine_jiffies(), others)

    def stop(self, case: str, started: _Sample) -> None:
        now = self.start()
        spent = self._spent.setdefault(case, _Spent())
        spent.wall_s += now.wall_s - started.wall_s
        spent.client_s += now.client_s - started.client_s
        spent.busy += now.machine[0] - started.machine[0]
        spent.total += now.machine[1] - started.machine[1]
        spent.osd_s = _add(spent.osd_s, started.osd_s, now.osd_s)
        for name in self.others:
            spent.others[name] = _add(spent.others.get(name, 0.0), started.others.get(name), now.others.get(name))

    def figures(self, case: str, entries: int) -> dict[str, Any]:
        s = self._spent.get(case, _Spent(osd_s=None))
        per_entry = 1e6 / max(entries, 1)
        osd_known = s.osd_s is not None and s.wall_s > 0
        others: dict[str, float | None] = {}
        for name in self.others:
            spent = s.others.get(name)
            known = spent is not None and s.wall_s > 0
            others[f"{name}_us_per_entry"] = spent * per_entry if known else None  # type: ignore[operator]
            others[f"{name}_cores"] = spent / s.wall_s if known else None  # type: ignore[operator]
        return {
            "client_us_per_entry": s.client_s * per_entry,
            "client_cores": s.client_s / s.wall_s if s.wall_s else None,
            "osd_us_per_entry": s.osd_s * per_entry if osd_known else None,  # type: ignore[operator]
            "osd_cores": s.osd_s / s.wall_s if osd_known else None,  # type: ignore[operator]
            "local_osds": len(self.osd_pids),
            "machine_busy": s.busy / s.total if s.total else None,  # 1.0: every CPU was busy
            **others,
        }
