"""`zlog status`, `zlog info` (sequencer) and `zlog check`, end to end."""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from seqr_proc import SeqrProcess
from test_cli import run, ok
from vstartmod import vstart


def lines_of(p: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    """{check name: its line} from `zlog check`."""
    out = {}
    for line in p.stdout.decode().splitlines():
        status, _, rest = line.partition(" ")
        name, _, detail = rest.strip().partition(": ")
        out[name] = f"{status} {detail}"
    return out


def test_status_and_info_show_the_sequencer(ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    try:
        ok(run(ceph, "create", log_name, "--width", "2"))
        assert ok(run(ceph, "--seqr", seqr.address, "append", log_name, "a", "b", "c")).split() == ["0", "1", "2"]
        info = json.loads(ok(run(ceph, "info", log_name, "--json")))
        s = info["sequencer"]
        assert s["recorded"] == seqr.address and s["asked"] == seqr.address and s["source"] == "metadata"
        assert s["asked_answers"] is True and info["tail"] == 3 and info["epoch"] == s["recorded_epoch"]
        assert f"{seqr.address} (metadata, answers)" in ok(run(ceph, "info", log_name))

        doc = json.loads(ok(run(ceph, "status", "--json")))
        mine = [entry for entry in doc["logs"] if entry["name"] == log_name]
        assert len(mine) == 1 and mine[0]["tail"] == 3 and mine[0]["width"] == 2
        assert mine[0]["views"] == [{"epoch": 1, "start": 0, "width": 2, "format": "data", "slots": 16384,
                                     "byte_bound": 32 << 20, "stripes": 1, "unit": 128}] and mine[0]["epoch"] == info["epoch"]
        assert doc["log_count"] == len(doc["logs"]) >= 1
        seen = {s["address"]: s for s in doc["sequencers"]}
        assert seen[seqr.address]["answers"] is True and seen[seqr.address]["logs"] >= 1
        text = ok(run(ceph, "status"))
        assert log_name in text and f"{seqr.address} (metadata, answers)" in text
    finally:
        seqr.kill()
    doc = json.loads(ok(run(ceph, "status", "--json")))
    assert {s["address"]: s["answers"] for s in doc["sequencers"]}[seqr.address] is False
    assert "does not answer" in ok(run(ceph, "info", log_name))


def test_status_of_a_missing_pool_is_an_error(ceph) -> None:  # type: ignore[no-untyped-def]
    p = run(ceph, "--pool", "no-such-pool", "status")
    assert p.returncode == 1 and b"no-such-pool" in p.stderr


def test_check_passes_with_a_sequencer(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    try:
        p = run(ceph, "--seqr", seqr.address, "check")
        assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
        got = lines_of(p)
        assert list(got) == ["cluster", "pool", "class", "caps", "sequencer"]
        assert all(v.startswith("OK ") for v in got.values()), got
        assert "osd.0" in got["class"] and seqr.address in got["sequencer"]
        doc = json.loads(run(ceph, "--seqr", seqr.address, "check", "--json").stdout)
        assert [c["status"] for c in doc] == ["ok"] * 5
    finally:
        seqr.kill()


def test_check_fails_line_by_line(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = run(ceph, "--seqr", "127.0.0.1:1", "check")  # nothing listens on port 1
    got = lines_of(p)
    assert p.returncode == 1 and got["sequencer"].startswith("FAIL ") and "does not answer" in got["sequencer"]
    assert got["class"].startswith("OK ") and got["caps"].startswith("OK ")

    p = run(ceph, "--pool", "no-such-pool", "check")
    got = lines_of(p)
    assert p.returncode == 1 and got["pool"].startswith("FAIL ") and "ceph osd pool create" in got["pool"]
    assert [got[n][:4] for n in ("class", "caps", "sequencer")] == ["SKIP"] * 3

    conf = tmp_path / "nowhere.conf"
    conf.write_text("[global]\nmon host = 127.0.0.1:9\nauth client required = none\n")
    p = run(ceph, "--timeout", "2", "check", conf=str(conf), timeout=60)
    got = lines_of(p)
    assert p.returncode == 1 and got["cluster"].startswith("FAIL ") and got["pool"].startswith("SKIP")


def test_check_names_missing_class_caps(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name = f"client.t{uuid.uuid4().hex[:8]}"
    keyring = tmp_path / "k"
    subprocess.run(["ceph", "-c", ceph.conf, "auth", "get-or-create", name, "mon", "allow r", "osd",
                    f"allow rw pool={ceph.pool}", "-o", str(keyring)], check=True, capture_output=True, timeout=60)
    try:
        p = run(ceph, "--client", name, "--keyring", str(keyring), "--seqr", "127.0.0.1:1", "check")
        got = lines_of(p)
        assert p.returncode == 1
        assert got["cluster"].startswith("OK ") and got["pool"].startswith("OK ")
        assert got["caps"].startswith("FAIL ") and "lack 'class-read'" in got["caps"] and name in got["caps"]
        assert got["class"].startswith("FAIL ") and "EPERM" in got["class"]
    finally:
        subprocess.run(["ceph", "-c", ceph.conf, "auth", "del", name], capture_output=True, timeout=60)


@pytest.mark.slow
def test_check_names_the_osd_without_the_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two OSDs; osd.1 restarted with an empty class dir (the class was not
    installed on its host): `zlog check` names osd.1, and only it."""
    c = vstart.Cluster(tmp_path / "c")
    try:
        st = c.start(osds=2, bluestore=True, owner_pid=os.getpid())
        c.stop_osd(1)
        empty = tmp_path / "no-classes"
        empty.mkdir()
        monkeypatch.setenv("CEPH_ARGS", f"--osd-class-dir {empty}")
        c.start_osd(1)
        monkeypatch.delenv("CEPH_ARGS")
        deadline = time.monotonic() + 60
        while True:  # until the monitors see osd.1 up again
            p = run(SimpleNamespace(conf=st["conf"], pool=st["pool"]), "--seqr", "127.0.0.1:1", "check")
            got = lines_of(p)
            if "2 of 2 OSD(s) up" in got.get("cluster", "") or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert p.returncode == 1, p.stdout.decode()
        assert got["class"].startswith("FAIL ") and "not loaded on osd.1 " in got["class"], got
        assert "osd.0" not in got["class"]
    finally:
        c.stop()
