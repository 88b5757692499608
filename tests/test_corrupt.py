"""Damage at rest, as a client and an operator meet it (issue 28, issue
24's corrupt entries), in both formats: issue 28's reproduction (a lost
header no longer lets a write overwrite an acknowledged entry); read
raises CorruptEntry naming the position and object; stream() and
stream_batches() stop with it, or skip and report with on_corrupt; zlog cat;
`zlog check --log NAME --deep` lists every damaged object and position;
`zlog repair` rebuilds a lost header, after which the entries read back
and write-once holds."""
from __future__ import annotations

import json

import pytest

import damage
import pyzlog
from pyzlog.client.reader import RecordKind
from pyzlog.core.layout import place_of
from test_cli import assert_error, ok, run

#: "runs": the data format with its stripes dealt in runs of 4 (unit 4); "data" with unit 1
FORMATS = ["data", "omap", "runs"]


def make_log(rados_cluster, ceph, name: str, fmt: str, width: int, n: int) -> pyzlog.Log:  # type: ignore[no-untyped-def]
    log = pyzlog.Log.create(rados_cluster, ceph.pool, name, width=width, format="omap" if fmt == "omap" else "data",
                            **({} if fmt == "omap" else {"unit": 4 if fmt == "runs" else 1}))
    assert log.append_many([b"orig%d" % i for i in range(n)]) == list(range(n))
    return log


def damage_entry(io, log: pyzlog.Log, pos: int) -> None:  # type: ignore[no-untyped-def]
    """Position `pos`'s stored entry damaged from outside: an omap value cut
    short, or a data-format slot pointing past the object's data."""
    p = place_of(log.name, log.views, pos)
    if p.view.bounded:
        slot = p.slot(pos)
        io.write(p.oid, b"\x01" * 8 + b"\xff\xff\x00\x00" + b"\x05\x00\x00\x10",
                 damage.DATA_HEADER + slot * damage.SLOT)
    else:
        with damage.rados.WriteOpCtx() as op:
            io.set_omap(op, ("%016x" % pos,), (b"\x01\x02",))
            io.operate_write_op(op, p.oid)


@pytest.fixture
def io(rados_cluster, ceph):  # type: ignore[no-untyped-def]
    io = damage.ioctx(rados_cluster, ceph.pool)
    yield io
    io.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_lost_header_never_lets_an_entry_be_overwritten(rados_cluster, ceph, io, log_name: str,  # type: ignore[no-untyped-def]
                                                          fmt: str) -> None:
    """Issue 28's reproduction, then the operator's way out."""
    log = make_log(rados_cluster, ceph, log_name, fmt, 1, 3)
    oid = log.oid_of(1)
    damage.lose_header(ceph.conf, io, oid, fmt != "omap")
    with pytest.raises(pyzlog.Corrupt):
        log.write(1, b"new")
    with pytest.raises(pyzlog.CorruptEntry) as e:
        log.read(1)
    assert e.value.position == 1 and e.value.oid == oid and oid in str(e.value)
    with pytest.raises(pyzlog.CorruptEntry) as e:
        list(log.stream())
    assert e.value.position == 0 and e.value.oid == oid

    # the operator: the deep check names the object, the repair rebuilds its header
    p = run(ceph, "check", "--log", log_name, "--deep", "--json")
    assert p.returncode == 1, p.stderr.decode()
    found = json.loads(p.stdout)["damaged"]
    assert [(d["oid"], d["kind"]) for d in found] == [(oid, "header")]
    assert b"scanned 1/1 objects" in p.stderr
    assert f"repaired {oid}" in ok(run(ceph, "repair", log_name, "--object", oid))
    assert_error(run(ceph, "repair", log_name, "--object", oid), 1, "nothing to repair")
    ok(run(ceph, "check", "--log", log_name, "--deep"))

    assert [log.read(i) for i in range(3)] == [b"orig0", b"orig1", b"orig2"]
    with pytest.raises(pyzlog.ReadOnly):
        log.write(1, b"new")  # write-once holds again
    assert log.append(b"orig3") == 3
    assert [r.data for r in log.stream()] == [b"orig%d" % i for i in range(4)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_damaged_entry_is_named_by_read_stream_cat_and_check(rados_cluster, ceph, io, log_name: str,  # type: ignore[no-untyped-def]
                                                               fmt: str) -> None:
    log = make_log(rados_cluster, ceph, log_name, fmt, 2, 10)
    damage_entry(io, log, 5)
    oid = log.oid_of(5)
    with pytest.raises(pyzlog.CorruptEntry) as e:
        log.read(5)
    assert e.value.position == 5 and e.value.oid == oid
    assert log.read(4) == b"orig4" and log.read(7) == b"orig7"
    with pytest.raises(pyzlog.CorruptEntry):
        log.write(5, b"new")

    # a stream stops at it by default, after handing out what comes before
    got = []
    with pytest.raises(pyzlog.CorruptEntry) as e:
        for rec in log.stream():
            got.append(rec.position)
    assert got == [0, 1, 2, 3, 4] and e.value.position == 5 and e.value.oid == oid
    # skip: a CORRUPT record for it, reported to the callback, and the rest
    reported: list[pyzlog.CorruptEntry] = []
    recs = list(log.stream(on_corrupt=reported.append))
    assert [(r.position, r.kind) for r in recs] == [(i, RecordKind.CORRUPT if i == 5 else RecordKind.DATA)
                                                    for i in range(10)]
    assert [(c.position, c.oid) for c in reported] == [(5, oid)]
    batches = list(log.stream_batches(on_corrupt="skip"))
    kinds = [k for b in batches for k in b.column(2).to_pylist()]
    assert kinds == ["data"] * 5 + ["corrupt"] + ["data"] * 4
    # a stream of one partition (stride) meets only its own positions
    assert [r.position for r in log.stream(stride_index=0, stride=2)] == [0, 2, 4, 6, 8]
    with pytest.raises(pyzlog.CorruptEntry):
        list(log.stream(stride_index=1, stride=2))

    p = run(ceph, "cat", log_name)
    assert p.returncode == 1 and b"position 5" in p.stderr and oid.encode() in p.stderr
    p = run(ceph, "cat", log_name, "--on-corrupt", "skip")
    assert p.returncode == 0 and p.stdout.split() == [b"orig%d" % i for i in range(10) if i != 5]
    assert b"# 5 corrupt" in p.stderr

    p = run(ceph, "check", "--log", log_name, "--deep", "--json")
    assert p.returncode == 1
    assert [(d["oid"], d["kind"], d["position"]) for d in json.loads(p.stdout)["damaged"]] == [(oid, "entry", 5)]
    # an entry damaged too: no repair rebuilds it (its header is sound)
    assert_error(run(ceph, "repair", log_name, "--object", oid), 1, "nothing to repair")


def test_skip_goes_past_an_object_whose_header_is_lost(rados_cluster, ceph, io, log_name: str) -> None:  # type: ignore[no-untyped-def]
    log = make_log(rados_cluster, ceph, log_name, "data", 2, 10)
    oid = log.oid_of(1)
    damage.lose_header(ceph.conf, io, oid, True)
    got = []
    # positions 1, 3, 5, 7 lie below a stored one: skipped; 9 may be the tail: never silently passed
    with pytest.raises(pyzlog.CorruptEntry) as e:
        for rec in log.stream(on_corrupt="skip"):
            got.append((rec.position, rec.kind.value))
    assert got == [(i, "corrupt" if i % 2 else "data") for i in range(9)]
    assert e.value.position == 9 and e.value.oid == oid
    p = run(ceph, "check", "--log", log_name, "--deep")
    assert p.returncode == 1 and f"DAMAGED header: {oid}" in p.stdout.decode()


def test_damaged_metadata_is_reported(rados_cluster, ceph, io, log_name: str) -> None:  # type: ignore[no-untyped-def]
    make_log(rados_cluster, ceph, log_name, "data", 1, 1)
    meta = damage.ioctx(rados_cluster, ceph.pool, "zlog.meta")
    try:
        meta.write_full(log_name, b"")
    finally:
        meta.close()
    with pytest.raises(pyzlog.Corrupt):
        pyzlog.Log.open(rados_cluster, ceph.pool, log_name)
    p = run(ceph, "check", "--log", log_name, "--deep", "--json")
    assert p.returncode == 1
    assert [d["kind"] for d in json.loads(p.stdout)["damaged"]] == ["metadata"]


@pytest.mark.parametrize("lose", [False, True], ids=["entry", "header"])
def test_async_streams_stop_or_skip_alike(rados_cluster, ceph, io, log_name: str, lose: bool) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from pyzlog import aio

    log = make_log(rados_cluster, ceph, log_name, "data", 2, 10)
    if lose:
        damage.lose_header(ceph.conf, io, log.oid_of(1), True)
    else:
        damage_entry(io, log, 5)

    async def main() -> tuple[list[tuple[int, str]], int | None]:
        alog = aio.AsyncLog(log)
        got = []
        try:
            async for r in alog.stream(on_corrupt="skip"):
                got.append((r.position, r.kind.value))
        except pyzlog.CorruptEntry as e:
            return got, e.position
        return got, None

    got, raised = asyncio.run(asyncio.wait_for(main(), 120))
    sync: list[tuple[int, str]] = []
    try:
        for r in log.stream(on_corrupt="skip"):
            sync.append((r.position, r.kind.value))
        sync_raised = None
    except pyzlog.CorruptEntry as e:
        sync_raised = e.position
    assert got == sync and raised == sync_raised
    assert ("corrupt" in {k for _, k in got}) and (raised == (9 if lose else None))
