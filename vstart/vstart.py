#!/usr/bin/env python3
"""A real single-machine Ceph dev cluster for pyzlog, from Debian's Ceph packages.

    vstart.py start  [--dir D] [--osds N] [--bluestore] [--pool P] [--cls-lib PATH] [--no-mgr]
                     [--sanitize-osds]
    vstart.py status [--dir D]
    vstart.py stop   [--dir D]
    vstart.py osd-stop ID [--signal KILL] / osd-start ID   (for fault tests)

One mon, one mgr (usage figures, pool quotas), N OSDs (memstore by default: fast, but a killed
OSD loses its data; --bluestore gives file-backed OSDs that survive a kill),
cephx on, cls_zlog loaded, one pool for logs. Every daemon writes its pid file
under DIR/run; `stop` signals exactly those pids and nothing else.

Standard library only, so it runs before anything else is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "run" / "cluster"
SYSTEM_CLASS_DIR = Path("/usr/lib/x86_64-linux-gnu/rados-classes")
STATE_FILE = "cluster.json"
# One op shard (one op thread) on memstore: Ceph 16.2's MemStore keeps its
# used-bytes count in a plain integer that the op threads of different shards
# update at once (made atomic upstream in ceph PR 41914, after 16.2.15). With
# two shards, updates were lost (4 in 18,812 appends spread over placement
# groups): once a workload's objects were removed, the count fell below zero,
# the OSD reported 16 EiB used and full, and every write was refused until the
# cluster restarted. BlueStore counts its own way and keeps two shards.
MEMSTORE_OP_SHARDS = 1


class ClusterError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"({e})"


def _run(cmd: list[str], timeout: float = 60, check: bool = True, env: dict[str, str] | None = None) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
    if check and p.returncode != 0:
        raise ClusterError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.strip()}")
    return p.stdout


def _find_cls_lib() -> Path:
    """The built libcls_zlog.so: installed inside the pyzlog package."""
    try:
        import pyzlog

        for d in pyzlog.__path__:  # the source folder first when run from a checkout
            p = Path(d) / "cls" / "libcls_zlog.so"
            if p.exists():
                return p
    except ImportError:
        pass
    raise ClusterError("libcls_zlog.so not found: build with `pip install .` or pass --cls-lib")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    state = _stat_state(f"/proc/{pid}/stat")
    return state is not None and state != "Z"


def _stat_state(path: str) -> str | None:
    """The state letter of a /proc stat file (a process's or a thread's);
    None if it is gone."""
    try:
        with open(path) as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _owned_pid(pidfile: Path, conf: Path) -> int | None:
    """The pid in `pidfile` if that process is a Ceph daemon of this cluster."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if str(conf).encode() not in cmdline:
        return None  # pid reused by something that is not ours
    return pid


def sanitizer_env(reports: Path) -> dict[str, str]:
    """The environment of an OSD that loads a class built with ASan + UBSan
    (ZLOG_SANITIZE=1): ceph-osd is not sanitized (and links no tcmalloc on
    Debian), so libasan is preloaded; each process writes its reports to
    REPORTS/asan.PID and REPORTS/ubsan.PID. Leaks are not looked for: Ceph
    keeps memory to exit, and the class allocates nothing that outlives a call."""
    lib = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(lib):
        raise ClusterError("g++ does not know libasan.so: install g++ with its sanitizer runtimes")
    reports.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "LD_PRELOAD": lib,
            "ASAN_OPTIONS": f"detect_leaks=0:halt_on_error=1:log_path={reports}/asan",
            "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={reports}/ubsan"}


class Cluster:
    def __init__(self, directory: Path) -> None:
        self.dir = directory.resolve()
        self.conf = self.dir / "ceph.conf"
        self.run_dir = self.dir / "run"
        self.log_dir = self.dir / "log"
        #: OSDs run with libasan preloaded (a sanitized class): kept in cluster.json for restarts
        self.sanitize_osds = bool((self.state() or {}).get("sanitize_osds"))
        self.sanitizer_reports = self.log_dir / "sanitize"

    # ------------------------------------------------------------------ state
    def state(self) -> dict | None:
        try:
            return json.loads((self.dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None

    def daemons(self) -> dict[str, int]:
        """name -> pid of every live daemon this cluster started."""
        out: dict[str, int] = {}
        if not self.run_dir.exists():
            return out
        for pidfile in sorted(self.run_dir.glob("*.pid")):
            pid = _owned_pid(pidfile, self.conf)
            if pid is not None:
                out[pidfile.stem] = pid
        return out

    def ceph(self, *args: str, timeout: float = 30) -> str:
        return _run(["ceph", "-c", str(self.conf), "--connect-timeout", "15", *args], timeout=timeout)

    # ------------------------------------------------------------------ start
    def start(self, osds: int = 1, bluestore: bool = False, pool: str = "zlog",
              cls_lib: Path | None = None, mgr: bool = True, pg_num: int = 16,
              owner_pid: int | None = None, sanitize_osds: bool = False) -> dict:
        """Start the cluster. With `owner_pid`, a watcher process stops it when
        that process is gone, even if it was killed before it could clean up
        (a test run killed by a timeout, say). With `sanitize_osds`, the OSDs
        preload libasan, to load a `cls_lib` built with the sanitizers
        (sanitizer_env; their reports go to log/sanitize)."""
        st = self.state()
        if st and self.daemons():
            if len(self.daemons()) >= 1 + st["osds"]:
                return st  # already running: starting twice is safe
            self.stop()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        for d in (self.dir, self.run_dir, self.log_dir, self.dir / "classes"):
            d.mkdir(parents=True, exist_ok=True)
        self.sanitize_osds = sanitize_osds

        lib = (cls_lib or _find_cls_lib()).resolve()
        if not lib.exists():
            raise ClusterError(f"object class library not found: {lib}")
        # The OSD loads classes from one directory: ours plus Ceph's own.
        classes = self.dir / "classes"
        if SYSTEM_CLASS_DIR.exists():
            for so in SYSTEM_CLASS_DIR.glob("*.so"):
                (classes / so.name).symlink_to(so)
        shutil.copy2(lib, classes / "libcls_zlog.so")

        fsid = str(uuid.uuid4())
        port = _free_port()
        size = min(osds, 3)
        self._write_conf(fsid, port, bluestore, size, min(size, 2) if size >= 3 else 1)
        keyring = self.dir / "keyring"
        _run(["ceph-authtool", "--create-keyring", str(keyring), "--gen-key", "-n", "mon.",
              "--cap", "mon", "allow *"])
        _run(["ceph-authtool", str(keyring), "--gen-key", "-n", "client.admin",
              "--cap", "mon", "allow *", "--cap", "osd", "allow *",
              "--cap", "mgr", "allow *", "--cap", "mds", "allow *"])
        monmap = self.dir / "monmap"
        _run(["monmaptool", "--create", "--fsid", fsid, "--addv", "a",
              f"[v2:127.0.0.1:{port}]", str(monmap)])
        _run(["ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a", "--monmap", str(monmap),
              "--keyring", str(keyring)])
        _run(["ceph-mon", "-c", str(self.conf), "-i", "a"])

        if mgr:
            mgr_dir = self.dir / "mgr.x"
            mgr_dir.mkdir()
            self.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd", "allow *",
                      "mds", "allow *", "-o", str(mgr_dir / "keyring"))
            _run(["ceph-mgr", "-c", str(self.conf), "-i", "x"])

        for i in range(osds):
            self._create_osd(i, bluestore)
        for i in range(osds):
            self.start_osd(i)

        self.ceph("osd", "pool", "create", pool, str(pg_num), str(pg_num))
        self.ceph("osd", "pool", "application", "enable", pool, "zlog")
        st = {"conf": str(self.conf), "keyring": str(keyring), "pool": pool, "osds": osds,
              "bluestore": bluestore, "mon_port": port, "fsid": fsid, "sanitize_osds": sanitize_osds}
        (self.dir / STATE_FILE).write_text(json.dumps(st, indent=2))
        if owner_pid is not None:
            self._start_watcher(owner_pid)
        self.wait_ready(pool)
        return st

    def _start_watcher(self, owner_pid: int) -> None:
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--dir", str(self.dir), "watch",
                          str(owner_pid)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)

    def watch(self, owner_pid: int, interval: float = 1.0) -> None:
        """Stop the cluster once `owner_pid` is gone; return early if the
        cluster was stopped some other way."""
        while _pid_alive(owner_pid):
            time.sleep(interval)
            if not self.daemons():
                return
        self.stop()

    def _write_conf(self, fsid: str, port: int, bluestore: bool, size: int, min_size: int) -> None:
        d = self.dir
        store = (
            "osd objectstore = bluestore\nbluestore block create = true\n"
            "bluestore block size = 4294967296\nbluestore fsck on mount = false\n"
            "bluestore cache size = 268435456\n"
            if bluestore else
            # page sets: an object's data in 64 KiB pages. Without them memstore keeps
            # an object as one bufferlist that each write splits further, so a write
            # to a data-format object costs more the more entries it already holds.
            "osd objectstore = memstore\nmemstore device bytes = 8589934592\nmemstore page set = true\n"
        )
        shards = 2 if bluestore else MEMSTORE_OP_SHARDS
        self.conf.write_text(f"""[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{port}]
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon cluster log file = {d}/log/cluster.log
mon data = {d}/$name
osd data = {d}/$name
mgr data = {d}/$name
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
osd pool default size = {size}
osd pool default min size = {min_size}
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd class dir = {d}/classes
osd class load list = *
osd class default list = *
{store}osd op num shards = {shards}
osd op num threads per shard = 1
osd memory target = 1073741824
osd heartbeat grace = 8
osd heartbeat interval = 2
mon osd down out interval = 0
[mon]
# daemons only: a client's admin socket would clash with every other client's
admin socket = {d}/run/$name.asok
[osd]
keyring = {d}/$name/keyring
admin socket = {d}/run/$name.asok
[mgr]
keyring = {d}/$name/keyring
admin socket = {d}/run/$name.asok
mgr disabled modules = dashboard prometheus restful
# usage reaches the mon within seconds: pool quotas and `ceph df` follow writes closely
mgr stats period = 1
mgr tick period = 1
""")

    def _create_osd(self, i: int, bluestore: bool) -> None:
        osd_uuid = str(uuid.uuid4())
        got = self.ceph("osd", "new", osd_uuid).strip()
        if got != str(i):
            raise ClusterError(f"expected osd.{i}, the mon made osd.{got}")
        osd_dir = self.dir / f"osd.{i}"
        osd_dir.mkdir()
        key = osd_dir / "keyring"
        _run(["ceph-authtool", "--create-keyring", str(key), "--gen-key", "-n", f"osd.{i}"])
        self.ceph("auth", "add", f"osd.{i}", "osd", "allow *", "mon", "allow profile osd",
                  "mgr", "allow profile osd", "-i", str(key))
        _run(["ceph-osd", "-c", str(self.conf), "-i", str(i), "--mkfs", "--osd-uuid", osd_uuid],
             timeout=120)

    # ------------------------------------------------------------ OSD control
    def start_osd(self, i: int) -> None:
        # A just-killed OSD can hold its pid file or its store's lock for a
        # moment while the kernel tears it down (the store's lock failure is
        # only in the OSD's log, with exit status 250): retry briefly. A start
        # that fails leaves no process behind.
        deadline = time.monotonic() + 20
        env = sanitizer_env(self.sanitizer_reports) if self.sanitize_osds else None
        while True:
            try:
                _run(["ceph-osd", "-c", str(self.conf), "-i", str(i)], timeout=60, env=env)
                return
            except ClusterError as e:
                if time.monotonic() > deadline:
                    raise ClusterError(f"{e}\nlast lines of {self.log_dir / f'osd.{i}.log'}:\n"
                                       + _tail(self.log_dir / f"osd.{i}.log")) from e
                time.sleep(0.5)

    def stop_osd(self, i: int, sig: int = signal.SIGTERM) -> None:
        pid = self.daemons().get(f"osd.{i}")
        if pid is None:
            raise ClusterError(f"osd.{i} is not running")
        if sig == signal.SIGSTOP:
            pause(pid)
            return
        os.kill(pid, sig)
        if sig == signal.SIGCONT:
            return
        _wait_gone([pid], 30)

    def wait_ready(self, pool: str, timeout: float = 60) -> None:
        """Until a real write to the pool succeeds: PGs active, OSDs up."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                _run(["rados", "-c", str(self.conf), "-p", pool, "put", "vstart.probe", "/dev/null"],
                     timeout=10)
                _run(["rados", "-c", str(self.conf), "-p", pool, "rm", "vstart.probe"], timeout=10)
                return
            except ClusterError as e:
                last = str(e)
                time.sleep(0.5)
        raise ClusterError(f"cluster not ready after {timeout:.0f}s: {last}\nlogs: {self.log_dir}")

    # ------------------------------------------------------------------- stop
    def stop(self) -> list[str]:
        running = self.daemons()
        for pid in running.values():
            try:
                os.kill(pid, signal.SIGCONT)  # a paused daemon cannot handle SIGTERM
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        left = _wait_gone(list(running.values()), 15)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(left, 10)
        return sorted(running)

    def status(self) -> dict:
        st = self.state() or {}
        return {"dir": str(self.dir), "conf": str(self.conf) if st else None,
                "pool": st.get("pool"), "daemons": self.daemons()}


def pause(pid: int, timeout: float = 10) -> None:
    """SIGSTOP `pid` and return once every one of its threads is stopped.

    kill() only queues the stop: a thread running on another CPU goes on for a
    moment, long enough on a loaded machine to answer a request sent right after
    (a test that expects a paused OSD to answer nothing then sees an answer)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_threads_stopped(pid):
        if time.monotonic() > deadline:
            raise ClusterError(f"pid {pid} not stopped {timeout:g}s after SIGSTOP")
        time.sleep(0.001)


def _all_threads_stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone: nothing of it runs
    # (None: a thread that exited meanwhile)
    return all(_stat_state(f"/proc/{pid}/task/{tid}/stat") in ("T", "t", "Z", "X", None) for tid in tids)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _pid_alive(p)]
    return left


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pyzlog's single-machine Ceph dev cluster")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("ZLOG_VSTART_DIR", DEFAULT_DIR)),
                    help="cluster directory (default: %(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start a cluster (a no-op if it is running)")
    s.add_argument("--osds", type=int, default=1)
    s.add_argument("--bluestore", action="store_true", help="file-backed OSDs (survive kill -9)")
    s.add_argument("--pool", default="zlog")
    s.add_argument("--cls-lib", type=Path, default=None, help="libcls_zlog.so to load")
    s.add_argument("--sanitize-osds", action="store_true",
                   help="preload libasan into the OSDs, to load a --cls-lib built with ZLOG_SANITIZE=1 "
                        "(reports in DIR/log/sanitize)")
    s.add_argument("--no-mgr", dest="mgr", action="store_false",
                   help="run no ceph-mgr (then `ceph df` shows no usage and pool quotas are not enforced)")
    sub.add_parser("status", help="show the daemons and config")
    sub.add_parser("stop", help="stop every daemon this cluster started")
    w = sub.add_parser("watch", help="stop the cluster when process PID is gone")
    w.add_argument("pid", type=int)
    for name in ("osd-start", "osd-stop"):
        o = sub.add_parser(name)
        o.add_argument("id", type=int)
        if name == "osd-stop":
            o.add_argument("--signal", default="TERM", choices=["TERM", "KILL", "STOP", "CONT"])
    args = ap.parse_args(argv)
    c = Cluster(args.dir)
    try:
        if args.cmd == "start":
            t0 = time.monotonic()
            st = c.start(args.osds, args.bluestore, args.pool, args.cls_lib, args.mgr,
                         sanitize_osds=args.sanitize_osds)
            print(f"cluster up in {time.monotonic() - t0:.1f}s: {len(c.daemons())} daemons")
            print(f"  ceph.conf: {st['conf']}\n  pool:      {st['pool']}")
            print(f"  use it:    export CEPH_CONF={st['conf']}")
        elif args.cmd == "status":
            st = c.status()
            print(json.dumps(st, indent=2))
            return 0 if st["daemons"] else 3
        elif args.cmd == "stop":
            stopped = c.stop()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.cmd == "watch":
            c.watch(args.pid)
        elif args.cmd == "osd-start":
            c.start_osd(args.id)
        elif args.cmd == "osd-stop":
            c.stop_osd(args.id, getattr(signal, "SIG" + args.signal))
    except ClusterError as e:
        print(f"vstart: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
