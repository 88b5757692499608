"""Named consumers (issue 26): positions kept in RADOS beside the log, resumed
after a restart, never moved back by a second instance, reported as lag in
metrics and `zlog status`; a consumer killed -9 between processing and
commit gets its uncommitted records again and none it committed."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from test_cli import assert_error, ok, run
from test_client_metrics import Deltas

from pyzlog import CommitRefused, InvalidRequest, Log, RecordKind
from pyzlog.client import metrics
from pyzlog.core import offsets
from pyzlog.core.cluster import open_ioctx
from pyzlog.core.layout import META_NAMESPACE

HERE = Path(__file__).resolve().parent


def make_log(rados_cluster, ceph, name: str, n: int, width: int = 2) -> Log:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, name, width=width)
    if n:
        assert log.append_many([b"e%d" % i for i in range(n)]) == list(range(n))
    return log


def test_a_consumer_resumes_from_its_commit(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 10)
    c = log.consumer("billing")
    assert not c.resumed and c.position == c.committed == 0
    got = []
    for rec in c.stream(follow=False):
        got.append(rec.data)
        if rec.position == 5:
            assert c.commit() == 6  # past the record just handed out
    assert got == [b"e%d" % i for i in range(10)] and c.position == 10
    assert c.committed == 6 and c.lag() == 4

    again = Log.open(rados_cluster, ceph.pool, log_name).consumer("billing")
    assert again.resumed and again.position == 6
    assert [r.position for r in again.stream(follow=False)] == [6, 7, 8, 9]
    stored = again.committed_now()
    assert stored is not None and stored.position == 6 and stored.committed_by.endswith(f":{os.getpid()}")
    # another consumer of the same log keeps its own position
    other = log.consumer("audit")
    assert other.position == 0 and not other.resumed
    assert set(log.consumers()) == {"billing"}  # "audit" never committed
    other.commit(3)
    assert {k: v.position for k, v in log.consumers().items()} == {"billing": 6, "audit": 3}


def test_start_for_a_consumer_that_never_committed(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 6)
    log.trim_to(1)
    assert log.consumer("a").position == 2  # earliest: after the trimmed prefix
    assert log.consumer("b", start="latest").position == 6
    assert log.consumer("c", start=4).position == 4
    log.consumer("d", start=4).commit(5)
    assert log.consumer("d", start=0).position == 5  # a commit wins over start
    for bad in ("oldest", -1, 1.5, True):
        with pytest.raises(InvalidRequest):
            log.consumer("e", start=bad)  # type: ignore[arg-type]
    for name in ("", "a/b", "~x", ".x", "x" * 201, 7):
        with pytest.raises(InvalidRequest, match="bad consumer name"):
            log.consumer(name)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        log.consumer("f").commit(-3)


def test_gaps_are_handed_out_and_committed_past(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 3)
    log.fill(log.take_positions(1))
    log.append(b"last")
    c = log.consumer("g")
    kinds = [r.kind for r in c.stream(follow=False)]
    assert kinds == [RecordKind.DATA] * 3 + [RecordKind.FILLED, RecordKind.DATA]
    assert c.commit() == 5 and log.consumer("g").position == 5


def test_a_second_instance_cannot_move_the_position_back(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 20)
    a, b = log.consumer("billing"), log.consumer("billing")
    assert a.commit(12) == 12
    with pytest.raises(CommitRefused) as refused:
        b.commit(5)
    assert refused.value.attempted == 5 and refused.value.committed.position == 12
    assert b.committed == 12  # b learnt what is stored
    assert log.consumer("billing").position == 12
    assert b.commit(12) == 12  # the stored position again: nothing to do, no error
    a.reset(3)  # the one way back: an explicit reset
    assert log.consumer("billing").position == 3 and a.position == 3


def test_racing_instances_only_move_the_position_forward(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Four instances commit interleaved positions at once while a fifth
    reads the stored position: what it sees never goes down, and the end
    is the highest position committed."""
    log = make_log(rados_cluster, ceph, log_name, 0)
    instances = [log.consumer("race") for _ in range(4)]
    seen: list[int] = []
    done = threading.Event()
    refused = [0] * 4

    def committer(k: int) -> None:
        for pos in range(k, 200, 4):
            try:
                instances[k].commit(pos)
            except CommitRefused as e:
                assert e.committed.position > pos
                refused[k] += 1

    def watcher() -> None:
        io = open_ioctx(rados_cluster, ceph.pool, META_NAMESPACE)
        while not done.is_set():
            got = offsets.read(io, log_name, "race")
            if got is not None:
                seen.append(got.position)

    w = threading.Thread(target=watcher)
    w.start()
    threads = [threading.Thread(target=committer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    w.join(60)
    assert seen == sorted(seen), "the stored position went back"
    assert log.consumer("race").position == 199


def _consumer(ceph, name: str, hang_after: int) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, str(HERE / "consumer_proc.py"), ceph.conf, ceph.pool, name,
                             "billing", "10", str(hang_after)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(lines: list[str], kind: str) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith(kind + " ")]


def test_a_consumer_killed_before_its_commit_sees_those_records_again(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 55)
    proc = _consumer(ceph, log_name, hang_after=3)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until it has processed 30..39 and not committed them
            lines.append(line.strip())
            if line.strip() == "hang":
                break
        assert lines[-1] == "hang", (lines, proc.stderr.read() if proc.stderr else "")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _events(lines, "start") == [0]
    assert _events(lines, "committed") == [10, 20, 30]
    assert _events(lines, "processed") == list(range(40))  # 30..39 processed, never committed

    proc = _consumer(ceph, log_name, hang_after=-1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    again = out.split("\n")
    assert _events(again, "start") == [30]
    processed = _events(again, "processed")
    assert processed[:10] == list(range(30, 40))  # the uncommitted ones, again
    assert processed == list(range(30, 55)) and min(processed) == 30  # none it had committed
    assert _events(again, "committed") == [40, 50]
    assert log.consumer("billing").position == 50


def test_the_log_list_status_and_info_show_consumers_not_as_logs(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 8)
    log.consumer("billing").commit(3)
    log.consumer("audit").commit(8)
    names = Log.list(rados_cluster, ceph.pool)
    assert log_name in names and not any(n.startswith(offsets.CONSUMER_PREFIX) for n in names)
    doc = json.loads(ok(run(ceph, "status", "--json")))
    assert all("error" not in entry for entry in doc["logs"]), [e for e in doc["logs"] if "error" in e]
    assert doc["log_count"] == len(doc["logs"])
    mine = next(entry for entry in doc["logs"] if entry["name"] == log_name)
    assert [(c["name"], c["position"], c["lag"]) for c in mine["consumers"]] == [("audit", 8, 0),
                                                                                ("billing", 3, 5)]
    assert mine["consumers"][0]["committed_by"].endswith(f":{os.getpid()}")
    text = ok(run(ceph, "status"))
    assert re.search(r"consumer billing +position +3 +lag +5 ", text), text
    info = json.loads(ok(run(ceph, "info", log_name, "--json")))
    assert {c["name"]: c["lag"] for c in info["consumers"]} == {"audit": 0, "billing": 5}
    assert "consumers:" in ok(run(ceph, "info", log_name))
    assert offsets.remove(open_ioctx(rados_cluster, ceph.pool, META_NAMESPACE), log_name, "audit")
    assert set(log.consumers()) == {"billing"}


def test_lag_and_commits_are_metrics(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    metrics.register(registry)
    d = Deltas(registry)
    log = make_log(rados_cluster, ceph, log_name, 10)
    c = log.consumer("billing")
    labels = {"pool": ceph.pool, "log": log_name, "consumer": "billing"}
    assert d.now()[("zlog_client_consumer_lag", tuple(sorted(labels.items())))] == 10
    c.commit(4)
    behind = log.consumer("billing", start=0)
    behind.committed = 1  # as if it had read the position before c committed
    with pytest.raises(CommitRefused):
        behind.commit(2)
    behind.close()
    now = d.now()
    key = tuple(sorted(labels.items()))
    assert now[("zlog_client_consumer_position", key)] == 4
    assert now[("zlog_client_consumer_lag", key)] == 6
    assert d("zlog_client_consumer_commits_total", outcome="committed") == 1
    assert d("zlog_client_consumer_commits_total", outcome="refused") == 1
    log.append_many([b"x"] * 5)
    c.lag()  # read the tail again now (a scrape reads it at most once a second)
    assert d.now()[("zlog_client_consumer_lag", key)] == 11
    c.close()
    assert ("zlog_client_consumer_lag", key) not in d.now()


def test_the_consumer_command_shows_resets_and_removes(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, 10)
    assert "has no named consumers" in ok(run(ceph, "consumer", log_name))
    log.consumer("billing").commit(7)
    log.consumer("audit").commit(2)
    rows = json.loads(ok(run(ceph, "consumer", log_name, "--json")))
    assert [(r["name"], r["position"], r["lag"]) for r in rows] == [("audit", 2, 8), ("billing", 7, 3)]
    assert re.search(r"^billing +position +7 +lag +3 ", ok(run(ceph, "consumer", log_name, "billing")), re.M)
    # a rewind: the one way back, by an operator
    rows = json.loads(ok(run(ceph, "consumer", log_name, "billing", "--reset", "1", "--json")))
    assert [(r["name"], r["position"]) for r in rows] == [("billing", 1)]
    assert log.consumer("billing").position == 1
    assert "removed" in ok(run(ceph, "consumer", log_name, "audit", "--remove"))
    assert set(log.consumers()) == {"billing"}
    assert_error(run(ceph, "consumer", log_name, "audit"), 1, "has no committed position")
    assert_error(run(ceph, "consumer", log_name, "audit", "--remove"), 1, "has no committed position")
    assert_error(run(ceph, "consumer", log_name, "--reset", "3"), 2, "need a CONSUMER")
    assert_error(run(ceph, "consumer", log_name, "b/x", "--reset", "3"), 1, "bad consumer name")
    assert_error(run(ceph, "consumer", log_name, "billing", "--reset", "-1"), 2)
    assert_error(run(ceph, "consumer", log_name + "-none"), 1, "does not exist")
