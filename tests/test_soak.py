"""`zlog bench soak` (issue 24), briefly: the file's shape, samples taken of
the client and the daemons, every kind of work done, a failover, no error;
and the growth verdict on made-up samples."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyzlog.bench.soak import proc_sample, verdict


def test_a_short_soak_writes_its_samples(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "soak.json"
    zlog = Path(sys.executable).parent / "zlog"
    # a warm-up longer than the run: nothing is judged for growth in a few seconds
    r = subprocess.run([str(zlog), "--conf", ceph.conf, "--pool", ceph.pool, "bench", "soak", "--seconds", "8",
                        "--sample-interval", "1", "--failover-every", "3", "--warmup", "3600", "--rate", "200",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("seconds", "samples", "verdict", "counts", "errors", "failovers", "anomaly_count", "machine",
                "sample_interval_s", "failover_every_s", "lease_s"):
        assert key in res, key
    assert len(res["samples"]) >= 2
    for s in res["samples"]:
        assert "client" in s["procs"] and any(k.startswith("daemon-") for k in s["procs"])
        for fig in s["procs"].values():
            assert fig["rss_kb"] > 0 and fig["fds"] > 0 and fig["threads"] > 0
    for kind in ("sync", "async", "batch", "streamed", "read"):
        assert res["counts"].get(kind, 0) > 0, (kind, res["counts"])
    assert res["failovers"] and all(f["to"] for f in res["failovers"]), res["failovers"]
    assert res["errors"] == {} and res["anomaly_count"] == 0 and res["failures"] == []
    assert res["verdict"]["ok"] is None and res["verdict"]["judged"] == 0  # too short to judge
    assert "verdict: none (run too short)" in r.stdout


def _samples(series: dict[str, list[tuple[int, int, int]]], step: float = 60.0) -> list[dict]:  # type: ignore[type-arg]
    n = max(len(v) for v in series.values())
    return [{"t": i * step, "procs": {who: {"rss_kb": v[i][0], "fds": v[i][1], "threads": v[i][2]}
                                      for who, v in series.items() if i < len(v)}} for i in range(n)]


def test_the_verdict_judges_growth_after_the_warmup() -> None:
    flat = [(100_000, 30, 20)] * 4 + [(150_000, 31, 21)] * 8  # grows in the warm-up, then flat
    leaking = [(100_000 + 8_000 * i, 30, 20) for i in range(12)]
    fd_leak = [(100_000, 30 + 2 * i, 20) for i in range(12)]
    v = verdict(_samples({"client": flat}), warmup=300)
    assert v["ok"] is True and v["procs"]["client"]["rss_kb"]["growth"] == 0
    v = verdict(_samples({"client": flat, "daemon-0": leaking}), warmup=300)
    assert v["ok"] is False and not v["procs"]["daemon-0"]["rss_kb"]["ok"] and v["procs"]["client"]["judged"]
    v = verdict(_samples({"client": fd_leak}), warmup=300)
    assert v["ok"] is False and not v["procs"]["client"]["fds"]["ok"] and v["procs"]["client"]["rss_kb"]["ok"]
    # a daemon started late is judged from its own start; too short a life is not judged
    late = _samples({"client": flat})
    late[-1]["procs"]["daemon-9"] = {"rss_kb": 1, "fds": 1, "threads": 1}
    v = verdict(late, warmup=300)
    assert v["ok"] is True and v["procs"]["daemon-9"]["judged"] is False


def test_proc_sample_reads_this_process() -> None:
    import os

    s = proc_sample(os.getpid())
    assert s is not None and s["rss_kb"] > 0 and s["fds"] > 0 and s["threads"] >= 1
    assert proc_sample(2**22 + 12345) is None
