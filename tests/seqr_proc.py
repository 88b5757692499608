"""Run zlog-seqr as a real subprocess for tests; always killed by its pid."""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vstartmod import vstart


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the test process dies, even by kill -9."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SeqrProcess:
    """zlog-seqr serving `pool` with authentication on (the default); with no
    --pool (or --insecure) in `args` it serves `pool` without standing by."""

    def __init__(self, conf: str, port: int | None = None, log_path: Path | None = None,
                 args: tuple[str, ...] = (), pool: str | None = None) -> None:
        self.conf = conf
        pool = pool or os.environ.get("ZLOG_TEST_POOL", "zlog")
        if "--pool" not in args and "--insecure" not in args:
            args = ("--pool", pool, "--no-standby", *args)
        self.args = args  # more zlog-seqr options, e.g. ("--pool", "zlog", "--lease", "1")
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "SeqrProcess":
        exe = shutil.which("zlog-seqr", path=str(Path(sys.executable).parent)) or "zlog-seqr"
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # type: ignore[assignment]
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--conf", self.conf, *self.args],
                                     stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zlog-seqr exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("zlog-seqr did not start listening")

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode if self.proc else None

    def stop(self) -> int | None:
        return self.kill(signal.SIGTERM)

    def pause(self) -> None:
        assert self.proc is not None
        vstart.pause(self.proc.pid)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


class Fleet:
    """zlog-seqr daemons standing by for each other on `pool` (`group` None:
    the default group, which clients discover). close() stops every one."""

    def __init__(self, conf: str, pool: str, logdir: Path, lease: float, group: str | None = None) -> None:
        self.conf, self.pool, self.logdir, self.lease, self.group = conf, pool, logdir, lease, group
        self.started: list[SeqrProcess] = []

    def start(self, standby: bool = True) -> SeqrProcess:
        args: tuple[str, ...] = ()
        if standby:
            args = ("--pool", self.pool, "--lease", str(self.lease))
            args += ("--group", self.group) if self.group else ()
        p = SeqrProcess(self.conf, log_path=self.logdir / f"seqr{len(self.started)}.log", args=args,
                        pool=self.pool).start()
        self.started.append(p)
        return p

    def close(self) -> None:
        for p in self.started:
            if p.proc and p.proc.poll() is None:
                p.resume()
                p.stop()


def _served(ceph: Any, folder: Path) -> Iterator[SeqrProcess]:
    p = SeqrProcess(ceph.conf, log_path=folder / "seqr.log").start()
    try:
        yield p
    finally:
        p.kill()  # SIGKILL: also one a test left paused (SIGSTOP)


@pytest.fixture
def seqr(ceph: Any, tmp_path: Path) -> Iterator[SeqrProcess]:
    """A zlog-seqr serving the test pool, for one test (conftest offers it to every file)."""
    yield from _served(ceph, tmp_path)


@pytest.fixture(scope="module", name="seqr")
def module_seqr(ceph: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeqrProcess]:
    """The same, for a whole test file: `from seqr_proc import module_seqr` there."""
    yield from _served(ceph, tmp_path_factory.mktemp("seqr"))
