"""Replicated objects under faults (issue 25), on the session cluster.

- Convergence under a nemesis: N replica processes (tests/objects_worker.py)
  run random map, counter, queue and transaction operations while the
  sequencer is killed and paused, the log reconfigured, replica processes
  paused past the hole wait (their positions filled as LOST) and killed -9
  mid-operation (and started again, from the newest checkpoint), and the
  log checkpointed and trimmed. At the end every replica's state is
  identical to every other's and to a fresh one's, each transaction was
  decided the same everywhere, money is conserved, every acknowledged
  operation is reflected exactly once, and the map's single-key history is
  linearizable (tests/linearizability.py).
- A proposer killed -9 again and again in the middle of transactions.
- Appends that time out (the OSD stalled past the client's op timeout) are
  retried; copies that land later are skipped: applied exactly once.

Faults are delivered by pid to processes this test started (the workers,
the sequencer) and to the session cluster's OSD; nothing else is touched.
Nothing here asserts a duration.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pytest
from linearizability import CAS, DELETE, GET, PUT, Op, check
from seqr_proc import SeqrProcess, _die_with_parent

import pyzlog
from pyzlog import Log
from pyzlog.objects import MISSING, RadosCheckpoints, Runtime

HERE = Path(__file__).resolve().parent
WORKER = HERE / "objects_worker.py"
SECONDS = float(os.environ.get("ZLOG_OBJECTS_NEMESIS_SECONDS", "60"))
HOLE_WAIT = 1.0
ACCOUNTS, INITIAL = 5, 100


class Worker:
    def __init__(self, conf: str, pool: str, name: str, seqr: str, out: Path, seed: int,
                 mix: str = "lin,add,qput,qget,txn") -> None:
        self.args = [sys.executable, "-P", str(WORKER), "--conf", conf, "--pool", pool, "--log", name,
                     "--sequencer", seqr, "--out", str(out), "--seed", str(seed), "--hole-wait", str(HOLE_WAIT),
                     "--mix", mix]
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=open(self.out / f"worker-{time.time_ns()}.out", "wb"),
                                     stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_started(out: Path, count: int) -> None:
    wait_for(lambda: len(list(out.glob("started-*"))) >= count, 120, f"{count} workers to start")


# --------------------------------------------------------------- histories
def load_history(out: Path) -> list[dict[str, Any]]:
    """Operations with their outcome: ok (with res), fail, or unknown (no
    completion: the process was killed, or an error left it unknown)."""
    ops: dict[str, dict[str, Any]] = {}
    for f in sorted(out.glob("history-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:  # a line cut short by kill -9
                continue
            if ev["ev"] == "inv":
                ops[ev["id"]] = ev | {"outcome": "unknown", "end": None}
            elif ev["id"] in ops:
                ops[ev["id"]].update(outcome=ev["ev"], end=ev["t"], res=ev.get("res"), error=ev.get("error"))
    return list(ops.values())


def dec(v: Any) -> Any:
    return MISSING if v == "<MISSING>" else v


def lin_history(ops: list[dict[str, Any]]) -> list[Op]:
    out = []
    for o in ops:
        if o["op"] != "lin" or o["outcome"] == "fail":
            continue
        known = o["outcome"] == "ok"
        if o["sub"] == "get":
            if known:  # a read with no result constrains nothing
                out.append(Op(o["p"], GET, o["key"], None, dec(o["res"]), o["t"], o["end"]))
            continue
        kind = {"put": PUT, "cas": CAS, "delete": DELETE}[o["sub"]]
        arg = o.get("arg")
        if kind == CAS:
            arg = (dec(arg[0]), arg[1])
        out.append(Op(o["p"], kind, o["key"], arg, o.get("res") if known else None, o["t"],
                      o["end"] if known else None))
    return out


def check_exactly_once(ops: list[dict[str, Any]], final: dict[str, Any]) -> list[str]:
    """Every acknowledged operation is reflected once (and nothing else is)."""
    bad = []
    by = Tally((o["op"], o["outcome"]) for o in ops)
    adds_ok, adds_unknown = by[("add", "ok")], by[("add", "unknown")]
    if not adds_ok <= final["c"] <= adds_ok + adds_unknown:
        bad.append(f"counter {final['c']} outside [{adds_ok}, {adds_ok + adds_unknown}]")
    committed = sum(1 for o in ops if o["op"] == "txn" and o["outcome"] == "ok" and o["res"] is True)
    txn_unknown = by[("txn", "unknown")]
    if not committed <= final["c-txn"] <= committed + txn_unknown:
        bad.append(f"committed transactions {final['c-txn']} outside [{committed}, {committed + txn_unknown}]")
    total = sum(final["acct"].get(f"acct-{i}", INITIAL) for i in range(ACCOUNTS))
    if total != ACCOUNTS * INITIAL:
        bad.append(f"accounts hold {total}, not {ACCOUNTS * INITIAL}")
    put_ok = {o["arg"] for o in ops if o["op"] == "qput" and o["outcome"] == "ok"}
    put_any = {o["arg"] for o in ops if o["op"] == "qput" and o["outcome"] != "fail"}
    got = [tuple(o["res"]) for o in ops if o["op"] == "qget" and o["outcome"] == "ok" and o["res"] is not None]
    got_items = [g[1] for g in got]
    dupes = [i for i, n in Tally(got_items).items() if n > 1]
    if dupes:
        bad.append(f"items consumed twice: {dupes[:5]}")
    left = {v for _, v in final["q"]}
    if left & set(got_items):
        bad.append(f"items consumed and still queued: {sorted(left & set(got_items))[:5]}")
    unseen = put_ok - left - set(got_items)
    if len(unseen) > by[("qget", "unknown")]:
        bad.append(f"{len(unseen)} acknowledged items lost (only {by[('qget', 'unknown')]} gets of unknown outcome "
                   f"could have taken them): {sorted(unseen)[:5]}")
    stray = (left | set(got_items)) - put_any
    if stray:
        bad.append(f"items nobody put: {sorted(stray)[:5]}")
    ids = [g[0] for g in got] + [i for i, _ in final["q"]]
    if len(ids) != len(set(ids)):
        bad.append("a queue id handed out twice")
    return bad


def final_states(out: Path) -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in sorted(out.glob("final-*.json"))]


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    return {k: state[k] for k in ("applied", "m", "c", "c-txn", "acct", "q")}


def observer_state(rt: Runtime) -> dict[str, Any]:
    with rt._lock:
        h = rt.hosted()
        return {"applied": rt.applied, "m": {k: ("<MISSING>" if v is MISSING else v)
                                            for k, v in h["m"].to_dict().items()},  # type: ignore[attr-defined]
                "c": h["c"].value, "c-txn": h["c-txn"].value,  # type: ignore[attr-defined]
                "acct": h["acct"].to_dict(),  # type: ignore[attr-defined]
                "q": [[i, v] for i, v in h["q"].waiting()]}  # type: ignore[attr-defined]


def host_all(rt: Runtime) -> Runtime:
    rt.map("m"), rt.counter("c"), rt.queue("q"), rt.map("acct"), rt.counter("c-txn")
    return rt


def stop_workers(workers: list[Worker], out: Path, observer: Runtime, timeout: float = 300) -> int:
    """Stop every worker's operations, take the tail, let everyone play to it."""
    (out / "stop").touch()
    live = [w for w in workers if w.alive]
    wait_for(lambda: all((out / f"stopped-{w.proc.pid}").exists() or not w.alive for w in live),  # type: ignore
             timeout, "the workers to stop")
    tail = observer.log.tail()
    (out / "final.tmp").write_text(str(tail))
    (out / "final.tmp").replace(out / "final")  # a worker polling for it never reads it half written
    wait_for(lambda: all((out / f"final-{w.proc.pid}.json").exists() or not w.alive for w in live),  # type: ignore
             timeout, "the workers' final states")
    observer.wait_applied(tail, timeout)
    return tail


# ------------------------------------------------------------------ tests
@pytest.mark.timeout(900)
def test_replicas_converge_under_a_nemesis(rados_cluster, ceph, log_name, tmp_path) -> None:  # type: ignore
    rnd = random.Random(25)
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    out = tmp_path / "work"
    out.mkdir()
    admin = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    obs_log = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    observer = host_all(Runtime(obs_log, hole_wait=HOLE_WAIT, checkpoints=RadosCheckpoints.for_log(obs_log),
                                keep_decisions=True))
    workers = [Worker(ceph.conf, ceph.pool, log_name, seqr.address, out, seed=i) for i in range(3)]
    actions: Tally[str] = Tally()
    try:
        wait_started(out, 3)
        t0 = time.monotonic()
        while time.monotonic() - t0 < SECONDS:
            action = rnd.choice(["seqr_kill", "seqr_pause", "reconfigure", "worker_pause", "worker_kill",
                                 "checkpoint_trim"])
            actions[action] += 1
            with open(out / "nemesis.jsonl", "a") as f:  # when each fault began, to read a failure against
                f.write(json.dumps({"t": time.monotonic(), "action": action}) + "\n")
            if action == "seqr_kill":
                seqr.kill(signal.SIGKILL)
                time.sleep(rnd.uniform(0.2, 1.5))
                seqr.start()
            elif action == "seqr_pause":
                seqr.pause()
                time.sleep(rnd.uniform(1.0, 3.0))
                seqr.resume()
            elif action == "reconfigure":
                admin.reconfigure(width=rnd.randint(1, 4))
            elif action == "worker_pause":  # past the hole wait: its positions get filled as LOST
                w = rnd.choice(workers)
                w.signal(signal.SIGSTOP)
                time.sleep(rnd.uniform(HOLE_WAIT * 1.5, 3.0))
                w.signal(signal.SIGCONT)
            elif action == "worker_kill":  # mid-operation; a new process takes its place
                w = rnd.choice(workers)
                w.kill()
                w.start()
            elif action == "checkpoint_trim":
                observer.checkpoint()
                observer.trim(keep=1)
            time.sleep(rnd.uniform(0.5, 2.0))
        for w in workers:
            w.signal(signal.SIGCONT)
        tail = stop_workers(workers, out, observer)
    finally:
        seqr.resume() if seqr.proc and seqr.proc.poll() is None else None
        for w in workers:
            w.kill()
    finals = final_states(out)
    ops = load_history(out)
    # a fresh process: from the newest checkpoint, or from position 0
    fresh_log = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    fresh = host_all(Runtime(fresh_log, hole_wait=HOLE_WAIT, checkpoints=RadosCheckpoints.for_log(fresh_log),
                             keep_decisions=True))
    fresh.wait_applied(tail, 300)
    states = [comparable(f) for f in finals] + [observer_state(observer), observer_state(fresh)]
    counts = Tally((o["op"], o["outcome"]) for o in ops)
    print(f"\nnemesis {SECONDS:.0f}s: actions {dict(actions)}; ops {dict(counts)}; tail {tail}; "
          f"replicas {len(states)}; worker stats {[f['stats'] for f in finals]}")
    try:
        assert len(finals) == len(workers)
        assert all(s["applied"] == tail for s in states), [s["applied"] for s in states]
        for s in states[1:]:
            assert s == states[0]
        # each transaction decided the same by every replica that played it
        decided: dict[str, set[bool]] = {}
        for d in [f["decisions"] for f in finals] + [
                {str(k): v for k, v in (observer.decisions or {}).items()},
                {str(k): v for k, v in (fresh.decisions or {}).items()}]:
            for pos, v in d.items():
                decided.setdefault(pos, set()).add(v)
        assert all(len(v) == 1 for v in decided.values())
        assert sum(1 for v in decided.values() if v == {True}) > 0
        assert check_exactly_once(ops, finals[0]) == []
        lin = check(lin_history(ops))
        assert lin.ok, lin.explain()
        assert counts[("lin", "ok")] > 20 and counts[("txn", "ok")] > 5 and counts[("qget", "ok")] > 5
    finally:
        for rt in (observer, fresh):
            rt.close()
        for lg in (admin, obs_log, fresh_log):
            lg.close()
        seqr.kill()


def test_single_key_map_operations_are_linearizable(rados_cluster, ceph, log_name, tmp_path) -> None:  # type: ignore
    """Three processes on three keys, no faults: the recorded history has a
    linearization (checked by tests/linearizability.py)."""
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    out = tmp_path / "work"
    out.mkdir()
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    observer = host_all(Runtime(lg, hole_wait=HOLE_WAIT))
    workers = [Worker(ceph.conf, ceph.pool, log_name, seqr.address, out, seed=i, mix="lin") for i in range(3)]
    try:
        wait_started(out, 3)
        wait_for(lambda: sum(1 for _ in load_history(out)) >= 300, 300, "300 operations")
        stop_workers(workers, out, observer)
        ops = load_history(out)
        lin = check(lin_history(ops))
        assert lin.ok, lin.explain()
        assert sum(1 for o in ops if o["outcome"] == "ok") >= 300
        assert len({comparable(f)["m"].__repr__() for f in final_states(out)}) == 1
    finally:
        for w in workers:
            w.kill()
        observer.close()
        lg.close()
        seqr.kill()


def test_a_proposer_killed_mid_transaction(rados_cluster, ceph, log_name, tmp_path) -> None:  # type: ignore
    """A process running transfers is killed -9 at random moments, five
    times (before, during or after its commit record's append); the others
    agree on every decision and the money is all there."""
    rnd = random.Random(7)
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    out = tmp_path / "work"
    out.mkdir()
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    observer = host_all(Runtime(lg, hole_wait=HOLE_WAIT, keep_decisions=True))
    steady = Worker(ceph.conf, ceph.pool, log_name, seqr.address, out, seed=1, mix="txn")
    victim = Worker(ceph.conf, ceph.pool, log_name, seqr.address, out, seed=2, mix="txn")
    try:
        wait_started(out, 2)
        for _ in range(5):
            mine = out / f"history-{victim.proc.pid}.jsonl"  # type: ignore[union-attr]
            wait_for(lambda: mine.exists() and mine.read_text().count('"inv"') >= 3, 120,
                     "the victim's transactions")
            time.sleep(rnd.uniform(0, 0.3))
            victim.kill()
            victim.start()
        tail = stop_workers([steady, victim], out, observer)
        ops = load_history(out)
        finals = final_states(out)
        unknown = sum(1 for o in ops if o["outcome"] == "unknown")
        print(f"\n{unknown} transactions left unknown to their killed proposer; {len(observer.decisions or {})} "
              "decided")
        assert unknown >= 1  # a kill landed mid-transaction (a worker is almost always inside one)
        states = [comparable(f) for f in finals] + [observer_state(observer)]
        assert all(s == states[0] for s in states) and states[0]["applied"] == tail
        assert check_exactly_once(ops, finals[0]) == []
        for f in finals:
            for pos, v in f["decisions"].items():
                assert (observer.decisions or {}).get(int(pos)) == v
    finally:
        steady.kill()
        victim.kill()
        observer.close()
        lg.close()
        seqr.kill()


def test_appends_that_time_out_are_applied_exactly_once(ceph, log_name, tmp_path) -> None:  # type: ignore
    """The OSD stalls past the client's op timeout: appends fail, the runtime
    retries them with the same proposal ids, and the stalled writes land
    later too. Every replica applies each proposal once."""
    if ceph.dir is None:
        pytest.skip("needs the session's own cluster (its OSD is paused)")
    from vstartmod import vstart

    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    cluster = pyzlog.connect(ceph.conf, op_timeout=1)
    lg = Log.create(cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    rt = Runtime(lg, hole_wait=HOLE_WAIT)
    ctr = rt.counter("c")
    vc = vstart.Cluster(ceph.dir)
    try:
        assert ctr.add(1) == 1
        vc.stop_osd(0, signal.SIGSTOP)
        try:
            futures = [ctr.add_async(1) for _ in range(20)]
            wait_for(lambda: rt.stats.retries >= 20, 120, "the appends to time out and be retried")
        finally:
            vc.stop_osd(0, signal.SIGCONT)
        assert sorted(f.result(180) for f in futures) == list(range(2, 22))
        rt.sync()
        assert ctr.value == 21
        other = Runtime(Log.open(cluster, ceph.pool, log_name, sequencer=seqr.address))
        oc = other.counter("c")
        other.sync()
        assert oc.value == 21
        # the stalled first attempts landed as copies, and were skipped
        assert other.stats.duplicates == rt.stats.duplicates >= 1
        other.close()
        other.log.close()
    finally:
        rt.close()
        lg.close()
        cluster.shutdown()
        seqr.kill()


@pytest.fixture
def ctrl_c() -> Any:
    """SIGINT raises KeyboardInterrupt, as in a terminal: a suite started in
    the background (`cmd &` in a script) inherits it ignored, and then
    _thread.interrupt_main() does nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_a_put_reaches_the_caller_and_the_put_is_still_applied_once(ctrl_c, rados_cluster, ceph, log_name,  # type: ignore
                                                                               tmp_path, monkeypatch) -> None:
    """Ctrl-C as put()'s append returns, its entry stored: KeyboardInterrupt
    reaches the caller instead of being taken for a failed append and
    retried while the caller waits on, and the entry is retried in the
    background and applied once (the stored copy; the retry's is a
    duplicate)."""
    import _thread
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    try:
        log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
        rt = Runtime(log)
        m = rt.map("m")
        m.put("warm", b"w")
        real_append = log.append

        def stored_then_interrupted(data: bytes) -> int:
            monkeypatch.setattr(log, "append", real_append)  # once
            pos = real_append(data)
            _thread.interrupt_main()
            time.sleep(0.01)  # a call: the interrupt is raised here, within the append
            return pos

        monkeypatch.setattr(log, "append", stored_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            m.put("k", b"v", timeout=60)
        deadline = time.monotonic() + 60
        while m.get("k") is None and time.monotonic() < deadline:
            rt.sync(timeout=30)
            time.sleep(0.05)
        assert m.get("k") == b"v"
        m.put("k2", b"v2")
        assert dict(m.items()) == {"warm": b"w", "k": b"v", "k2": b"v2"}
        assert rt.stats.applied == 3  # the interrupted put once, whatever copies were stored
        rt.close()
        log.close()
    finally:
        seqr.kill()


@pytest.mark.parametrize("close_timeout", [60.0, 0.2], ids=["close-waits", "close-gives-up"])
def test_a_runtime_restarted_with_its_client_id_after_close_loses_no_put(rados_cluster, ceph, log_name,  # type: ignore
                                                                        monkeypatch, close_timeout: float) -> None:
    """A put_async's append is on its way when the runtime closes (held back
    here until the test lets it go). close() waits for it; when it gives up
    waiting, the append lands after a runtime of the same client id has
    started. Either way the new runtime numbers its proposals above every
    seq the last one used (a clock's), so its put takes no seq of the
    first one's: both are applied, and no put is acknowledged and lost."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    fixed = 0x5EED
    rt1 = Runtime(log, client_id=fixed)
    m1 = rt1.map("m")
    m1.put("w", b"w")
    real_async = log.append_async
    gate, sent = threading.Event(), threading.Event()

    def held(data: bytes, future: Any = None) -> Any:  # the append, on its way until the gate opens
        from concurrent.futures import Future
        f: Any = future if future is not None else Future()  # (the runtime's pending proposal stands for it)
        sent.set()

        def go() -> None:
            gate.wait(60)
            try:
                f.set_result(real_async(data).result(60))
            except BaseException as e:  # noqa: BLE001 - handed to the runtime
                f.set_exception(e)
        threading.Thread(target=go, daemon=True).start()
        return f

    monkeypatch.setattr(log, "append_async", held)
    m1.put_async("a", b"a")
    assert sent.wait(30)  # the append is on its way, held
    closer = threading.Thread(target=rt1.close, kwargs={"timeout": close_timeout})
    closer.start()
    closer.join(1.0)

    def restart() -> None:
        rt2 = Runtime(log, client_id=fixed)
        m2 = rt2.map("m")
        rt2.start()  # a fixed id: plays the log, then numbers its proposals after its last seq there
        restarted.append((rt2, m2))

    restarted: list[Any] = []
    if not closer.is_alive():
        restart()  # close did not wait: the new runtime starts while the retry is on its way
    gate.set()
    closer.join(60)
    assert not closer.is_alive()
    if not restarted:
        restart()
    rt2, m2 = restarted[0]
    deadline = time.monotonic() + 30
    while m2.get("a") is None and time.monotonic() < deadline:  # the retry landed: seen by the new runtime
        rt2.sync(timeout=30)
        time.sleep(0.05)
    m2.put("b", b"b", timeout=30)
    fresh = Runtime(log)
    mf = fresh.map("m")
    fresh.sync(timeout=30)
    assert dict(mf.items()) == {"w": b"w", "a": b"a", "b": b"b"}
    for rt in (rt2, fresh):
        rt.close()


def test_ctrl_c_while_a_put_waits_on_a_hole_leaves_the_runtime_running(ctrl_c, rados_cluster, ceph, log_name) -> None:  # type: ignore
    """Ctrl-C while put() plays the log on the caller's thread and waits out
    a hole below its entry: the caller gets KeyboardInterrupt, nothing was
    applied half way, so the runtime does not stop; its player applies the
    put once the hole is filled."""
    import _thread
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    rt = Runtime(log, hole_wait=3.0)
    m = rt.map("m")
    m.put("warm", b"w")
    log.take_positions(1)  # a hole below the next put: playing past it waits hole_wait
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        m.put("k", b"v", timeout=60)
    timer.join()
    assert rt.failed is None
    rt.sync(timeout=60)
    assert m.get("k") == b"v"
    m.put("k2", b"v2")
    assert dict(m.items()) == {"warm": b"w", "k": b"v", "k2": b"v2"} and rt.stats.applied == 3
    rt.close()


def test_a_runtime_closed_on_the_clients_completion_thread_does_not_wait_for_it(rados_cluster, ceph,  # type: ignore
                                                                              log_name, monkeypatch) -> None:
    """close() from an append future's done-callback runs on the client's
    completion thread, where the runtime's own retry in flight would land:
    it does not wait for that (it would wait out its whole timeout, with
    every async append of the connection stalled behind it)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    rt = Runtime(log)
    m = rt.map("m")
    m.put("w", b"w")
    real_async = log.append_async
    closed = threading.Event()

    def close_here(_f: Any) -> None:
        rt.close(timeout=120)
        closed.set()

    def with_a_user_append(data: bytes, future: Any = None) -> Any:  # the runtime's append, beside a user's
        real_async(b"user entry").add_done_callback(close_here)           # append that closes it
        return real_async(data, future)

    monkeypatch.setattr(log, "append_async", with_a_user_append)
    m.put_async("k", b"v")
    assert closed.wait(60), "close() on the completion thread waited for what lands on that thread"
    assert log.append_async(b"after").result(timeout=30) >= 0  # the connection is not stalled


def test_a_streams_replica_restarted_with_its_client_id_takes_no_seq_of_a_stream_it_does_not_read(  # type: ignore
        rados_cluster, ceph, log_name, tmp_path) -> None:
    """With streams, a runtime reads only the streams of what it hosts, so
    the log's entries of its client id in other streams are not counted
    when it starts again with that id. Its seqs start above them anyway (a
    clock's), so its put is not taken by the other replicas for a copy of
    one of them: every replica holds it (found by an adversarial review:
    the put was acknowledged and only the proposer had it)."""
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()  # streams are the sequencer's
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    fixed = 0xABCDEF01
    a = Runtime(log, client_id=fixed, streams=True)
    am, an = a.map("m"), a.map("n")
    am.put("m0", b"y", timeout=30)
    for i in range(5):
        an.put(f"n{i}", b"x", timeout=30)
    a.close()
    b = Runtime(log, client_id=fixed, streams=True)
    bm = b.map("m")  # hosts only m: n's entries are never read here
    b.start()
    bm.put("a", b"B", timeout=30)
    assert dict(bm.items()) == {"m0": b"y", "a": b"B"}
    for streams in (False, True):
        f = Runtime(log, streams=streams)
        fm, fn = f.map("m"), f.map("n")
        f.sync(timeout=30)
        assert dict(fm.items()) == {"m0": b"y", "a": b"B"} and len(dict(fn.items())) == 5, streams
        assert f.stats.duplicates == 0
        f.close()
    assert b.walk_stats.rounds > 0 and b.stats.read < 7  # b read its stream, not the whole log
    b.close()
    seqr.kill()


def test_a_streams_replica_hosting_some_objects_writes_no_checkpoint_to_trim_the_others_by(  # type: ignore
        rados_cluster, ceph, log_name, tmp_path) -> None:
    """A streams replica never reads the streams of what it does not host,
    so it cannot know its checkpoint holds every object the log has entries
    for: it is not complete, and trim() does not cut below it (found by an
    adversarial review: it was marked complete, and trim() erased the other
    objects' history). Nor can a replica of the whole log that started from
    such a checkpoint (found by the next review). 65 objects are more than
    one stream request names:
    hosting the 65th is refused, rather than playing never."""
    from pyzlog import InvalidRequest
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    w = Runtime(log, streams=True)
    wm, wn = w.map("m"), w.map("n")
    for i in range(5):
        wn.put(f"n{i}", b"x")
        wm.put(f"m{i}", b"y")
    w.close()
    r = Runtime(log, streams=True, checkpoints=RadosCheckpoints.for_log(log))
    r.map("m")
    info = r.checkpoint()
    assert info.objects == ("m",) and not info.complete
    assert r.trim() is None and log.first_position() == 0
    r.close()
    late = Runtime(log, checkpoints=RadosCheckpoints.for_log(log))  # the whole log, from the incomplete checkpoint
    late.map("m")
    late.sync(timeout=30)
    assert late.stats.reloads == 1 and not late.checkpoint().complete and late.trim() is None
    late.close()
    full = Runtime(log, checkpoints=RadosCheckpoints.for_log(log))
    full.map("m"), full.map("n")
    assert full.checkpoint().complete  # a replica of the whole log from its start can tell
    full.close()
    for streams in (True, False):
        f = Runtime(log, streams=streams, checkpoints=RadosCheckpoints.for_log(log))
        fn = f.map("n")
        f.sync(timeout=30)
        assert len(dict(fn.items())) == 5, streams
        f.close()
    many = Runtime(log, streams=True)
    for i in range(64):
        many.map(f"o{i}")
    with pytest.raises(InvalidRequest, match="at most 64 objects"):
        many.map("o64")
    many.close()
    seqr.kill()


def test_a_batch_refused_after_part_of_it_was_stored_tells_no_proposal_it_was_not_applied(  # type: ignore
        rados_cluster, ceph, log_name, monkeypatch, tmp_path) -> None:
    """A sender's batch (with streams: the entries' bytes depend on their
    positions, so the senders append what is queued in batches) is one
    write per object: the pool can refuse one (full) after another was
    stored. The refusal lasting past the proposals' deadline, each is
    retired, not told NotApplied outright: those stored are applied
    everywhere and their proposer learns so from the play (found by an
    adversarial review: every one was told NotApplied, half of them
    applied)."""
    from pyzlog.objects import NotApplied, OutcomeUnknown
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()  # streams are the sequencer's
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    rt = Runtime(log, propose_timeout=1.0, streams=True)
    m = rt.map("m")
    m.put("w", b"w")
    real = log.append_streams
    full_until = [0.0]

    def part_then_full(streams: list[int], entries: list[bytes], build: Any = None, **kw: Any) -> list[int]:
        if full_until[0] == 0.0 and len(entries) >= 2:
            full_until[0] = time.monotonic() + 3.0
            real(streams, entries[: len(entries) // 2], build, **kw)  # one object's write stored...
            raise pyzlog.PoolFull("the pool is at its quota (the test)")  # ...the other's refused
        if time.monotonic() < full_until[0]:
            raise pyzlog.PoolFull("the pool is at its quota (the test)")
        return real(streams, entries, build, **kw)

    monkeypatch.setattr(log, "append_streams", part_then_full)
    futures = {f"k{i}": m.put_async(f"k{i}", b"v") for i in range(8)}  # (queued faster than a sender takes them)
    told = {}
    for k, f in futures.items():
        try:
            f.result(60)
            told[k] = "applied"
        except NotApplied:
            told[k] = "not applied"
        except OutcomeUnknown:  # its RETIRE was refused too, while the pool stayed full
            told[k] = "unknown"
    monkeypatch.undo()
    assert full_until[0] > 0  # a batch of several was partly stored
    for streams in (False, True):
        fresh = Runtime(log, streams=streams)
        fm = fresh.map("m")
        fresh.sync(timeout=30)
        stored = {k for k in futures if fm.get(k) is not None}
        assert stored and all(told[k] != "not applied" for k in stored), (told, stored)
        assert all(told[k] != "applied" for k in futures if k not in stored), (told, stored)
        fresh.close()
    rt.close()
    seqr.kill()
