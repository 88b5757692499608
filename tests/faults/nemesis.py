"""A randomized nemesis run (issue 16's proof): every kind of appender, two
following readers, and a nemesis that pauses and kills the sequencer,
reconfigures the width, trims to near the tail and pauses a whole client
process; then one history check against a final scan.

The clients:
- in this process: 2 sync appenders, one async appender (the C++ path, 32 in
  flight), one batch appender (append_many of 8) and a following reader;
- a client process (net/netload.py, the same workload with its own reader):
  the nemesis SIGSTOPs it mid-append for longer than the readers' hole wait.

Each nemesis step picks one action at random, then waits 1-2.5 s. A run
passes with 0 anomalies and no hang: appenders stop, and both readers reach
the sentinels, within bounded time.

    .venv/bin/python tests/faults/nemesis.py --runs 5 --seconds 60   # own cluster
    -> results/nemesis.json, results/nemesis.md

tests/faults/test_nemesis.py runs one short round in the suite.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE / "net", HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import pyzlog  # noqa: E402
from pyzlog import Log  # noqa: E402

from faultlib import final_scan, wait_until  # noqa: E402
from history import OK, TRIM, UNKNOWN, History, Report, check  # noqa: E402
from netload import NetWorkload, load_history  # noqa: E402
from seqr_proc import Fleet, SeqrProcess  # noqa: E402

ACTIONS = ("seqr_pause", "seqr_kill", "reconfigure", "trim_near_tail", "client_pause")
HOLE_WAIT = 1.0


class ClientProcess:
    """net/netload.py in a process of its own, so the nemesis can pause it."""

    def __init__(self, conf: str, pool: str, name: str, sequencer: str, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(HERE / "net" / "netload.py"), "--conf", conf, "--pool", pool,
             "--log", name, "--sequencer", sequencer, "--prefix", "p", "--out", str(out),
             "--hole-wait", str(HOLE_WAIT), "--max-seconds", "900"],
            stdout=open(out / "stdout.log", "wb"), stderr=subprocess.STDOUT)

    def counts(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.out / "progress.json").read_text()))
        except (OSError, ValueError):
            return {}

    def stop(self, timeout: float) -> tuple[list[Any], dict[str, int], dict[str, Any]]:
        (self.out / "stop").touch()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the client process did not stop within {timeout:.0f}s "
                                 f"(see {self.out}/stdout.log)") from None
        ops, starts = load_history(self.out / "history.jsonl")
        return ops, starts, json.loads((self.out / "summary.json").read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


def signal_only(seqr: SeqrProcess, sig: int) -> None:
    """Send `sig` without waiting for an exit (SeqrProcess.kill waits)."""
    if seqr.proc is not None and seqr.proc.poll() is None:
        os.kill(seqr.proc.pid, sig)


def run_once(conf: str, pool: str, seqrs: list[SeqrProcess], seconds: float, seed: int, workdir: Path,
             say: Any = print, checker: Any = None) -> dict[str, Any]:
    """One nemesis run on a fresh log; returns its figures (report included).
    With two daemons in `seqrs` (standing by for each other), the appenders
    here are told the first and the client process the second, and the
    nemesis pauses and kills whichever serves the log.
    `checker(history, final_scan) -> Report` (default: history.check) lets the
    fault suite record the run as a row of its table."""
    rnd = random.Random(seed)
    name = f"nemesis-{seed}-{os.getpid()}"
    cluster = pyzlog.connect(conf)
    admin = Log.create(cluster, pool, name, width=3, sequencer=seqrs[0].address)
    h = History()
    w = NetWorkload(h, cluster, pool, name, sequencer=seqrs[0].address, appenders=2, batch=8,
                    async_window=32, hole_wait=HOLE_WAIT, prefix="h").start()
    client = ClientProcess(conf, pool, name, seqrs[-1].address, workdir / f"client-{seed}")

    def active() -> SeqrProcess:
        owner = admin.refresh().sequencer
        return next((s for s in seqrs if s.address == owner), seqrs[0])

    actions: Counter[str] = Counter()
    t0 = time.monotonic()
    try:
        wait_until(lambda: w.counts()["acked"] >= 20, 60, "the first appends")
        while time.monotonic() - t0 < seconds:
            action = rnd.choice(ACTIONS)
            actions[action] += 1
            if action == "seqr_pause":
                seqr = active()
                signal_only(seqr, signal.SIGSTOP)
                time.sleep(rnd.uniform(1.0, 4.0))
                signal_only(seqr, signal.SIGCONT)
            elif action == "seqr_kill":
                seqr = active()
                seqr.kill(signal.SIGKILL)
                time.sleep(rnd.uniform(0.2, 1.5))
                seqr.start()
            elif action == "reconfigure":
                admin.reconfigure(width=rnd.randint(1, 4))
            elif action == "trim_near_tail":
                q = admin.tail() - rnd.randint(1, 200)
                if q >= 0:
                    op = h.invoke(TRIM, "nemesis", position=q, upto=True)
                    try:
                        admin.trim_to(q)
                    except pyzlog.ZlogError as e:
                        h.complete(op, UNKNOWN, error=e)
                    else:
                        h.complete(op, OK)
            elif action == "client_pause":
                client.proc.send_signal(signal.SIGSTOP)
                time.sleep(rnd.uniform(HOLE_WAIT * 1.5, 4.0))
                client.proc.send_signal(signal.SIGCONT)
            time.sleep(rnd.uniform(1.0, 2.5))
    finally:
        for seqr in seqrs:
            signal_only(seqr, signal.SIGCONT)
            if seqr.proc is None or seqr.proc.poll() is not None:
                seqr.start()
        if client.proc.poll() is None:
            client.proc.send_signal(signal.SIGCONT)
    stop_t = time.monotonic()
    try:
        w.stop(timeout=180)
        ops, starts, summary = client.stop(timeout=240)
    finally:
        client.kill()
    stopped_in = time.monotonic() - stop_t
    h.extend(ops, starts)
    final = final_scan(cluster, pool, name, hole_wait=HOLE_WAIT)
    rep: Report = (checker or check)(h, final)
    admin.close()
    cluster.shutdown()
    out = {
        "seed": seed, "seconds": round(time.monotonic() - t0, 1), "stopped_in_s": round(stopped_in, 1),
        "actions": dict(actions), "sequencers": len(seqrs), "acknowledged": rep.acknowledged,
        "acknowledged_client_process": summary.get("acked"), "anomalies": rep.anomalies,
        "found": rep.found, "final_positions": rep.final_positions, "reads": rep.reads,
        "client_error": summary.get("error"), "ok": rep.ok and summary.get("error") is None,
        "summary": rep.summary(),
    }
    say(f"run seed={seed}: {rep.summary()} actions={dict(actions)}")
    return out


def write_results(runs: list[dict[str, Any]], results: Path, seconds: float, standby: bool = False) -> None:
    results.mkdir(parents=True, exist_ok=True)
    stem = "nemesis-standby" if standby else "nemesis"
    doc = {"what": "randomized nemesis runs (tests/faults/nemesis.py)", "seconds_per_run": seconds,
           "standby": standby, "sequencer_auth": True, "runs": runs, "anomalies": sum(r["anomalies"] for r in runs),
           "all_ok": all(r["ok"] for r in runs)}
    (results / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    two = (" Two sequencer daemons stand by for each other (`--pool`, lease 1 s); the appenders here are "
           "told one, the client process the other, and the nemesis pauses and kills whichever serves "
           "the log." if standby else "")
    two += (" Every client authenticates with the pool's sequencer secret (authentication on, as by "
            "default; issue 27).")
    lines = ["# Nemesis runs" + (" with a standby sequencer" if standby else ""), "",
             "Every kind of appender, two following readers (one in a client process the nemesis pauses), "
             "and a nemesis that pauses and kills the sequencer, reconfigures, trims to near the tail and "
             "pauses the client process." + two + " Rerun: `.venv/bin/python tests/faults/nemesis.py "
             f"--runs 5 --seconds {seconds:.0f}{' --standby' if standby else ''}`.", "",
             "| seed | seconds | acknowledged appends | anomalies | actions | stopped in |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        acts = ", ".join(f"{k} {v}" for k, v in sorted(r["actions"].items()))
        lines.append(f"| {r['seed']} | {r['seconds']} | {r['acknowledged']} | {r['anomalies']} | {acts} | "
                     f"{r['stopped_in_s']} s |")
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1, help="seed of the first run; each run adds one")
    ap.add_argument("--conf", default=None, help="an existing cluster (default: start a dev cluster)")
    ap.add_argument("--pool", default="zlog")
    ap.add_argument("--results", type=Path, default=HERE.parent.parent / "results")
    ap.add_argument("--standby", action="store_true",
                    help="two sequencer daemons standing by for each other (results/nemesis-standby.*)")
    args = ap.parse_args(argv)
    from vstartmod import vstart

    work = Path(tempfile.mkdtemp(prefix="zlog-nemesis-"))
    cluster = None
    conf, pool = args.conf, args.pool
    if conf is None:
        cluster = vstart.Cluster(work / "cluster")
        st = cluster.start(osds=1, owner_pid=os.getpid())
        conf, pool = st["conf"], st["pool"]
    fleet = Fleet(conf, pool, work, lease=1.0, group=f"nemesis-{os.getpid()}")
    seqrs = [fleet.start(standby=args.standby) for _ in range(2 if args.standby else 1)]
    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            runs.append(run_once(conf, pool, seqrs, args.seconds, args.seed + i, work))
            write_results(runs, args.results, args.seconds, args.standby)
    finally:
        fleet.close()
        if cluster is not None:
            cluster.stop()
    print(f"{sum(r['anomalies'] for r in runs)} anomalies in {len(runs)} runs; "
          f"results in {args.results}/nemesis{'-standby' if args.standby else ''}.json")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
