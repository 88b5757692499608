"""`zlog bench peer`: pyzlog against Redis Streams, end to end and briefly.

Runs the installed `zlog` against the session cluster (as tests/test_cli.py
does) and checks what the results file promises: every case with positive
rates in every round, the CPU figures, ratios that follow from the recorded
rates, and no server left behind. No duration is asserted.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from test_cli import ZLOG, ok, run

#: raw_async_shape: the raw write in the shape append_async's run sent (entries per class call); and
#: raw_split where an append_many call reaches the OSD as more than one op (see below)
CASES = {"zlog_append_async", "redis_xadd_pipelined", "zlog_append_many", "raw_omap", "raw_append",
         "raw_async_shape", "raw_append_sync",
         "zlog_append", "redis_xadd", "zlog_stream", "redis_xrange", "zlog_stream_batches",
         # the same cases on a log in the omap format, for the data format's OSD ratios
         "zlog_append_async_omap", "zlog_append_many_omap", "zlog_stream_batches_omap"}
RATIOS = {"append_async_vs_xadd", "append_many_vs_xadd", "append_vs_single_xadd", "stream_vs_xrange",
          "stream_batches_vs_xrange"}
ROUNDS = 2


def _running(pid: int, name: str) -> bool:
    """True if `pid` is a live (not zombie) process whose command names `name`."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (./dev setup)")
def test_bench_peer(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "peer.json"
    before = set(ok(run(ceph, "ls")).split())
    p = run(ceph, "bench", "peer", "--duration", "1.5", "--rounds", str(ROUNDS), "--entries", "500",
            "--out", str(out), timeout=300)
    # the end of stderr: the error line, not the progress bars before it
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode()[-4000:]
    said = p.stdout.decode()
    assert "| zlog append_async, depth 128 |" in said and "| Redis XADD, pipelined (128)" in said
    assert "| raw omap set, 64 keys per op |" in said and "| raw object-data append, 64 KB per op |" in said
    r = json.loads(out.read_text())
    assert r["kind"] == "peer" and r["params"]["rounds"] == ROUNDS and r["markdown"] in said
    cases = r["cases"]
    # a log's stripes are dealt in runs of 128 by default: an append_many of 64 is one
    # write_many, or two where it crosses a run's end (then the raw write of that shape too)
    per_op = cases["zlog_append_many"]["entries_per_osd_op"]
    assert 64 / 2 <= per_op <= 64
    split = per_op < 64
    assert set(cases) == CASES | ({"raw_split"} if split else set())
    assert ("(append_many's shape) |" in said) == split
    local = ceph.dir is not None  # our own dev cluster: its OSDs are processes on this host
    for key, c in cases.items():
        assert len(c["rounds_ops_per_s"]) == ROUNDS and all(v > 0 for v in c["rounds_ops_per_s"]), key
        assert c["entries_per_s"] == pytest.approx(statistics.median(c["rounds_ops_per_s"]))
        assert c["ops"] > 0 and c["ops_per_s"] > 0
        cpu = c["cpu"]
        for field in ("client_us_per_entry", "osd_us_per_entry", "redis_us_per_entry", "seqr_us_per_entry",
                      "machine_busy"):
            assert field in cpu, (key, field)
        assert cpu["client_us_per_entry"] > 0 and 0 < cpu["machine_busy"] <= 1, key
        assert len(c["cpu_rounds"]) == ROUNDS
        if c["system"] == "redis":
            # the redis-server process is ours, on this host, whatever the cluster
            assert c["server"] == "redis-server" and c["server_us_per_entry"] > 0, key
        elif local:
            assert c["server"] == "osd" and c["server_us_per_entry"] > 0, key
    for key in ("zlog_append_async", "zlog_append_many", "zlog_append"):
        assert cases[key]["stored"] == cases[key]["ops"]  # the client stored every append it counted
    if split:
        k = cases["raw_split"]["entries_per_osd_op"]
        assert k == round(per_op) and f"{k:g}" in cases["raw_split"]["label"]
    assert cases["zlog_append_async"]["entries_per_osd_op"] >= 1
    shape = cases["raw_async_shape"]
    assert "append_async's shape" in shape["label"] and len(shape["entries_per_op_rounds"]) == ROUNDS
    assert all(k >= 1 for k in shape["entries_per_op_rounds"])
    assert shape["entries_per_osd_op"] == pytest.approx(statistics.mean(shape["entries_per_op_rounds"]))
    assert cases["zlog_stream"]["gaps"] == 0 and cases["zlog_stream_batches"]["gaps"] == 0
    assert cases["zlog_stream_batches_omap"]["gaps"] == 0
    assert r["entry_layout"]["layout"] == "data"  # a new log's default format

    # data format over omap format, OSD CPU per entry: the median of the per-round ratios
    f = r["format_ratios"]
    assert set(f) == {"append_many", "append_async", "stream_batches"}
    for name, v in f.items():
        if not local:
            continue
        want = statistics.median(x["osd_us_per_entry"] / y["osd_us_per_entry"] for x, y in
                                 zip(cases[f"zlog_{name}"]["cpu_rounds"], cases[f"zlog_{name}_omap"]["cpu_rounds"]))
        assert v["data_vs_omap_osd"] == pytest.approx(want), name
    if local:
        sb = f["stream_batches"]
        assert sb["target"] == pytest.approx(1 / 3) and sb["target_met"] == (sb["data_vs_omap_osd"] <= 1 / 3)

    # each ratio is the median of the per-round ratios of the rates it names
    assert set(r["ratios"]) == RATIOS == set(r["ratio_cases"])
    for name, (a, b) in r["ratio_cases"].items():
        want = statistics.median(x / y for x, y in zip(cases[a]["rounds_ops_per_s"], cases[b]["rounds_ops_per_s"]))
        assert r["ratios"][name] == pytest.approx(want), name
    assert r["ratio_cases"]["append_async_vs_xadd"] == ["zlog_append_async", "redis_xadd_pipelined"]
    # append_many's ceiling: RADOS alone in its pattern (one 64 KB append waited for at a time)
    assert r["ceiling_cases"] == {"raw_append_one_at_a_time_vs_xadd": ["raw_append_sync", "redis_xadd_pipelined"]}
    want = statistics.median(x / y for x, y in zip(cases["raw_append_sync"]["rounds_ops_per_s"],
                                                    cases["redis_xadd_pipelined"]["rounds_ops_per_s"]))
    assert r["ceilings"]["raw_append_one_at_a_time_vs_xadd"] == pytest.approx(want)
    assert "The ceiling of append_many here" in said and cases["raw_append_sync"]["entries_per_osd_op"] == 64
    o = r["osd_ratios"]
    assert r["entry_layout"]["layout"] in ("omap", "data")
    assert o["baseline"] == {"omap": "raw_omap", "data": "raw_append"}[r["entry_layout"]["layout"]] and o["why"]
    for key in ("zlog_append_many", "zlog_append_async"):
        if not local:
            continue
        for raw in ("raw_omap", "raw_append"):
            want = statistics.median(x["osd_us_per_entry"] / y["osd_us_per_entry"]
                                     for x, y in zip(cases[key]["cpu_rounds"], cases[raw]["cpu_rounds"]))
            assert o[key][f"vs_{raw}"] == pytest.approx(want), (key, raw)
        if key == "zlog_append_many":
            if split:
                want = statistics.median(x["osd_us_per_entry"] / y["osd_us_per_entry"] for x, y in
                                         zip(cases[key]["cpu_rounds"], cases["raw_split"]["cpu_rounds"]))
                assert o[key]["vs_raw_split"] == pytest.approx(want)
            else:
                assert "vs_raw_split" not in o[key]
        else:
            want = statistics.median(x["osd_us_per_entry"] / y["osd_us_per_entry"] for x, y in
                                     zip(cases[key]["cpu_rounds"], cases["raw_async_shape"]["cpu_rounds"]))
            assert o[key]["vs_raw_async_shape"] == pytest.approx(want)
        assert o[key]["ratio"] == o[key][f"vs_{o['baseline']}"]
        assert o[key]["target_met"] == (o[key]["ratio"] <= o["target"])

    # nothing left behind: the redis-server and sequencer it started (by the
    # pids it recorded), its logs
    assert r["redis"]["pid"] and not _running(r["redis"]["pid"], "redis-server")
    assert r["sequencer"]["started_by_bench"] and not _running(r["sequencer"]["pid"], "zlog-seqr")
    assert set(ok(run(ceph, "ls")).split()) == before


def test_bench_peer_without_redis_server(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # a PATH without redis-server: one clear line, before any Ceph work
    env = {**os.environ, "CEPH_CONF": ceph.conf, "ZLOG_POOL": ceph.pool, "PATH": str(Path(ZLOG).parent)}
    p = subprocess.run([ZLOG, "bench", "peer", "--duration", "0.1", "--out", str(tmp_path / "x.json")],
                       capture_output=True, env=env, timeout=60)
    assert p.returncode == 1 and not (tmp_path / "x.json").exists()
    assert p.stderr.decode().strip() == ("zlog: error: redis-server is not installed: run ./dev setup "
                                         "(it installs Debian's redis-server)")
