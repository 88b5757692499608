"""The Docker test bed itself (docker/cluster.py): image tags by input hash,
the apt sources it builds from, and a bluestore cluster brought up and
removed with the one command: 3 OSD hosts in CRUSH, pool size 3 /
min_size 2, cephx, both sequencers, data kept across an OSD host restart,
and `stop` removing exactly its own containers and network.

The network faults themselves are in tests/faults/test_net_faults.py.
"""
from __future__ import annotations

import base64
import ipaddress
import json
import os
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import pyzlog
from pyzlog import _seqr  # type: ignore[attr-defined]
from pyzlog import Log

from dockermod import ROOT, dcluster

SCRIPT = ROOT / "docker" / "cluster.py"


# ------------------------------------------------------------ no Docker needed
def test_debian_sources_both_formats(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\n# a comment\nURIs: http://mirror.example/debian\n"
                      "Suites: bookworm bookworm-updates\nComponents: main contrib\n"
                      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
                      "Types: deb\nURIs: http://mirror.example/debian-security\n"
                      "Suites: bookworm-security\nComponents: main\n\n"
                      "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n")
    oneline = tmp_path / "other.list"
    oneline.write_text("# deb http://commented.example/debian bookworm main\n"
                       "deb [arch=amd64 signed-by=/k.gpg] http://x.example/node nodistro main\n"
                       "deb http://old.example/debian bullseye main\n"
                       "deb [trusted=yes] http://y.example/debian bookworm-backports main non-free\n")
    got = dcluster.debian_sources([deb822, oneline])
    assert [(s.uri, s.suite) for s in got] == [
        ("http://mirror.example/debian", "bookworm"), ("http://mirror.example/debian", "bookworm-updates"),
        ("http://mirror.example/debian-security", "bookworm-security"),
        ("http://y.example/debian", "bookworm-backports")]
    assert dcluster.debian_mirror(got) == "http://mirror.example/debian"
    with pytest.raises(dcluster.DockerError, match="no Debian bookworm"):
        dcluster.debian_mirror([s for s in got if s.suite != "bookworm"])


def test_source_hash_follows_every_wheel_input(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "CMakeLists.txt"):
        (tmp_path / name).write_text("x")
    for d in ("pyzlog", "cls_zlog", "seqr", "appender"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.txt").write_text("a")
    first = dcluster.source_hash(tmp_path)
    (tmp_path / "pyzlog" / "__pycache__").mkdir()
    (tmp_path / "pyzlog" / "__pycache__" / "a.pyc").write_bytes(b"junk")
    (tmp_path / "README.md").write_text("not an input")
    assert dcluster.source_hash(tmp_path) == first
    (tmp_path / "cls_zlog" / "a.txt").write_text("b")
    second = dcluster.source_hash(tmp_path)
    assert second != first
    (tmp_path / "cls_zlog" / "a.txt").rename(tmp_path / "cls_zlog" / "b.txt")
    assert dcluster.source_hash(tmp_path) not in (first, second)


def test_stale_docker_pid_files_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """A dockerd killed outright leaves its containerd's pid file; once that
    pid names another process, a new dockerd waits for it and fails."""
    me = Path("/proc/self/comm").read_text().strip()
    reused, live, dead, junk = (tmp_path / n for n in ("reused.pid", "live.pid", "dead.pid", "junk.pid"))
    reused.write_text(f"{os.getpid()}\n")  # a running process, not a containerd
    live.write_text(f"{os.getpid()}\n")
    dead.write_text("999999999\n")
    junk.write_text("not a pid")
    files = ((reused, "containerd"), (live, me), (dead, "dockerd"), (junk, "dockerd"), (tmp_path / "none", "x"))
    assert dcluster.clear_stale_pid_files(files) == [str(reused), str(dead)]
    assert not reused.exists() and not dead.exists() and live.exists() and junk.exists()


def test_cephx_key_is_well_formed() -> None:
    raw = base64.b64decode(dcluster.cephx_key())
    kind, _sec, _nsec, length = struct.unpack("<HIIH", raw[:12])
    assert (kind, length, len(raw)) == (1, 16, 28)
    assert dcluster.cephx_key() != dcluster.cephx_key()


# ------------------------------------------------------------------ with Docker
@pytest.fixture(scope="module")
def images() -> Any:
    if os.environ.get("ZLOG_DOCKER_TESTS", "1") == "0":
        pytest.skip("ZLOG_DOCKER_TESTS=0: the Docker tests are left out")
    try:
        dcluster.ensure_docker(say=print)
        return dcluster.build_images(say=print)
    except dcluster.DockerError as e:
        pytest.fail(f"Docker is needed here (ZLOG_DOCKER_TESTS=0 leaves these tests out): {e}")


@pytest.mark.docker
def test_unchanged_images_are_not_rebuilt(images: Any) -> None:
    said: list[str] = []
    again = dcluster.build_images(say=said.append)
    assert again == images
    assert said == [], f"an unchanged tree rebuilt something: {said}"


def _cli(*args: str, timeout: float = 300) -> str:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"cluster.py {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_bluestore_cluster_up_use_restart_stop(images: Any, tmp_path: Path) -> None:
    name = f"zl{os.getpid()}-{uuid.uuid4().hex[:4]}"
    d = tmp_path / "cluster"
    c = dcluster.Cluster(name, d)
    # a stranger's container and network: `stop` must leave them alone
    other = f"{name}-other"
    dcluster.docker("network", "create", "--internal", "--label", f"{dcluster.LABEL}={other}", other)
    dcluster.docker("run", "-d", "--name", other, "--network", other, "--label",
                    f"{dcluster.LABEL}={other}", images.base, "sleep", "300")
    try:
        out = _cli("up", "--name", name, "--dir", str(d), "--bluestore", "--owner-pid", str(os.getpid()))
        assert f"ceph.conf for this host: {c.conf}" in out
        st = c.state()
        subnet = ipaddress.ip_network(st["subnet"])
        assert all(ipaddress.ip_address(ip) in subnet for ip in st["hosts"].values())

        # CRUSH: one host bucket per OSD container, the pool spread over all three
        tree = json.loads(c.ceph("osd", "tree", "-f", "json"))
        hosts = {n["name"]: n["children"] for n in tree["nodes"] if n["type"] == "host"}
        assert sorted(hosts) == ["osd0", "osd1", "osd2"] and all(len(ch) == 1 for ch in hosts.values())
        assert json.loads(c.ceph("osd", "pool", "get", "zlog", "size", "-f", "json"))["size"] == 3
        assert json.loads(c.ceph("osd", "pool", "get", "zlog", "min_size", "-f", "json"))["min_size"] == 2
        acting = json.loads(c.ceph("osd", "map", "zlog", "some-object", "-f", "json"))["acting"]
        assert len(set(acting)) == 3
        meta = json.loads(c.ceph("osd", "metadata", "0", "-f", "json"))
        assert meta["osd_objectstore"] == "bluestore" and meta["hostname"] == "osd0"

        # cephx: the right key from this host works, a wrong one is refused
        bad = tmp_path / "bad.keyring"
        bad.write_text(f"[client.admin]\n\tkey = {dcluster.cephx_key()}\n")
        with pytest.raises(pyzlog.PermissionDenied):
            pyzlog.connect(c.conf, keyring=str(bad), connect_timeout=10)
        r = pyzlog.connect(c.conf, op_timeout=30)
        try:
            # both sequencers stand by for each other: the log is served by the
            # one that took it, and a client told the other follows the metadata
            seqr0, seqr1 = c.sequencers
            lg = Log.create(r, "zlog", "life", width=3, sequencer=seqr0)
            first = [lg.append(b"a%d" % i) for i in range(20)]
            assert lg.refresh().sequencer == seqr0
            # authentication is on: that went through the sequencer, and a client with no key gets in nowhere
            assert lg.positions.sequencer_usable()
            host, port = seqr0.rsplit(":", 1)
            with pytest.raises(_seqr.AuthError, match="wrong key|does not accept"):
                _seqr.Client(host, int(port), 10.0, {"pool": "zlog", "keys": [(1, os.urandom(32))]})
            lg2 = Log.open(r, "zlog", "life", sequencer=seqr1)
            second = [lg2.append(b"b%d" % i) for i in range(20)]
            assert lg2.sequencer is not None and lg2.sequencer.address == seqr0
            # the serving sequencer's host stops: the other takes the log over
            epoch = lg.refresh().epoch
            dcluster.docker("stop", c.container("seqr0"), timeout=60)
            third = [lg2.append(b"c%d" % i) for i in range(20)]
            deadline = time.monotonic() + 30
            while lg.refresh().sequencer != seqr1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert lg.refresh().sequencer == seqr1 and lg.epoch > epoch
            third += [lg2.append(b"c%d" % i) for i in range(20, 40)]
            assert lg2.sequencer is not None and lg2.sequencer.address == seqr1
            assert len(set(first + second + third)) == 80
            # its host comes back: the old owner stands by and takes nothing back
            dcluster.docker("start", c.container("seqr0"), timeout=60)
            fourth = [lg2.append(b"d%d" % i) for i in range(20)]
            time.sleep(4)  # two leases: long enough for a wrongful take-back to show
            assert lg.refresh().sequencer == seqr1
            assert len(set(first + second + third + fourth)) == 100

            # bluestore keeps the data across a restart of an OSD host
            dcluster.docker("restart", c.container("osd1"), timeout=120)
            c.wait_osds_up(3, 120)
            c.wait_writable(120)
            got = {rec.position: rec.data for rec in Log.open(r, "zlog", "life").stream(0, follow=False)}
            assert [got[p] for p in first] == [b"a%d" % i for i in range(20)]
            assert [got[p] for p in second] == [b"b%d" % i for i in range(20)]
            assert [got[p] for p in third] == [b"c%d" % i for i in range(40)]
            assert [got[p] for p in fourth] == [b"d%d" % i for i in range(20)]
            lg.close()
            lg2.close()
        finally:
            r.shutdown()

        ours = set(c.containers())
        assert ours == {f"{name}-{h}" for h in st["hosts"]}
        _cli("stop", "--name", name, "--dir", str(d))
        assert c.containers() == []
        nets = dcluster.docker("network", "ls", "--format", "{{.Name}}").split()
        assert name not in nets and other in nets
        assert other in dcluster.docker("ps", "--format", "{{.Names}}").split()
    finally:
        c.stop(say=print)
        dcluster.docker("rm", "-f", other, check=False)
        dcluster.docker("network", "rm", other, check=False)
