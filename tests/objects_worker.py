"""One replica process of the convergence and linearizability tests
(tests/test_objects_faults.py): it hosts the map "m", the counter "c", the
queue "q" and the accounts map "acct" on a log, runs random operations until
told to stop, and records each one in history.jsonl as it goes (an
invocation line, then its outcome), so a process killed -9 leaves a usable
history: its last operation's outcome is unknown.

    python tests/objects_worker.py --conf C --pool P --log L --out DIR --seed N [--sequencer A]

Operations (each proposer's values are unique, so a result names the write):
- lin: put / get (after sync) / cas / delete on keys lin-0..lin-2 of "m"
- add: counter "c" += 1
- qput / qget: queue "q" (items unique; qget takes the head)
- txn: transfer between accounts acct-0..acct-4 of "acct" and "c-txn" += 1, in one transaction

Stopping: the file DIR/stop makes it finish its operation and write
DIR/stopped-<pid>; then it waits for DIR/final (the log's tail once every
worker stopped), plays to that position, writes DIR/final-<pid>.json (its
state, decisions, position) and exits.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyzlog
from pyzlog import Log
from pyzlog.objects import MISSING, RadosCheckpoints, Runtime

LIN_KEYS = 3
ACCOUNTS = 5
INITIAL = 100
OP_TIMEOUT = 180.0


def enc(v: Any) -> Any:
    return "<MISSING>" if v is MISSING else v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conf", required=True)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--sequencer", default=None)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hole-wait", type=float, default=1.0)
    ap.add_argument("--mix", default="lin,add,qput,qget,txn")
    ap.add_argument("--max-seconds", type=float, default=900)
    args = ap.parse_args(argv)
    out: Path = args.out
    pid = os.getpid()
    rnd = random.Random(args.seed * 1000 + pid)
    cluster = pyzlog.connect(args.conf)
    lg = Log.open(cluster, args.pool, args.log, sequencer=args.sequencer)
    rt = Runtime(lg, hole_wait=args.hole_wait, checkpoints=RadosCheckpoints.for_log(lg), keep_decisions=True)
    m, c, q, acct = rt.map("m"), rt.counter("c"), rt.queue("q"), rt.map("acct")
    ctx = rt.counter("c-txn")
    rt.start()
    # the position of this thread's last sync append (a put's), recorded with the
    # put: a failed linearizability check then names where each write landed
    last_pos = [-1]
    me_thread = threading.get_ident()
    plain_append = lg.append

    def append(data: bytes) -> int:
        pos = plain_append(data)
        if threading.get_ident() == me_thread:
            last_pos[0] = pos
        return pos

    lg.append = append  # type: ignore[method-assign]
    hist = open(out / f"history-{pid}.jsonl", "a", buffering=1)
    me = f"w{args.seed}-{pid}"
    n = 0
    mix = args.mix.split(",")
    (out / f"started-{pid}").touch()
    t_end = time.monotonic() + args.max_seconds

    def record(**kw: Any) -> None:
        hist.write(json.dumps(kw) + "\n")

    while not (out / "stop").exists() and time.monotonic() < t_end:
        n += 1
        kind = rnd.choice(mix)
        op: dict[str, Any] = {"id": f"{me}-{n}", "p": me, "op": kind}
        if kind == "lin":
            key = f"lin-{rnd.randrange(LIN_KEYS)}"
            sub = rnd.choice(["put", "get", "get", "cas", "delete"])
            op |= {"sub": sub, "key": key}
            if sub == "put":
                op["arg"] = f"{me}-{n}"
            elif sub == "cas":
                seen = m.get(key, MISSING)  # a local, possibly stale read: the cas may well fail
                op["arg"] = [enc(seen) if rnd.random() < 0.7 else "nobody", f"{me}-{n}"]
        elif kind == "qput":
            op["arg"] = f"{me}-{n}"
        last_pos[0] = -1
        record(ev="inv", t=time.monotonic(), **op)
        try:
            if kind == "lin":
                if op["sub"] == "put":
                    res: Any = m.put(op["key"], op["arg"], timeout=OP_TIMEOUT)
                elif op["sub"] == "get":
                    op["tail"] = rt.sync(OP_TIMEOUT)  # recorded: a stale read names the tail it played to
                    res = enc(m.get(op["key"], MISSING))
                elif op["sub"] == "cas":
                    exp = MISSING if op["arg"][0] == "<MISSING>" else op["arg"][0]
                    res = m.cas(op["key"], exp, op["arg"][1], timeout=OP_TIMEOUT)
                else:
                    res = m.delete(op["key"], timeout=OP_TIMEOUT)
            elif kind == "add":
                res = c.add(1, timeout=OP_TIMEOUT)
            elif kind == "qput":
                res = q.put(op["arg"], timeout=OP_TIMEOUT)
            elif kind == "qget":
                got = q.get(timeout=OP_TIMEOUT)
                res = None if got is None else [got[0], got[1]]
            else:
                src, dst = rnd.sample(range(ACCOUNTS), 2)
                with rt.transaction(timeout=OP_TIMEOUT) as tx:
                    s = acct.get(f"acct-{src}", INITIAL)
                    d = acct.get(f"acct-{dst}", INITIAL)
                    amount = min(s, rnd.randint(1, 20))
                    acct[f"acct-{src}"] = s - amount
                    acct[f"acct-{dst}"] = d + amount
                    ctx.add(1)
                res = bool(tx.committed)
        except pyzlog.ZlogError as e:
            # NotApplied: definitely not applied; anything else: unknown
            from pyzlog.objects import NotApplied
            record(ev="fail" if isinstance(e, NotApplied) else "unknown", t=time.monotonic(), id=op["id"],
                   error=f"{type(e).__name__}: {e}")
            continue
        where = {"tail": op["tail"], "applied": rt.applied} if "tail" in op else {"pos": last_pos[0]}
        record(ev="ok", t=time.monotonic(), id=op["id"], res=res, **where)
    (out / f"stopped-{pid}").touch()
    while not (out / "final").exists():
        time.sleep(0.05)
    target = int((out / "final").read_text())
    rt.wait_applied(target, timeout=300)
    with rt._lock:
        state = {
            "pid": pid, "applied": rt.applied, "target": target,
            "m": {k: enc(v) for k, v in m.to_dict().items()}, "c": c.value, "c-txn": ctx.value,
            "acct": acct.to_dict(), "q": [[i, v] for i, v in q.waiting()],
            "decisions": {str(k): v for k, v in (rt.decisions or {}).items()},
            "stats": rt.stats.__dict__,
        }
    (out / f"final-{pid}.json.tmp").write_text(json.dumps(state))
    (out / f"final-{pid}.json.tmp").replace(out / f"final-{pid}.json")  # the test polls for it: never half written
    rt.close()
    lg.close()
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
