"""examples/kv_service.py: three processes serving one replicated key-value
store over HTTP. Writes through one are read through the others, a CAS race
across all three has one winner, a process killed -9 and started again
catches up from the checkpoint, and at the end all three hold the same
store."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from seqr_proc import SeqrProcess, _die_with_parent, free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kv_service.py"


class Node:
    def __init__(self, conf: str, pool: str, log: str, seqr: str, out: Path, create: bool = False) -> None:
        self.port = free_port()
        self.args = [sys.executable, "-P", str(EXAMPLE), "--conf", conf, "--pool", pool, "--log", log,
                     "--seqr", seqr, "--port", str(self.port)] + (["--create"] if create else [])
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=open(self.out / f"kv-{self.port}-{time.time_ns()}.out", "wb"),
                                     stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"kv_service exited with {self.proc.returncode}"
            try:
                self.call("GET", "/admin/health")
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("kv_service did not answer")

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(30)


@pytest.fixture
def nodes(ceph, log_name, tmp_path):  # type: ignore[no-untyped-def]
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log").start()
    first = Node(ceph.conf, ceph.pool, log_name, seqr.address, tmp_path, create=True)
    ns = [first] + [Node(ceph.conf, ceph.pool, log_name, seqr.address, tmp_path) for _ in range(2)]
    yield ns
    for n in ns:
        n.kill(signal.SIGTERM)
    seqr.kill()


def test_three_processes_serve_one_store(nodes: list[Node]) -> None:
    a, b, c = nodes
    assert a.call("PUT", "/kv/greeting", "hello")[0] == 200
    assert b.call("GET", "/kv/greeting")[1]["value"] == "hello"  # a linearizable read elsewhere
    assert c.call("PUT", "/kv/config", {"replicas": 3, "tags": ["x", "y"]})[0] == 200
    assert a.call("GET", "/kv/config")[1]["value"] == {"replicas": 3, "tags": ["x", "y"]}
    assert b.call("GET", "/kv/nope")[0] == 404
    assert c.call("POST", "/kv/greeting/cas", {"expected": "nope", "new": "x"})[1] == {"ok": False}
    assert a.call("PUT", "/kv/bad", None)[0] == 200  # a JSON null is a value
    assert a.call("POST", "/kv/x/cas", ["not", "an", "object"])[0] == 400
    assert a.call("GET", "/nowhere")[0] == 404

    # a CAS race on one key from all three: exactly one wins
    results: list[bool] = []
    lock = threading.Lock()

    def race(n: Node, i: int) -> None:
        ok = n.call("POST", "/kv/leader/cas", {"expected": None, "new": f"node-{i}"})[1]["ok"]
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=race, args=(n, i)) for i, n in enumerate(nodes) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [False] * 8 + [True]
    leader = a.call("GET", "/kv/leader")[1]["value"]
    assert all(n.call("GET", "/kv/leader")[1]["value"] == leader for n in nodes)

    # checkpoint, more writes, then a process killed and started again catches up
    assert a.call("POST", "/admin/checkpoint")[0] == 200
    for i in range(20):
        nodes[i % 3].call("PUT", f"/kv/k{i}", i)
    b.kill()
    assert a.call("DELETE", "/kv/k0")[1] == {"deleted": True}
    b.start()
    health = b.call("GET", "/admin/health")[1]
    assert health["stats"]["reloads"] == 1  # it started from the checkpoint
    stores = [n.call("GET", "/kv")[1] for n in nodes]
    assert stores[0] == stores[1] == stores[2]
    assert "k0" not in stores[0] and stores[0]["k19"] == 19 and len(stores[0]) == 4 + 19
