"""Fault 5: Ceph's own message fault injection (socket failures and delays on
the OSD, the mon and the client) while several clients append."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyzlog
from pyzlog import Log

from faultlib import Workload, final_scan
from history import History

SOCKET_FAILURES = 500  # one in N socket reads/writes fails
ON = {"osd": {"ms_inject_socket_failures": str(SOCKET_FAILURES), "ms_inject_delay_type": "client",
              "ms_inject_delay_max": "0.005", "ms_inject_delay_probability": "0.05"},
      "mon": {"ms_inject_socket_failures": str(SOCKET_FAILURES)}}
#: Injection into the test's own librados client (conf_set on the live handle)
#: once crashed the pytest process (SIGSEGV in a librados thread), most likely
#: the GC-freed-completion bug fixed in pyzlog.core.objects (_busy): since that fix
#: 4 of 4 runs with it passed. It stays opt-in until it has a longer record;
#: the OSD and mon injections break the client's connections too.
#: ZLOG_FAULT_CLIENT_INJECT=1 turns it on (socket failures only).
CLIENT_ON = ({"ms_inject_socket_failures": str(SOCKET_FAILURES)}
             if os.environ.get("ZLOG_FAULT_CLIENT_INJECT") == "1" else {})
#: off again: no socket failures, and delays with probability 0 (the delay
#: type and size are left alone, not changed under live connections)
OFF = {"ms_inject_socket_failures": "0", "ms_inject_delay_probability": "0"}
APPEND_SECONDS = 10


def _injectargs(conf: str, target: str, opts: dict[str, str]) -> None:
    """`ceph tell <target> injectargs` (runtime; Ceph 16 reads these options
    on each use, "not observed" in its answer notwithstanding)."""
    args = [f"--{k}={v}" for k, v in opts.items()]
    cmd = ["ceph", "-c", conf, "--connect-timeout", "15", "tell", target, "injectargs", " ".join(args)]
    last = ""
    for _ in range(5):  # the mon's own socket failures can cut the command short
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            last = "timed out"
            continue
        if p.returncode == 0:
            return
        last = p.stderr.strip()
        time.sleep(1)
    raise AssertionError(f"{' '.join(cmd)} failed: {last}")


def _injected(log_dir: Path | None) -> int | None:
    if log_dir is None:
        return None
    n = 0
    for f in log_dir.glob("*.log"):
        with open(f, errors="replace") as fh:
            n += sum(1 for line in fh if "injecting socket failure" in line)
    return n


def test_messenger_socket_failures_and_delays(rados_cluster, ceph, log_name, seqr,  # type: ignore[no-untyped-def]
                                              fault_report) -> None:
    log_dir = ceph.dir / "log" if ceph.dir else None
    before = _injected(log_dir)
    # the session's client unless client-side injection is asked for (a handle of its own)
    r = pyzlog.connect(ceph.conf, op_timeout=30) if CLIENT_ON else rados_cluster
    Log.create(r, ceph.pool, log_name, width=4).close()
    h = History()
    w = Workload(h, r, ceph.pool, log_name, sequencer=seqr.address, appenders=4, hole_wait=1.0,
                 async_window=32)
    try:
        _injectargs(ceph.conf, "osd.*", ON["osd"])
        _injectargs(ceph.conf, "mon.*", ON["mon"])
        for k, v in CLIENT_ON.items():
            r.conf_set(k, v)
        w.start()
        time.sleep(APPEND_SECONDS)
        w.stop()
    finally:
        if r is not rados_cluster:
            r.shutdown()
        _injectargs(ceph.conf, "mon.*", {"ms_inject_socket_failures": "0"})
        _injectargs(ceph.conf, "osd.*", OFF)
    after = _injected(log_dir)
    injected = None if before is None or after is None else after - before
    final = final_scan(rados_cluster, ceph.pool, log_name)  # a client without injected faults
    rep = fault_report(f"messenger: socket failures 1/{SOCKET_FAILURES} + delays", h, final,
                       injected_socket_failures=injected)
    assert rep.acknowledged > 100
    assert w.async_acked() > 50
    assert rep.ok, rep.summary()
