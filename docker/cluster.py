#!/usr/bin/env python3
"""pyzlog's multi-host Ceph test bed in Docker.

    cluster.py up     [--name N] [--dir D] [--bluestore] [--subnet CIDR] [--down-out-interval S]
    cluster.py status [--name N] [--dir D]
    cluster.py stop   [--name N] [--dir D]
    cluster.py build  [--name N]          the images only
    cluster.py ensure-docker              install docker.io / start dockerd if needed

`up` starts, on a bridge network of its own (an --internal network with a
subnet of its own, 10.231.K.0/24 by default), one container per host:
1 mon, 3 OSDs (hostnames osd0..osd2, so CRUSH puts the 3 replicas on 3
hosts; pool `zlog` of size 3, min_size 2; memstore, or bluestore with
--bluestore) and 2 zlog-seqr sequencers, with cephx on, and clients of the
sequencers authenticated with the pool's secret (zlog-seqr --pool: the
default; docs/seqr-protocol.md). The host reaches the
containers at their bridge addresses; `up` prints the ceph.conf to use from
the host. `stop` removes exactly the containers and the network labelled
with the cluster's name.

An OSD host can be destroyed for good (`Cluster.destroy_osd_host`: its
container and store removed) and a replacement brought in
(`Cluster.add_osd_host`: a new hostname, address and OSD id). With
--down-out-interval S the mon marks a down OSD out by itself after S
seconds, and backfill starts; `Cluster.pg_states` asks each PG's primary
for its state (the bed runs no mgr).

The images are built here, with no registry: a base from `debootstrap
--variant=minbase bookworm` against this machine's own Debian mirror (the URI
in its apt sources), `docker import`ed; Ceph 16 on it (Dockerfile.ceph); and
pyzlog on that (Dockerfile.node: the wheel built from this checkout, with
libcls_zlog.so where the OSDs load classes, and zlog-seqr). Each image is
tagged by a hash of what went into it, so an unchanged rebuild is a lookup.

If Docker is missing, Debian's docker.io is installed and `dockerd` is
started with setsid (no systemd here), its log in /var/log/pyzlog-dockerd.log.
It keeps running afterwards.

Run it with the project's venv (`./dev docker up`): building the wheel needs
the build tools in .venv.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "docker"
DEFAULT_NAME = "pyzlog"
RUN_DIR = ROOT / "run" / "docker"
LABEL = "pyzlog.core.cluster"
IMAGE_LABEL = "pyzlog.image"
SUITE = "bookworm"
#: the subnets `up` chooses from: 10.231.K.0/24, the first free K
SUBNET_PREFIX = "10.231"
MON_PORT = 3300
SEQR_PORT = 5678
OSDS = 3
SEQRS = 2
POOL = "zlog"
PG_NUM = 32
DOCKERD_LOG = Path("/var/log/pyzlog-dockerd.log")
DOCKERD_PID = Path("/run/pyzlog-dockerd.pid")
#: pid files that a dockerd killed outright leaves behind, and the process
#: each names. A new dockerd trusts them: a pid reused since by another
#: process makes it wait for a containerd that is not there, and fail.
DOCKER_PID_FILES = ((Path("/var/run/docker.pid"), "dockerd"),
                    (Path("/var/run/docker/containerd/containerd.pid"), "containerd"))
#: what goes into the pyzlog wheel (hashed for the node image's tag)
WHEEL_INPUTS = ("pyproject.toml", "CMakeLists.txt", "pyzlog", "cls_zlog", "seqr", "appender")
#: raise when the way an image is made changes without its inputs changing
RECIPE = "1"

Say = Callable[[str], None]


class DockerError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def _quiet(msg: str) -> None:
    pass


def run(cmd: list[str], timeout: float = 120, check: bool = True, input: bytes | None = None,
        env: dict[str, str] | None = None) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired as e:
        raise DockerError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
    except FileNotFoundError as e:
        raise DockerError(f"{cmd[0]} not found") from e
    out = p.stdout.decode(errors="replace")
    if check and p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip() or out.strip()
        raise DockerError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return out


def docker(*args: str, timeout: float = 120, check: bool = True, input: bytes | None = None) -> str:
    # the classic builder: Debian's docker.io has no buildx
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    return run(["docker", *args], timeout=timeout, check=check, input=input, env=env)


# ------------------------------------------------------------------ dockerd
def docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20)
        return True
    except DockerError:
        return False


def _as_root(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return cmd
    if shutil.which("sudo"):
        return ["sudo", "-n", *cmd]
    raise DockerError(f"need root (or sudo) for: {' '.join(cmd)}")


def apt_install(packages: list[str], say: Say) -> None:
    say(f"installing Debian packages: {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(_as_root(["apt-get", "update", "-q"]), timeout=600, env=env)
    run(_as_root(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]),
        timeout=900, env=env)


def ensure_docker(say: Say = _say) -> list[str]:
    """A Docker engine this process can use, and the tools the network
    faults need: install what is missing from Debian (docker.io, iptables,
    iproute2) and start dockerd if none answers. Returns what was done
    (empty when everything was there)."""
    done: list[str] = []
    ready = docker_ready()
    # iptables and tc run the network faults in the containers' namespaces
    missing = [pkg for tool, pkg in (("iptables", "iptables"), ("tc", "iproute2"), ("nsenter", "util-linux"))
               if shutil.which(tool) is None]
    if not ready and (shutil.which("dockerd") is None or shutil.which("docker") is None):
        missing.append("docker.io")
    if missing:
        apt_install(missing, say)
        done.append(f"installed {' '.join(missing)} from Debian")
    if ready or docker_ready():
        return done
    if os.path.exists("/var/run/docker.sock") and os.geteuid() != 0:
        raise DockerError("a Docker daemon seems to run but this user cannot use it "
                          "(join the docker group or run as root)")
    # No systemd here: dockerd in a session of its own (setsid), its log in a
    # file. No default bridge, no iptables rules, no IP forwarding: the
    # project's networks are internal and the host talks to them directly.
    cmd = ["dockerd", "--bridge=none", "--iptables=false", "--ip-forward=false"]
    stale = clear_stale_pid_files()
    if stale:
        say(f"removed pid files of a dockerd that did not stop cleanly: {', '.join(stale)}")
    say(f"starting {' '.join(cmd)} with setsid (log: {DOCKERD_LOG})")
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(DOCKERD_LOG, "ab") as log:
        p = subprocess.Popen(_as_root(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
    deadline = time.monotonic() + 60
    while not docker_ready():
        if p.poll() is not None:
            raise DockerError(f"dockerd exited with {p.returncode}; see {DOCKERD_LOG}:\n" + _tail(DOCKERD_LOG))
        if time.monotonic() > deadline:
            raise DockerError(f"dockerd did not answer within 60 s; see {DOCKERD_LOG}")
        time.sleep(0.3)
    try:
        DOCKERD_PID.write_text(f"{p.pid}\n")
    except OSError:
        pass
    done.append(f"started dockerd (pid {p.pid}, log {DOCKERD_LOG}); it keeps running")
    say(done[-1])
    return done


def clear_stale_pid_files(files: tuple[tuple[Path, str], ...] = DOCKER_PID_FILES) -> list[str]:
    """Remove each pid file whose pid is not a running process of its name
    (called only when no dockerd answers); returns the paths removed."""
    removed = []
    for path, name in files:
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            running = Path(f"/proc/{pid}/comm").read_text().strip() == name
        except OSError:
            running = False
        if not running:
            try:
                path.unlink()
                removed.append(str(path))
            except OSError:  # not ours to remove (not root): dockerd says what it finds
                pass
    return removed


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ------------------------------------------------------------------- images
@dataclass(frozen=True)
class AptSource:
    uri: str
    suite: str
    components: tuple[str, ...]


def debian_sources(paths: list[Path] | None = None) -> list[AptSource]:
    """The bookworm entries of this machine's Debian apt sources (one-line
    .list files and deb822 .sources files), main component only."""
    if paths is None:
        d = Path("/etc/apt/sources.list.d")
        paths = [Path("/etc/apt/sources.list")]
        if d.is_dir():
            paths += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    found: list[AptSource] = []
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in text.split("\n\n"):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        found.append(AptSource(uri, suite, tuple(fields.get("components", "").split())))
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    if parts[1].startswith("["):  # options: [arch=amd64 signed-by=...]
                        while parts and not parts[1].endswith("]"):
                            parts.pop(1)
                        parts.pop(1)
                    found.append(AptSource(parts[1], parts[2], tuple(parts[3:])))
    return [s for s in found if (s.suite == SUITE or s.suite.startswith(SUITE + "-"))
            and "main" in s.components]


def debian_mirror(sources: list[AptSource]) -> str:
    for s in sources:
        if s.suite == SUITE:
            return s.uri
    raise DockerError(f"no Debian {SUITE} main entry in this machine's apt sources")


def _h(*parts: str | bytes) -> str:
    d = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        d.update(struct.pack("<Q", len(b)))
        d.update(b)
    return d.hexdigest()[:16]


def source_hash(root: Path = ROOT) -> str:
    """A hash of every file the pyzlog wheel is built from (committed or not)."""
    d = hashlib.sha256()
    for name in WHEEL_INPUTS:
        p = root / name
        files = [p] if p.is_file() else sorted(
            f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts
            and f.suffix not in (".pyc", ".so"))
        for f in files:
            d.update(str(f.relative_to(root)).encode() + b"\0")
            d.update(hashlib.sha256(f.read_bytes()).digest())
    return d.hexdigest()


def _wheel_deps() -> list[str]:
    """The runtime dependencies the containers need, pinned to this venv's
    versions (the rest of pyzlog's dependencies serve the bench and Spark)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    # zlog-seqr imports prometheus-client; every import of pyzlog loads the cffi data plane;
    # streams hand out Arrow record batches (a container's follower needs pyarrow)
    for dist in ("click", "zstandard", "prometheus-client", "cffi", "pycparser", "pyarrow"):
        try:
            out.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError as e:
            raise DockerError(f"{dist} is not installed in {sys.prefix}: run ./dev setup first") from e
    return out


@dataclass(frozen=True)
class Images:
    base: str
    ceph: str
    node: str


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", tag, check=False, timeout=30).strip() != ""


def image_tags(root: Path = ROOT) -> Images:
    sources = debian_sources()
    mirror = debian_mirror(sources)
    base = "pyzlog/base:" + _h(RECIPE, SUITE, "minbase", mirror, repr(sources))
    ceph = "pyzlog/ceph:" + _h(RECIPE, base, (HERE / "Dockerfile.ceph").read_bytes())
    node = "pyzlog/node:" + _h(RECIPE, ceph, (HERE / "Dockerfile.node").read_bytes(),
                               (HERE / "node.sh").read_bytes(), source_hash(root), *_wheel_deps())
    return Images(base, ceph, node)


def build_images(say: Say = _say, root: Path = ROOT) -> Images:
    """Build whichever of the three images is missing; each is tagged by a
    hash of its inputs, so an unchanged tree builds nothing."""
    tags = image_tags(root)
    if not image_exists(tags.base):
        _build_base(tags.base, say)
    if not image_exists(tags.ceph):
        t0 = time.monotonic()
        say(f"building {tags.ceph} (Ceph 16 from Debian)")
        docker("build", "-q", "--network", "host", "--build-arg", f"BASE={tags.base}",
               "--label", f"{IMAGE_LABEL}=ceph", "-t", tags.ceph, "-f", str(HERE / "Dockerfile.ceph"),
               str(HERE), timeout=1200)
        say(f"{tags.ceph} built in {time.monotonic() - t0:.0f}s")
    if not image_exists(tags.node):
        _build_node(tags, say, root)
        _prune_old("node", keep={tags.node})
    return tags


def _build_base(tag: str, say: Say) -> None:
    sources = debian_sources()
    mirror = debian_mirror(sources)
    if shutil.which("debootstrap") is None:
        apt_install(["debootstrap"], say)
    t0 = time.monotonic()
    say(f"building {tag}: debootstrap --variant=minbase {SUITE} from {mirror}")
    with tempfile.TemporaryDirectory(prefix="pyzlog-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(_as_root(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror]), timeout=1200)
        # the same Debian entries as this machine (updates, security), main only
        (rootfs / "etc/apt/sources.list").write_text(
            "".join(f"deb {s.uri} {s.suite} main\n" for s in sources))
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        imp = subprocess.run(["docker", "import", "--change", "CMD [\"/bin/bash\"]", "--change",
                              f"LABEL {IMAGE_LABEL}=base", "-", tag], stdin=tar.stdout,
                             capture_output=True, timeout=600)
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait(60)
        if imp.returncode != 0 or tar.returncode != 0:
            raise DockerError(f"docker import failed: {imp.stderr.decode(errors='replace')}")
        run(_as_root(["rm", "-rf", str(rootfs)]), timeout=300)
    say(f"{tag} built in {time.monotonic() - t0:.0f}s")


def _build_node(tags: Images, say: Say, root: Path) -> None:
    t0 = time.monotonic()
    say(f"building {tags.node} (pyzlog wheel from {root})")
    with tempfile.TemporaryDirectory(prefix="pyzlog-node-", dir="/var/tmp") as tmp:
        ctx = Path(tmp)
        wheels = ctx / "wheels"
        wheels.mkdir()
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "-w", str(wheels), str(root)], timeout=1800)
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
             "-d", str(wheels), *_wheel_deps()], timeout=600)
        shutil.copy2(HERE / "node.sh", ctx / "node.sh")
        (ctx / "node.sh").chmod(0o755)
        shutil.copy2(HERE / "Dockerfile.node", ctx / "Dockerfile")
        docker("build", "-q", "--network", "host", "--build-arg", f"CEPH={tags.ceph}",
               "--label", f"{IMAGE_LABEL}=node", "-t", tags.node, str(ctx), timeout=1200)
    say(f"{tags.node} built in {time.monotonic() - t0:.0f}s")


def _prune_old(layer: str, keep: set[str], newest: int = 3) -> None:
    """Drop all but the newest few images of a layer (other checkouts may be
    using recent ones; an image in use is never removed)."""
    out = docker("images", "--filter", f"label={IMAGE_LABEL}={layer}", "--format",
                 "{{.Repository}}:{{.Tag}} {{.CreatedAt}}", check=False)
    rows = sorted((line.split(" ", 1) for line in out.splitlines() if " " in line),
                  key=lambda r: r[1], reverse=True)
    for tag, _ in rows[newest:]:
        if tag not in keep:
            docker("rmi", tag, check=False)


# ------------------------------------------------------------------ cluster
def cephx_key() -> str:
    """A new cephx secret, as `ceph-authtool --gen-print-key` makes one."""
    now = time.time()
    raw = struct.pack("<HIIH", 1, int(now), int((now % 1) * 1e9), 16) + os.urandom(16)
    return base64.b64encode(raw).decode()


def _host_routes() -> list[ipaddress.IPv4Network]:
    nets = []
    try:
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            f = line.split()
            dest, mask = int(f[1], 16), int(f[7], 16)
            if dest:
                nets.append(ipaddress.IPv4Network(
                    (socket.inet_ntoa(struct.pack("<I", dest)), bin(mask).count("1")), strict=False))
    except (OSError, ValueError, IndexError):
        pass
    return nets


def _docker_subnets() -> list[ipaddress.IPv4Network]:
    ids = docker("network", "ls", "-q").split()
    if not ids:
        return []
    out = docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids)
    nets = []
    for s in out.split():
        try:
            nets.append(ipaddress.IPv4Network(s, strict=False))
        except ValueError:
            pass  # IPv6
    return nets


@dataclass
class Cluster:
    """One test-bed cluster: its containers and network carry the label
    pyzlog.core.cluster=NAME; its keys, configs and logs live in DIR."""
    name: str
    dir: Path

    # ----------------------------------------------------------- state
    @property
    def state_file(self) -> Path:
        return self.dir / "cluster.json"

    def state(self) -> dict[str, Any]:
        try:
            st: dict[str, Any] = json.loads(self.state_file.read_text())
            return st
        except (OSError, ValueError):
            return {}

    @property
    def conf(self) -> str:
        return str(self.dir / "ceph.conf")

    @property
    def network(self) -> str:
        return self.name

    def container(self, host: str) -> str:
        return f"{self.name}-{host}"

    def ip(self, host: str) -> str:
        return str(self.state()["hosts"][host])

    @property
    def osd_hosts(self) -> list[str]:
        """The OSD hosts the cluster has now (a destroyed one leaves, a
        replacement joins)."""
        return list(self.osd_ids())

    def osd_ids(self) -> dict[str, int]:
        """Each OSD host's OSD id."""
        st = self.state()
        return {h: int(i) for h, i in st.get("osd_ids", {}).items()}

    def _save(self, st: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        os.replace(tmp, self.state_file)

    @property
    def sequencers(self) -> list[str]:
        """host:port of each sequencer, the first being the one clients use."""
        st = self.state()
        return [f"{st['hosts'][h]}:{SEQR_PORT}" for h in st.get("seqrs", [])]

    def containers(self) -> list[str]:
        """Names of every container labelled with this cluster (any state)."""
        out = docker("ps", "-a", "--filter", f"label={LABEL}={self.name}", "--format", "{{.Names}}")
        return sorted(out.split())

    def pid(self, host: str) -> int:
        """The host pid of a container's first process (for nsenter)."""
        return int(docker("inspect", "--format", "{{.State.Pid}}", self.container(host)).strip())

    def ceph(self, *args: str, timeout: float = 30) -> str:
        """A ceph command run in the mon container (no Ceph tools needed on the host)."""
        return docker("exec", self.container("mon"), "ceph", "--connect-timeout", "15", *args,
                      timeout=timeout)

    # ------------------------------------------------------------ up
    def up(self, bluestore: bool = False, subnet: str | None = None, say: Say = _say,
           owner_pid: int | None = None, images: Images | None = None,
           down_out_interval: int = 0) -> dict[str, Any]:
        """Start the cluster. `down_out_interval` > 0: the mon marks an OSD
        out by itself that long after it went down, and backfill starts
        (0, the default: never, so the network faults' short outages move no
        data)."""
        t0 = time.monotonic()
        st = self.state()
        if st and set(self.containers()) >= set(self.container(h) for h in st.get("hosts", {})):
            if self._running(st):
                say(f"cluster {self.name} is already up")
                return st
        if self.containers() or self._network_exists():
            self.stop(say=_quiet)
        images = images or build_images(say)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        etc = self.dir / "etc"
        etc.mkdir(parents=True)
        (self.dir / "log").mkdir()
        net = self._create_network(subnet)
        hosts: dict[str, str] = {"mon": str(net[10])}
        hosts.update({f"osd{i}": str(net[20 + i]) for i in range(OSDS)})
        hosts.update({f"seqr{i}": str(net[30 + i]) for i in range(SEQRS)})
        fsid = str(uuid.uuid4())
        st = {"name": self.name, "network": self.network, "subnet": str(net), "gateway": str(net[1]),
              "fsid": fsid, "hosts": hosts, "osd_ids": {}, "seqrs": [f"seqr{i}" for i in range(SEQRS)],
              "pool": POOL, "bluestore": bluestore, "down_out_interval": down_out_interval,
              "image": images.node, "conf": self.conf, "dir": str(self.dir)}
        self._save(st)
        if owner_pid is not None:
            self._start_watcher(owner_pid)
        try:
            self._start(st, images, bluestore, say)
        except BaseException:
            self.stop(say=_quiet)  # nothing half-started stays; the daemons' logs do
            raise
        say(f"cluster {self.name} up in {time.monotonic() - t0:.1f}s")
        return st

    def _start(self, st: dict[str, Any], images: Images, bluestore: bool, say: Say) -> None:
        etc = self.dir / "etc"
        hosts, fsid = st["hosts"], st["fsid"]
        admin = cephx_key()
        self._write_conf(etc / "ceph.conf", st, bluestore, keyring="/etc/ceph/ceph.client.admin.keyring")
        self._write_conf(self.dir / "ceph.conf", st, bluestore,
                         keyring=str(etc / "ceph.client.admin.keyring"), host_side=True)
        admin_caps = ('\tcaps mon = "allow *"\n\tcaps osd = "allow *"\n'
                      '\tcaps mgr = "allow *"\n\tcaps mds = "allow *"\n')
        (etc / "ceph.client.admin.keyring").write_text(f"[client.admin]\n\tkey = {admin}\n{admin_caps}")
        (etc / "ceph.mon.keyring").write_text(
            f"[mon.]\n\tkey = {cephx_key()}\n\tcaps mon = \"allow *\"\n"
            f"[client.admin]\n\tkey = {admin}\n{admin_caps}")

        say(f"starting mon at {hosts['mon']} on network {self.network} ({st['subnet']})")
        self._run_container("mon", images.node, ["mon"], {"FSID": fsid, "MON_IP": hosts["mon"]})
        self._wait(lambda: self._try(lambda: self.ceph("mon", "stat", timeout=20)), 60, "the mon")
        for i in range(OSDS):
            got = self._create_osd(f"osd{i}", images.node)
            if got != i:
                raise DockerError(f"expected osd.{i}, the mon made osd.{got}")
        say(f"started {OSDS} OSD hosts ({'bluestore' if bluestore else 'memstore'})")
        self.ceph("osd", "pool", "create", POOL, str(PG_NUM), str(PG_NUM))
        self.ceph("osd", "pool", "application", "enable", POOL, "zlog")
        self.wait_osds_up(OSDS, 120)
        self.wait_writable(120)
        for h in st["seqrs"]:
            self._run_container(h, images.node, ["seqr"], {"SEQR_PORT": str(SEQR_PORT),
                                                           "SEQR_ADVERTISE": f"{st['hosts'][h]}:{SEQR_PORT}"})
        for addr in self.sequencers:
            host, port = addr.rsplit(":", 1)
            self._wait(lambda host=host, port=int(port): _listening(host, port),  # type: ignore[misc]
                       60, f"the sequencer at {addr}")

    def _create_osd(self, host: str, image: str) -> int:
        """A new OSD on a new host: a new id from the mon (`ceph osd new`
        with a fresh uuid and cephx key), its keyring, and the host's
        container, whose first start runs `ceph-osd --mkfs` (node.sh). CRUSH
        places it under a host bucket named after the container's hostname."""
        osd_uuid = str(uuid.uuid4())
        key = cephx_key()
        got = docker("exec", "-i", self.container("mon"), "ceph", "osd", "new", osd_uuid, "-i", "-",
                     input=json.dumps({"cephx_secret": key}).encode()).strip()
        osd_id = int(got)
        (self.dir / "etc" / f"ceph.osd.{osd_id}.keyring").write_text(f"[osd.{osd_id}]\n\tkey = {key}\n")
        st = self.state()
        st["osd_ids"][host] = osd_id
        self._save(st)
        self._run_container(host, image, ["osd"], {"OSD_ID": str(osd_id), "OSD_UUID": osd_uuid})
        return osd_id

    # ------------------------------------------------- OSD host death
    def destroy_osd_host(self, host: str) -> int:
        """An OSD host dies for good, silently, as a host that loses power:
        it leaves the network first (so its dying OSD sends no reset or
        goodbye that would get it marked down at once), then its container
        and its store (the container's own filesystem) are removed. Peers
        report it down after the heartbeat grace; with a down_out_interval
        the mon then marks it out. Returns its OSD id, which stays in the
        OSD map (down, then out) until purged."""
        st = self.state()
        osd_id = st["osd_ids"].pop(host)
        docker("network", "disconnect", "--force", self.network, self.container(host))
        docker("rm", "-f", "-v", self.container(host), timeout=120)
        st["hosts"].pop(host)
        st.setdefault("destroyed", {})[host] = osd_id
        self._save(st)
        return int(osd_id)

    def add_osd_host(self, say: Say = _say) -> tuple[str, int]:
        """A replacement OSD host: the next free osdK hostname and address,
        a new OSD id. Returns (host, id) once the OSD is up; backfill to it
        starts then (see pg_states)."""
        st = self.state()
        used = {int(h.removeprefix("osd")) for h in (*st["osd_ids"], *st.get("destroyed", {}))}
        k = max(used) + 1
        if 20 + k >= 30:  # the sequencers' addresses start at .30
            raise DockerError(f"no address left for osd{k}")
        host = f"osd{k}"
        st["hosts"][host] = str(ipaddress.IPv4Network(st["subnet"])[20 + k])
        self._save(st)
        osd_id = self._create_osd(host, st["image"])
        say(f"started {host} (osd.{osd_id}) at {st['hosts'][host]}")
        self._wait(lambda: self.osd_state(osd_id) == (True, True), 300, f"osd.{osd_id} up and in")
        return host, osd_id

    def osd_state(self, osd_id: int) -> tuple[bool, bool] | None:
        """(up, in) of an OSD in the mon's map; None if it is not there or the
        mon did not answer."""
        try:
            dump = json.loads(self.ceph("osd", "dump", "-f", "json", timeout=20))
        except (DockerError, ValueError):
            return None
        for o in dump.get("osds", []):
            if o["osd"] == osd_id:
                return o["up"] == 1, o["in"] == 1
        return None

    def pg_states(self, timeout: float = 120) -> dict[str, dict[str, Any]]:
        """Every PG of the pool: {"state", "up", "acting"} as its primary OSD
        reports it (`pg query`). The bed runs no mgr, so `ceph pg dump` and
        `ceph -s` know no PG states; the primaries do. A PG whose primary
        did not answer within 10 s is {"state": "no answer", ...}."""
        out = docker("exec", "-i", self.container("mon"), "python3", "-c", _PG_STATES_PY, POOL,
                     timeout=timeout)
        states: dict[str, dict[str, Any]] = json.loads(out)
        return states

    def clean(self, states: dict[str, dict[str, Any]], replicas: int = 3) -> bool:
        """Every PG active+clean on `replicas` OSDs, all of them live hosts'."""
        live = set(self.osd_ids().values())
        return bool(states) and all(
            p["state"] == "active+clean" and len(p["acting"]) == replicas and set(p["acting"]) <= live
            for p in states.values())

    def _running(self, st: dict[str, Any]) -> bool:
        out = docker("ps", "--filter", f"label={LABEL}={self.name}", "--format", "{{.Names}}")
        return set(out.split()) >= {self.container(h) for h in st["hosts"]}

    def _network_exists(self) -> bool:
        out = docker("network", "ls", "--filter", f"label={LABEL}={self.name}", "--format", "{{.Name}}")
        return bool(out.split())

    def _create_network(self, subnet: str | None) -> ipaddress.IPv4Network:
        """An --internal bridge network with a subnet nobody else uses."""
        if subnet:
            candidates = [ipaddress.IPv4Network(subnet)]
        else:
            candidates = [ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{k}.0/24") for k in range(256)]
        last = ""
        for net in candidates:
            if net.num_addresses < 64:
                raise DockerError(f"subnet {net} is too small (need a /26 or larger)")
            taken = _docker_subnets() + _host_routes()
            if any(net.overlaps(t) for t in taken):
                continue
            try:
                docker("network", "create", "--driver", "bridge", "--internal", "--subnet", str(net),
                       "--gateway", str(net[1]), "--label", f"{LABEL}={self.name}", self.network)
                return net
            except DockerError as e:  # another checkout took it meanwhile: try the next
                last = str(e)
                if subnet:
                    raise
        raise DockerError(f"no free subnet for the cluster network: {last}")

    def _run_container(self, host: str, image: str, args: list[str], env: dict[str, str]) -> None:
        logs = self.dir / "log" / host
        logs.mkdir(parents=True, exist_ok=True)
        cmd = ["run", "-d", "--init", "--name", self.container(host), "--hostname", host,
               "--network", self.network, "--ip", self.ip(host), "--label", f"{LABEL}={self.name}",
               "-v", f"{self.dir / 'etc'}:/etc/ceph:ro", "-v", f"{logs}:/var/log/ceph"]
        for k, v in env.items():
            cmd += ["-e", f"{k}={v}"]
        docker(*cmd, image, *args)

    def run_client(self, host: str, ip: str, args: list[str], mounts: dict[str, str],
                   env: dict[str, str] | None = None) -> str:
        """Start a client container (removed by stop() like the rest)."""
        cmd = ["run", "-d", "--init", "--name", self.container(host), "--hostname", host,
               "--network", self.network, "--ip", ip, "--label", f"{LABEL}={self.name}",
               "-v", f"{self.dir / 'etc'}:/etc/ceph:ro"]
        for src, dst in mounts.items():
            cmd += ["-v", f"{src}:{dst}"]
        for k, v in (env or {}).items():
            cmd += ["-e", f"{k}={v}"]
        return docker(*cmd, self.state()["image"], "run", *args).strip()

    def _write_conf(self, path: Path, st: dict[str, Any], bluestore: bool, keyring: str,
                    host_side: bool = False) -> None:
        head = f"""[global]
fsid = {st['fsid']}
mon host = [v2:{st['hosts']['mon']}:{MON_PORT}]
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
"""
        if host_side:  # what a client on this machine needs
            path.write_text(f"# pyzlog docker test bed {st['name']}, for clients on this host\n{head}"
                            f"[client]\nkeyring = {keyring}\n")
            return
        store = ("osd objectstore = bluestore\nbluestore block create = true\n"
                 "bluestore block size = 2147483648\nbluestore fsck on mount = false\n"
                 "bluestore cache size = 134217728\n"
                 if bluestore else
                 "osd objectstore = memstore\nmemstore device bytes = 1073741824\n")
        shards = 2 if bluestore else 1  # memstore: one op thread, or its used-bytes count drifts (vstart.py)
        path.write_text(f"""# pyzlog docker test bed {st['name']}, inside its containers
{head}public network = {st['subnet']}
ms bind msgr1 = false
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon warn on osd down out interval zero = false
osd pool default size = 3
osd pool default min size = 2
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 1
osd crush update on start = true
osd class load list = *
osd class default list = *
{store}osd op num shards = {shards}
osd op num threads per shard = 1
osd memory target = 939524096
osd heartbeat grace = 8
osd heartbeat interval = 2
osd max markdown count = 1000
mon osd down out interval = {st.get('down_out_interval', 0)}
# the default 0.75 keeps 1 OSD of 3 from being marked out (2/3 < 0.75)
mon osd min in ratio = 0
[client]
keyring = {keyring}
[mon]
log file = /var/log/ceph/$cluster-$name.log
mon cluster log file = /var/log/ceph/$cluster.log
[osd]
keyring = /etc/ceph/$cluster.$name.keyring
log file = /var/log/ceph/$cluster-$name.log
""")

    def _start_watcher(self, owner_pid: int) -> None:
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "watch", "--name", self.name,
                          "--dir", str(self.dir), str(owner_pid)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    def watch(self, owner_pid: int, interval: float = 1.0) -> None:
        """Stop the cluster once `owner_pid` is gone; return early if it was
        stopped some other way."""
        while _pid_alive(owner_pid):
            time.sleep(interval)
            if not self.state_file.exists():
                return
        self.stop(say=_quiet)

    # ---------------------------------------------------------- waits
    @staticmethod
    def _try(fn: Callable[[], Any]) -> bool:
        try:
            fn()
            return True
        except DockerError:
            return False

    def _wait(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            self._check_exited()
            if time.monotonic() > deadline:
                raise DockerError(f"timed out after {timeout:.0f}s waiting for {what} "
                                  f"(logs: {self.dir / 'log'})")
            time.sleep(0.3)

    def _check_exited(self) -> None:
        """Fail at once, with its output, if a container of the cluster died."""
        out = docker("ps", "-a", "--filter", f"label={LABEL}={self.name}", "--filter", "status=exited",
                     "--format", "{{.Names}}")
        for name in out.split():
            logs = docker("logs", "--tail", "15", name, check=False)
            raise DockerError(f"container {name} exited:\n{logs}(logs: {self.dir / 'log'})")

    def up_osds(self) -> int:
        try:
            return int(json.loads(self.ceph("osd", "stat", "-f", "json", timeout=20))["num_up_osds"])
        except (DockerError, ValueError, KeyError):
            return -1

    def wait_osds_up(self, n: int, timeout: float = 90) -> None:
        self._wait(lambda: self.up_osds() == n, timeout, f"{n} OSDs up")

    def wait_writable(self, timeout: float = 90) -> None:
        """Until a real write to the pool succeeds (PGs active)."""
        probe = f"probe.{uuid.uuid4().hex[:8]}"

        def put() -> bool:
            return self._try(lambda: docker("exec", self.container("mon"), "rados", "-p", POOL,
                                            "put", probe, "/etc/hostname", timeout=20))
        self._wait(put, timeout, "a write to the pool")
        docker("exec", self.container("mon"), "rados", "-p", POOL, "rm", probe, check=False, timeout=20)

    # ----------------------------------------------------------- stop
    def stop(self, say: Say = _say) -> list[str]:
        """Remove exactly this cluster's containers and network."""
        names = self.containers()
        if names:
            paused = docker("ps", "--filter", f"label={LABEL}={self.name}", "--filter", "status=paused",
                            "--format", "{{.Names}}").split()
            if paused:
                docker("unpause", *paused, check=False)
            docker("rm", "-f", "-v", *names, timeout=120)
        nets = docker("network", "ls", "--filter", f"label={LABEL}={self.name}", "--format", "{{.Name}}").split()
        for n in nets:
            docker("network", "rm", n, timeout=60)
        try:
            self.state_file.unlink()
        except OSError:
            pass
        say(f"removed {len(names)} containers and {len(nets)} network(s) of cluster {self.name}")
        return names + nets

    def status(self) -> dict[str, Any]:
        st = self.state()
        out = docker("ps", "-a", "--filter", f"label={LABEL}={self.name}", "--format",
                     "{{.Names}} {{.Status}}")
        return {"name": self.name, "conf": self.conf if st else None, "subnet": st.get("subnet"),
                "hosts": st.get("hosts"), "sequencers": self.sequencers if st else [],
                "containers": dict(line.split(" ", 1) for line in out.splitlines() if line)}


#: run by python3 in the mon container: each PG of the pool (argv[1]) as its
#: primary reports it, as JSON
_PG_STATES_PY = """
import json, sys, rados
# pg_command ignores its timeout argument; the client's op timeouts bound it
r = rados.Rados(conffile="/etc/ceph/ceph.conf", conf={"rados_osd_op_timeout": "10", "rados_mon_op_timeout": "30"})
r.connect(timeout=30)
pool = sys.argv[1]
ret, out, err = r.mon_command(json.dumps({"prefix": "osd dump", "format": "json"}), b"")
p = next(p for p in json.loads(out)["pools"] if p["pool_name"] == pool)
states = {}
for i in range(p["pg_num"]):
    pgid = "%d.%x" % (p["pool"], i)
    try:
        ret, out, err = r.pg_command(pgid, json.dumps({"prefix": "query", "pgid": pgid}), b"")
        q = json.loads(out) if ret == 0 else {"state": "no answer: %d %s" % (ret, err)}
    except Exception as e:
        q = {"state": "no answer: %s" % e}
    states[pgid] = {"state": q.get("state", "?"), "up": q.get("up", []), "acting": q.get("acting", [])}
r.shutdown()
print(json.dumps(states))
"""


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", default=os.environ.get("ZLOG_DOCKER_NAME", DEFAULT_NAME),
                        help="cluster name: labels its containers and names its network (default: %(default)s)")
    common.add_argument("--dir", type=Path, default=None,
                        help="keys, configs and logs (default: run/docker/NAME)")
    ap = argparse.ArgumentParser(description="pyzlog's multi-host Ceph test bed in Docker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", parents=[common], help="build the images if needed and start the cluster")
    u.add_argument("--bluestore", action="store_true", help="file-backed OSDs (survive a restart)")
    u.add_argument("--subnet", default=None, help=f"network subnet (default: the first free {SUBNET_PREFIX}.K.0/24)")
    u.add_argument("--down-out-interval", type=int, default=0,
                   help="seconds after which the mon marks a down OSD out (default 0: never)")
    u.add_argument("--owner-pid", type=int, default=None,
                   help="remove the cluster once this process is gone (tests)")
    sub.add_parser("status", parents=[common], help="the cluster's containers and addresses")
    sub.add_parser("stop", parents=[common], help="remove the cluster's containers and network")
    sub.add_parser("build", parents=[common], help="build the images (a lookup when nothing changed)")
    sub.add_parser("ensure-docker", parents=[common], help="install docker.io and start dockerd if needed")
    w = sub.add_parser("watch", parents=[common])
    w.add_argument("pid", type=int)
    args = ap.parse_args(argv)
    c = Cluster(args.name, (args.dir or RUN_DIR / args.name).resolve())
    try:
        if args.cmd == "ensure-docker":
            did = ensure_docker()
            if not did:
                print("docker: already running")
            return 0
        if args.cmd == "watch":
            c.watch(args.pid)
            return 0
        ensure_docker()
        if args.cmd == "build":
            t0 = time.monotonic()
            tags = build_images()
            print(f"images ready in {time.monotonic() - t0:.2f}s: {tags.base} {tags.ceph} {tags.node}")
        elif args.cmd == "up":
            st = c.up(bluestore=args.bluestore, subnet=args.subnet, owner_pid=args.owner_pid,
                      down_out_interval=args.down_out_interval)
            print(f"\nceph.conf for this host: {c.conf}\n")
            print(Path(c.conf).read_text())
            print("hosts: " + ", ".join(f"{h} {ip}" for h, ip in st["hosts"].items()))
            print(f"pool: {st['pool']} (size 3, min_size 2, one replica per OSD host)")
            print(f"sequencers: {', '.join(c.sequencers)}")
            print(f"use it: export CEPH_CONF={c.conf} ZLOG_SEQR={c.sequencers[0]}; "
                  ".venv/bin/zlog create mylog; .venv/bin/zlog append mylog hello")
            print("stop it: ./dev docker stop" + ("" if args.name == DEFAULT_NAME else f" --name {args.name}"))
        elif args.cmd == "status":
            st = c.status()
            print(json.dumps(st, indent=2))
            return 0 if st["containers"] else 3
        elif args.cmd == "stop":
            c.stop()
    except DockerError as e:
        print(f"docker test bed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
