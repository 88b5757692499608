"""Fixtures of the network fault suite (tests/faults/net): the Docker test
bed, one per module, healed after each test. See netlib.py."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import pyzlog

from dockermod import dcluster
from netlib import OP_TIMEOUT, NetCluster

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the hook sees every item of the session
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="module")
def net_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    """The module's cluster; a module's BED dict is passed to Cluster.up
    (e.g. {"bluestore": True, "down_out_interval": 10}), memstore otherwise."""
    if os.environ.get("ZLOG_DOCKER_TESTS", "1") == "0":
        pytest.skip("ZLOG_DOCKER_TESTS=0: the Docker network fault tests are left out")
    try:
        dcluster.ensure_docker(say=print)
        images = dcluster.build_images(say=print)
    except dcluster.DockerError as e:
        pytest.fail(f"Docker is needed for the network fault tests (ZLOG_DOCKER_TESTS=0 leaves them out): {e}")
    d = tmp_path_factory.mktemp("docker-cluster")
    c = dcluster.Cluster(f"zt{os.getpid()}-{uuid.uuid4().hex[:4]}", d)
    try:
        c.up(owner_pid=os.getpid(), images=images, say=print, **getattr(request.module, "BED", {}))  # removed even if this run is killed
        yield NetCluster(c, d)
    finally:
        c.stop(say=print)


@pytest.fixture(scope="module")
def net_rados(net_cluster: NetCluster):  # type: ignore[no-untyped-def]
    r = pyzlog.connect(net_cluster.conf, op_timeout=OP_TIMEOUT)
    yield r
    r.shutdown()


@pytest.fixture
def net(net_cluster: NetCluster) -> Iterator[NetCluster]:
    """The cluster, every PG active+clean before each test (a fresh cluster
    may still be peering some, and a PG still being created on an OSD that
    a fault then takes away stays inactive until it returns), healed and
    serving again after each test."""
    net_cluster.wait_clean()
    yield net_cluster
    net_cluster.heal()
