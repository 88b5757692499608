"""A newer client on the previous class build (issue 22).

The object class build on main before requests gained versions (commit
PREVIOUS_CLASS, protocol 1 only) is compiled from git history and loaded
into a dev cluster of its own; then the client suite's core (tests/test_core.py
and tests/test_client.py) runs against that cluster. The client speaks
protocol 2 first, the old class answers EOPNOTSUPP, and every call goes on
in protocol 1.

The reverse (a previous client on this class build) is the class suite run
in protocol 1 (tests/test_cls_zlog.py, the hypothesis model in
tests/test_cls_model.py and tests/test_cls_malformed.py with requests built
by hand): the class serves round 2's methods and layouts unchanged.

The class build from before stripes were dealt in runs (RUNLESS_CLASS,
struct_v 2) refuses a request with a unit above 1, and a client creates its
logs there with unit 1.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import pyzlog
from pyzlog import Log
from vstartmod import ROOT, vstart

#: main before this change: the last class build without protocol 2
PREVIOUS_CLASS = "5da2450"
#: main before stripes were dealt in runs (struct_v 2: it knows no unit)
RUNLESS_CLASS = "9de0090"


def build_previous_class(out: Path, commit: str = PREVIOUS_CLASS,
                         files: tuple[str, ...] = ("cls_zlog.cc", "wire.h", "objclass_api.h"),
                         sources: tuple[str, ...] = ("cls_zlog.cc",)) -> Path:
    """libcls_zlog.so of `commit`, compiled as its CMakeLists did."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git history of a checkout")
    src = out / "src"
    src.mkdir()
    for name in files:
        p = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:cls_zlog/{name}"],
                           capture_output=True, timeout=60)
        if p.returncode != 0:
            pytest.skip(f"commit {commit} is not in this checkout's history "
                        f"({p.stderr.decode(errors='replace').strip()})")
        (src / name).write_bytes(p.stdout)
    lib = out / "libcls_zlog.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wno-unused-parameter",
                    "-DZLOG_MAX_ENTRY_BYTES=1048576", "-o", str(lib), *(str(src / s) for s in sources)],
                   check=True, capture_output=True, timeout=300)
    return lib


def _cluster_with(d: Path, lib: Path) -> Iterator[str]:
    c = vstart.Cluster(d / "cluster")
    try:
        st = c.start(osds=1, cls_lib=lib, owner_pid=os.getpid())
        yield str(st["conf"])
    finally:
        c.stop()


@pytest.fixture(scope="module")
def old_class_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("oldcls")
    yield from _cluster_with(d, build_previous_class(d))


@pytest.fixture(scope="module")
def runless_class_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("runless")
    yield from _cluster_with(d, build_previous_class(
        d, RUNLESS_CLASS, ("cls_zlog.cc", "store.cc", "store.h", "ops.h", "objclass_api.h"),
        ("cls_zlog.cc", "store.cc")))


def test_a_class_without_runs_refuses_a_unit_and_logs_are_made_with_unit_1(runless_class_cluster: str) -> None:
    """A cluster whose OSDs still run the class build from before runs (in
    the middle of a rolling upgrade): it refuses a request with a unit
    (compat_v 3) instead of taking it for unit 1, so Log.create makes the
    log with unit 1, which that class keeps, and the log works."""
    from pyzlog.core import wire
    from pyzlog.core.native import Connection, Op

    cluster = pyzlog.connect(runless_class_cluster)
    try:
        conn = Connection.of(cluster)
        pool = conn.pool("zlog")
        oid = f"runs-{uuid.uuid4().hex[:8]}"
        code, _ = conn.call_raw(pool, oid, Op.INIT, epoch=1, position=0, width=4, slots=1024, byte_bound=1 << 20,
                                unit=128, format=wire.FORMAT_DATA)
        assert code == -errno.EPROTONOSUPPORT
        code, _ = conn.call_raw(pool, oid, Op.INIT, epoch=1, position=0, width=4, slots=1024, byte_bound=1 << 20,
                                unit=1, format=wire.FORMAT_DATA)
        assert code == 0
        log = Log.create(cluster, "zlog", f"compat-{uuid.uuid4().hex[:8]}", width=3)
        v = log.views[-1]
        assert (v.format, v.unit, log.state.data.protocol) == (wire.FORMAT_DATA, 1, wire.PROTOCOL)
        entries = [b"e%d" % i for i in range(300)]
        assert log.append_many(entries) == list(range(300))
        assert [r.data for r in log.stream(0)] == entries
        assert log.reconfigure(2).unit == 1
        log.close()
    finally:
        cluster.shutdown()


def test_the_client_falls_back_to_protocol_1(old_class_cluster: str) -> None:
    cluster = pyzlog.connect(old_class_cluster)
    try:
        log = Log.create(cluster, "zlog", f"compat-{uuid.uuid4().hex[:8]}", width=3)
        # the old class answered EOPNOTSUPP to meta_create2: the metadata namespace speaks 1 now,
        assert log.state.meta_store.pool.protocol == 1
        positions = log.append_many([b"a", b"b", b"c"])
        assert log.state.data.protocol == 1  # and so do the data objects, after their first call
        assert [log.read(p) for p in positions] == [b"a", b"b", b"c"]
        assert [r.data for r in log.stream(0)] == [b"a", b"b", b"c"]
        log.close()
    finally:
        cluster.shutdown()


def test_the_client_suite_core_passes_on_the_previous_class(old_class_cluster: str) -> None:
    env = dict(os.environ, ZLOG_TEST_CONF=old_class_cluster, ZLOG_TEST_POOL="zlog")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_core.py",
                        "tests/test_client.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert " passed" in p.stdout and "failed" not in p.stdout
