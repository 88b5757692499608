"""Least-privilege cephx caps for pyzlog clients (docs/deploy.md), on the dev
cluster: clients made with `ceph auth get-or-create` by the admin."""
from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pyzlog
from pyzlog import Log, PermissionDenied


@pytest.fixture
def client_with(ceph, tmp_path: Path) -> Iterator[Callable[[str], object]]:  # type: ignore[no-untyped-def]
    """client_with(osd_caps) -> a connected cluster handle for a new client."""
    made: list[tuple[str, object]] = []

    def make(osd_caps: str) -> object:
        name = f"client.t{uuid.uuid4().hex[:8]}"
        keyring = tmp_path / f"{name}.keyring"
        subprocess.run(["ceph", "-c", ceph.conf, "auth", "get-or-create", name, "mon", "allow r",
                        "osd", osd_caps, "-o", str(keyring)], check=True, capture_output=True, timeout=60)
        cluster = pyzlog.connect(ceph.conf, client=name, keyring=str(keyring))
        made.append((name, cluster))
        return cluster

    yield make
    for name, cluster in made:
        cluster.shutdown()  # type: ignore[attr-defined]
        subprocess.run(["ceph", "-c", ceph.conf, "auth", "del", name], capture_output=True, timeout=60)


@pytest.mark.parametrize("caps", ["allow rwx pool={pool}", "allow rw class-read class-write pool={pool}"])
def test_documented_caps_do_everything(client_with, ceph, log_name, caps) -> None:  # type: ignore[no-untyped-def]
    cluster = client_with(caps.format(pool=ceph.pool))
    with Log.create(cluster, ceph.pool, log_name, width=2) as log:
        assert log.append(b"a") == 0
        futs = [log.append_async(b"x%d" % i) for i in range(50)]
        positions = [f.result(30) for f in futs]
        assert sorted(positions) == list(range(1, 51))
        assert log.read(0) == b"a" and log.read_async(positions[7]).result(30) == b"x7"
        log.fill(60)
        log.trim(0)
        kinds = [r.kind for r in log.stream(0, 51)]
        assert kinds == [pyzlog.RecordKind.TRIMMED] + [pyzlog.RecordKind.DATA] * 50
        log.reconfigure(3)
        assert log.append(b"after") == 61
    assert log_name in Log.list(cluster, ceph.pool)


def test_caps_on_another_pool_are_refused(client_with, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    cluster = client_with("allow rwx pool=some-other-pool")
    with pytest.raises(PermissionDenied, match=r"lack 'r'"):
        Log.create(cluster, ceph.pool, log_name)


def test_no_class_access_names_class_read(client_with, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    Log.create(rados_cluster, ceph.pool, log_name).close()
    cluster = client_with(f"allow rw pool={ceph.pool}")
    with pytest.raises(PermissionDenied, match=r"zlog\.meta_get2? .*lack 'class-read'.*allow rwx pool="):
        Log.open(cluster, ceph.pool, log_name)
    with pytest.raises(PermissionDenied, match=r"zlog\.meta_create2? .*lack 'class-read'"):
        Log.create(cluster, ceph.pool, log_name + "-x")


def test_read_only_caps_read_but_cannot_write(client_with, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    with Log.create(rados_cluster, ceph.pool, log_name) as log:
        log.append(b"kept")
    cluster = client_with(f"allow r class-read pool={ceph.pool}")
    with Log.open(cluster, ceph.pool, log_name) as ro:
        assert ro.read(0) == b"kept"
        with pytest.raises(PermissionDenied, match=r"zlog\.write2? .*lack 'w'"):
            ro.append(b"refused")
    with pytest.raises(PermissionDenied, match=r"zlog\.meta_create2? .*lack 'w'"):
        Log.create(cluster, ceph.pool, log_name + "-x")


def test_class_read_without_class_write_names_class_write(client_with, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    cluster = client_with(f"allow rw class-read pool={ceph.pool}")
    with pytest.raises(PermissionDenied, match=r"zlog\.meta_create2? .*lack 'class-write'"):
        Log.create(cluster, ceph.pool, log_name)
