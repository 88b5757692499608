"""Logs in the data format (docs/storage.md): bounded objects in stripes,
opened as appends reach them, the byte bound, space given back by trim_to,
tail finding over stripes, reconfiguration, and Ceph counting the bytes
(pool usage, quotas). The class's side is in test_cls_data.py."""
from __future__ import annotations

import errno
import json
import subprocess
import time
import uuid
from typing import Any

import pytest

import pyzlog
from pyzlog import Log, RecordKind
from pyzlog.core import wire
from pyzlog.core.layout import place, stripe_places, stripe_start, view_objects
from pyzlog.admin.damage import deep_scan
from pyzlog.admin.status import stored
from pyzlog.client import ops
from pyzlog.core import stripes
from pyzlog.core.native import Op
from pyzlog.core.stripes import make

from clsobj import log_obj
from seqr_proc import SeqrProcess

#: small objects, so a test crosses many stripes: 64 positions per object
SLOTS = 64


def small(rados_cluster, ceph, log_name, width: int = 2, **kw: Any) -> Log:  # type: ignore[no-untyped-def]
    return Log.create(rados_cluster, ceph.pool, log_name, width=width, slots=kw.pop("slots", SLOTS), **kw)


def sizes(rados_cluster, ceph, oids: list[str]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    io = rados_cluster.open_ioctx(ceph.pool)
    try:
        out = {}
        for oid in oids:
            try:
                out[oid] = int(io.stat(oid)[0])
            except Exception:  # noqa: BLE001 - not made
                pass
        return out
    finally:
        io.close()


def test_appends_open_stripes_and_no_object_holds_more_than_its_slots(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = small(rados_cluster, ceph, log_name)
    positions = lg.append_many([b"m%d" % i for i in range(300)])  # one batch over 3 stripes
    positions += [lg.append(b"s%d" % i) for i in range(20)]
    futs = [lg.append_async(b"a%d" % i) for i in range(700)]  # the C++ path over 6 more stripes
    positions += [f.result(timeout=60) for f in futs]
    assert positions[:320] == list(range(320))
    # async appends in flight together may land out of their order (one that
    # meets a stripe not open yet takes a new position): each once, above the rest
    assert len(set(positions)) == 1020 and min(positions[320:]) == 320
    view = lg.refresh().views[-1]
    assert view.bounded and view.stripes >= 1020 // (2 * SLOTS)
    assert len(view_objects(lg.name, view)) == 2 * view.stripes
    for oid in view_objects(lg.name, view):
        assert oid.startswith(f"zlog.{lg.name}.1.s")
        ret, st = log_obj(lg, oid).full_stat()
        assert ret == 0 and st is not None and st.entries <= SLOTS
    data = [b"m%d" % i for i in range(300)] + [b"s%d" % i for i in range(20)] + [b"a%d" % i for i in range(700)]
    stored = {r.position: r.data for r in Log.open(rados_cluster, ceph.pool, log_name).stream()
              if r.kind is RecordKind.DATA}
    assert stored == dict(zip(positions, data))


def test_a_full_object_fills_its_remaining_positions_and_appends_move_on(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Entries larger than byte_bound / slots: each object stops at its byte
    bound; the positions it had left read as filled, never as holes."""
    lg = small(rados_cluster, ceph, log_name, width=2, slots=256, byte_bound=64 << 10)
    entry = b"z" * 4000
    got = [lg.append(entry) for _ in range(40)] + lg.append_many([entry] * 30)
    got += [f.result(timeout=60) for f in [lg.append_async(entry) for _ in range(60)]]
    assert len(set(got)) == 130
    tail = max(got) + 1
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0, tail, hole_wait=0.5))
    assert [r.position for r in recs] == list(range(tail))
    assert {r.position for r in recs if r.kind == RecordKind.DATA} == set(got)
    assert {r.kind for r in recs if r.position not in got} <= {RecordKind.FILLED}  # no LOST hole
    for oid in view_objects(lg.name, lg.refresh().views[-1]):
        _, st = log_obj(lg, oid).full_stat()
        assert st is not None and st.bytes < (64 << 10) + 60 * len(entry)  # the bound, and the call that crossed it


def test_trim_to_gives_the_space_of_whole_stripes_back(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = small(rados_cluster, ceph, log_name, width=2)
    lg.append_many([b"x" * 2000 for _ in range(1024)])  # 8 stripes of 2 objects
    oids = view_objects(lg.name, lg.refresh().views[-1])
    before = sum(sizes(rados_cluster, ceph, oids).values())
    lg.trim_to(511)  # stripes 0..3
    after = sum(sizes(rados_cluster, ceph, oids).values())
    assert after < 0.55 * before
    assert lg.first_position() == 512 and lg.meta.trim_below == 512
    with pytest.raises(pyzlog.Trimmed):
        lg.read(100)
    assert lg.read(512) == b"x" * 2000
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(500, 520))
    assert [r.kind for r in recs] == [RecordKind.TRIMMED] * 12 + [RecordKind.DATA] * 8
    # a stripe opened but never written, below the trim point: trimmed too
    lg.trim_to(2000)
    assert lg.first_position() == 2001
    with pytest.raises(pyzlog.Trimmed):
        lg.read(1500)
    assert lg.append(b"after") == 2001


FAR = 4000 * 2 * SLOTS + 5  # a fill 4,000 stripes past the tail of a width-2 log


def objects_of(rados_cluster, pool: str, name: str) -> set[str]:  # type: ignore[no-untyped-def]
    """The log's data objects, as the pool lists them."""
    io = rados_cluster.open_ioctx(pool)
    try:
        return {o.key for o in io.list_objects() if o.key.startswith(f"zlog.{name}.")}
    finally:
        io.close()


def far_filled(rados_cluster, pool: str, name: str, sequencer: str | None = None) -> Log:  # type: ignore[no-untyped-def]
    """A width-2 log of 10 entries and a fill at FAR."""
    Log.create(rados_cluster, pool, name, width=2, slots=SLOTS)
    lg = Log.open(rados_cluster, pool, name, sequencer=sequencer)
    assert lg.append_many([b"a%d" % i for i in range(10)]) == list(range(10))
    lg.fill(FAR)
    assert lg.refresh().views[-1].stripes == 4001
    return lg


@pytest.mark.parametrize("listed,sequencer", [(True, False), (True, True)])
def test_a_fill_far_past_the_tail_costs_what_exists_not_what_it_opened(rados_cluster, ceph, log_name, own_pool,  # type: ignore[no-untyped-def]
                                                                      monkeypatch, tmp_path, request, listed,
                                                                      sequencer) -> None:
    """A fill 4,000 stripes past the tail opens them all and makes one. The
    status's counts, the damage scan and trim_to look only at the objects
    that exist (the pool's listing, once the names outnumber the pool's
    objects), and trim_to makes none of the missing ones. A trim between the sequencer's counter and the fill moves the
    log to a new epoch, so the sequencer counts on from past the fill
    instead of handing out trimmed positions."""
    if listed:
        monkeypatch.setattr(stripes, "NAMED_MAX", 64)  # what "many names" means for a pool this small
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log", pool=own_pool).start() if sequencer else None
    request.addfinalizer(lambda: seqr and seqr.kill())
    lg = far_filled(rados_cluster, own_pool, log_name, seqr.address if seqr else None)
    view = lg.meta.views[-1]
    made = {p.oid for s in (0, 4000) for p in stripe_places(log_name, view, s)}
    assert objects_of(rados_cluster, own_pool, log_name) == made
    counted = stored(lg.state, lg.meta)
    assert counted["objects"] == 4 and counted["entries"] == 10  # a fill is not an entry
    damage, scanned = deep_scan(lg.state)
    assert damage == [] and scanned == 4
    lg.trim_to(FAR - 1)  # every stripe: the 3,999 never made stay so
    assert objects_of(rados_cluster, own_pool, log_name) == made
    assert lg.first_position() == FAR
    with pytest.raises(pyzlog.Trimmed):
        lg.read(3)
    with pytest.raises(pyzlog.Filled):
        lg.read(FAR)
    assert lg.append(b"after") == FAR + 1
    if seqr:
        assert lg.append_async(b"async").result(60) == FAR + 2


def test_objects_made_while_sealing_get_the_trim_point(rados_cluster, ceph, log_name, own_pool,  # type: ignore[no-untyped-def]
                                                       monkeypatch) -> None:
    """A writer that died between opening a stripe and making its objects
    leaves them to tail finding, which makes them while it seals. A trim_to
    that listed the pool before then did not find them: they must get the
    trim point from their maker, and refuse every position below it."""
    monkeypatch.setattr(stripes, "NAMED_MAX", 64)
    lg = far_filled(rados_cluster, own_pool, log_name)
    meta = lg.refresh()
    view = meta.views[-1]
    assert lg.state.meta_store.open_stripe(meta.epoch, 4002) == 0  # the dead writer's step; no init follows
    top = stripe_start(view, 4002) + 40
    lg.trim_to(top)  # past everything stored: tail finding seals stripes 4002 and 4001, making their objects
    assert objects_of(rados_cluster, own_pool, log_name) >= {p.oid for p in stripe_places(log_name, view, 4002)}
    for q in (stripe_start(view, 4002) + 1, top, stripe_start(view, 4001) + 3):
        with pytest.raises(pyzlog.Trimmed):
            Log.open(rados_cluster, own_pool, log_name).write(q, b"late")
    assert lg.append(b"after") == top + 1


def test_a_trim_makes_the_objects_it_finds_missing_with_the_trim_point(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Stripes opened by writers that have not made their objects yet: a
    trim_to over them (by name) makes them, trimmed, so a writer that makes
    them after it and dies before giving them the trim point leaves
    nothing open below it."""
    lg = small(rados_cluster, ceph, log_name, width=2)
    lg.append_many([b"a%d" % i for i in range(10)])
    meta = lg.refresh()
    view = meta.views[-1]
    assert lg.state.meta_store.open_stripe(meta.epoch, 5) == 0  # stripes 1..5 open, none made
    top = stripe_start(view, 5) + 10
    lg.trim_to(top)
    epoch = lg.refresh().epoch
    late = stripe_places(log_name, view, 3)  # the dying writer's init, without the trim point after it
    lg.state.conn.calls([(lg.state.data, p.oid, Op.INIT, p.init_fields(epoch)) for p in late])
    for q in (stripe_start(view, 3) + 1, stripe_start(view, 1) + 2, top):
        with pytest.raises(pyzlog.Trimmed):
            Log.open(rados_cluster, ceph.pool, log_name).write(q, b"late")
    assert lg.append(b"after") == top + 1


def test_a_trimmer_that_dies_while_trimming_objects_leaves_the_sequencer_past_the_trim_point(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, own_pool, tmp_path, request, monkeypatch) -> None:
    """trim_to moves the log to a new epoch right after raising the trim
    point, not after trimming the objects: a trimmer that dies on the way
    leaves the sequencer counting past it, not handing out trimmed
    positions to every append."""
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log", pool=own_pool).start()
    request.addfinalizer(seqr.kill)
    far_filled(rados_cluster, own_pool, log_name, seqr.address)

    def dies(*_a: Any) -> list[Any]:
        raise RuntimeError("the trimmer died")

    monkeypatch.setattr(ops, "_trimmed_places", dies)
    with pytest.raises(RuntimeError):
        Log.open(rados_cluster, own_pool, log_name, sequencer=seqr.address).trim_to(1000)
    monkeypatch.undo()
    assert Log.open(rados_cluster, own_pool, log_name, sequencer=seqr.address).append(b"after") == FAR + 1


def test_a_trim_while_the_sequencer_does_not_answer_moves_the_log_on(rados_cluster, ceph, log_name, own_pool,  # type: ignore[no-untyped-def]
                                                                     tmp_path, request) -> None:
    """A trim between a paused sequencer's counter and a far fill cannot
    learn the counter: it moves the log to a new epoch anyway, so once the
    sequencer answers again it counts on from past the trim point."""
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log", pool=own_pool).start()
    request.addfinalizer(seqr.kill)
    far_filled(rados_cluster, own_pool, log_name, seqr.address)
    seqr.pause()
    request.addfinalizer(seqr.resume)
    epoch = Log.open(rados_cluster, own_pool, log_name).refresh().epoch
    trimmer = Log.open(rados_cluster, own_pool, log_name, sequencer=seqr.address)
    trimmer.trim_to(1000)
    assert trimmer.refresh().epoch > epoch
    seqr.resume()
    assert Log.open(rados_cluster, own_pool, log_name, sequencer=seqr.address).append(b"after") == FAR + 1


def test_tail_finding_walks_back_over_empty_stripes(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = small(rados_cluster, ceph, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(200)])  # stripes 0 and 1
    state = lg.state
    meta = state.refresh()
    view = meta.views[-1]
    # stripes 2 and 3 open, 3 with no object made (its opener died before init)
    assert make(state, meta.epoch, place(lg.name, view, 2 * 2 * SLOTS)) == 0
    assert state.meta_store.open_stripe(meta.epoch, 3) == 0
    epoch, nxt = lg.seal_and_find_tail()
    assert nxt == 200
    view = lg.refresh().views[-1]
    assert view.stripes == 4
    for stripe in (1, 2, 3):  # sealed back to the last stripe holding something, made if missing
        for p in stripe_places(lg.name, view, stripe):
            ret, st = log_obj(lg, p.oid).stat()
            assert ret == 0 and st is not None and st.sealed_epoch == epoch
    assert lg.append(b"next") == 200


def test_a_handle_opened_before_later_stripes_sees_their_positions(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """A handle whose metadata was read before other clients opened more
    stripes still answers the stored top from them (without a sequencer its
    tail() is that answer, and a sync built on it must not stop short)."""
    lg = small(rados_cluster, ceph, log_name, width=2)
    early = Log.open(rados_cluster, ceph.pool, log_name)  # no stripe open yet
    try:
        assert early.next_position_hint() == 0
        lg.append_many([b"x%d" % i for i in range(3 * 2 * SLOTS + 5)])  # into stripe 3
        top = 3 * 2 * SLOTS + 4
        assert early.max_position() == top
        assert early.next_position_hint() == early.tail() == top + 1
        assert early.append(b"next") == top + 1
    finally:
        early.close()


def test_a_batch_makes_the_objects_of_a_stripe_opened_by_a_writer_that_died(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """A writer died between opening stripes and making their objects: a
    batch over those stripes meets every one of its objects missing, makes
    them, and stores each entry at the position it took."""
    lg = small(rados_cluster, ceph, log_name, width=3)
    lg.append_many([b"x"] * 5)  # stripe 0 made
    epoch = lg.refresh().epoch
    for stripe in (1, 2):  # what the dead writer did: opened, never made
        assert lg.state.meta_store.open_stripe(epoch, stripe) == 0
    view = lg.refresh().views[-1]
    assert view.stripes == 3
    later = [p.oid for s in (1, 2) for p in stripe_places(lg.name, view, s)]
    assert sizes(rados_cluster, ceph, later) == {}
    entries = [b"b%d" % i for i in range(2 * 3 * SLOTS)]
    positions = lg.append_many(entries)
    assert positions == list(range(5, 5 + len(entries)))
    assert set(sizes(rados_cluster, ceph, later)) == set(later)
    assert [r.data for r in lg.stream(5)] == entries


def test_a_stale_client_cannot_open_a_stripe(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Opening is a compare-and-swap at the writer's epoch: a writer that
    missed an epoch change can neither open the next stripe nor write there."""
    lg = small(rados_cluster, ceph, log_name, width=1)
    lg.append_many([b"x"] * 10)
    stale = Log.open(rados_cluster, ceph.pool, log_name)
    old = stale.state.refresh()
    lg.seal_and_find_tail()
    where = place(lg.name, old.views[-1], SLOTS)  # stripe 1, not open
    assert make(stale.state, old.epoch, where) == -errno.ESTALE
    assert lg.refresh().views[-1].stripes == 1
    assert log_obj(lg, where.oid).write(old.epoch, SLOTS, b"late") == -errno.ENOENT
    # the stale client's own append refreshes and lands after the tail
    assert stale.write(SLOTS, b"fresh") is None and stale.read(SLOTS) == b"fresh"


def test_a_hole_at_the_end_of_a_stripe_is_a_hole_not_the_tail(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = small(rados_cluster, ceph, log_name, width=1, slots=8)
    for p in list(range(7)) + [8, 9]:
        lg.write(p, b"%d" % p)  # position 7 (last of stripe 0) never written
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0, hole_wait=0.3))
    assert [(r.position, r.kind) for r in recs][6:] == [(6, RecordKind.DATA), (7, RecordKind.LOST),
                                                      (8, RecordKind.DATA), (9, RecordKind.DATA)]


def test_an_asyncio_stream_sees_a_hole_at_the_end_of_a_stripe_too(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """The asyncio stream walks the same steps (BatchStream._steps): it once
    had a copy of its own that never asked the next stripe, and took the
    hole for the tail."""
    import asyncio

    from pyzlog.aio import AsyncLog

    lg = small(rados_cluster, ceph, log_name, width=1, slots=8)
    for p in list(range(7)) + [8, 9]:
        lg.write(p, b"%d" % p)

    async def read() -> list[Any]:
        alog = AsyncLog(Log.open(rados_cluster, ceph.pool, log_name))
        try:
            return [(r.position, r.kind) async for r in alog.stream(0, hole_wait=0.3)]
        finally:
            await alog.close()

    got = asyncio.run(asyncio.wait_for(read(), 60))
    assert got[6:] == [(6, RecordKind.DATA), (7, RecordKind.LOST), (8, RecordKind.DATA), (9, RecordKind.DATA)]


def test_reconfiguration_keeps_the_format_and_closes_the_old_stripes(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = small(rados_cluster, ceph, log_name, width=2)
    lg.append_many([b"a%d" % i for i in range(150)])
    old = lg.refresh().views[-1]
    new = lg.reconfigure(3)
    assert (new.start, new.width, new.format, new.slots, new.byte_bound, new.stripes, new.unit) == \
        (150, 3, wire.FORMAT_DATA, SLOTS, old.byte_bound, 0, old.unit)
    # the old view's objects refuse its positions past the end, whatever the epoch
    for p in stripe_places(lg.name, old, 1):
        past = p.next_held(151)  # its first position past the end
        assert log_obj(lg, p.oid).write(lg.epoch, past, b"z") == -errno.ESTALE, p
    lg.append_many([b"b%d" % i for i in range(400)])
    assert [r.data for r in Log.open(rados_cluster, ceph.pool, log_name).stream()] == \
        [b"a%d" % i for i in range(150)] + [b"b%d" % i for i in range(400)]


def test_omap_logs_stay_readable_and_writable(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, format="omap")
    assert not lg.views[-1].bounded
    lg.append_many([b"o%d" % i for i in range(50)])
    assert view_objects(lg.name, lg.views[-1]) == [f"zlog.{lg.name}.1.0", f"zlog.{lg.name}.1.1"]
    lg.trim_to(9)
    assert lg.first_position() == 10
    assert [r.kind for r in lg.stream(8, 12)] == [RecordKind.TRIMMED] * 2 + [RecordKind.DATA] * 2


@pytest.mark.parametrize("kw,message", [({"format": "fifo"}, "format"), ({"slots": 0}, "slots"),
                                        ({"byte_bound": 1 << 40}, "byte_bound"), ({"unit": 0}, "unit"),
                                        ({"unit": 3}, "multiple of unit"), ({"unit": 1 << 17}, "unit"),
                                        ({"unit": True}, "unit"), ({"format": "omap", "unit": 4}, "data-format")])
def test_bad_geometry_is_refused(rados_cluster, ceph, log_name, kw, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pyzlog.InvalidRequest, match=message):
        Log.create(rados_cluster, ceph.pool, log_name, **kw)
    with pytest.raises(pyzlog.LogNotFound):
        Log.open(rados_cluster, ceph.pool, log_name)


# ------------------------------------------------------------ Ceph counts it
def ceph_json(ceph, *args: str) -> Any:  # type: ignore[no-untyped-def]
    out = subprocess.run(["ceph", "-c", ceph.conf, *args, "--format", "json"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return json.loads(out)


def pool_stored(ceph, pool: str) -> int:  # type: ignore[no-untyped-def]
    for p in ceph_json(ceph, "df")["pools"]:
        if p["name"] == pool:
            return int(p["stats"]["stored"])
    raise AssertionError(f"no pool {pool} in ceph df")


@pytest.fixture
def own_pool(rados_cluster, ceph):  # type: ignore[no-untyped-def]
    """A pool of the test's own (made and removed), for quotas and counts."""
    if ceph.dir is None:
        pytest.skip("needs the test's own cluster (a pool is made and removed)")
    pool = f"own-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ceph", "-c", ceph.conf, "osd", "pool", "create", pool, "8", "8"], check=True,
                   capture_output=True, timeout=60)
    subprocess.run(["ceph", "-c", ceph.conf, "osd", "pool", "application", "enable", pool, "zlog"], check=True,
                   capture_output=True, timeout=60)
    yield pool
    subprocess.run(["ceph", "-c", ceph.conf, "osd", "pool", "rm", pool, pool, "--yes-i-really-really-mean-it"],
                   capture_output=True, timeout=60)


def test_ceph_counts_the_log_and_its_quota_stops_it(rados_cluster, ceph, log_name, own_pool) -> None:  # type: ignore[no-untyped-def]
    """A 16 MiB quota: appends of 1 MiB a second (Ceph notices a full pool
    within seconds, not at once) are refused with PoolFull before 32 MiB are
    stored, and nothing acknowledged is lost; `ceph df` shows the bytes;
    with the quota raised, appends go on."""
    subprocess.run(["ceph", "-c", ceph.conf, "osd", "pool", "set-quota", own_pool, "max_bytes", str(16 << 20)],
                   check=True, capture_output=True, timeout=60)
    lg = Log.create(rados_cluster, own_pool, log_name, width=2)
    entry = b"q" * 4096
    acked: list[int] = []
    refused: pyzlog.PoolFull | None = None
    for _ in range(64):
        try:
            acked += lg.append_many([entry] * 256)  # 1 MiB
        except pyzlog.PoolFull as e:
            refused = e
            break
        time.sleep(1.0)
    assert refused is not None and refused.pool == own_pool and "quota" in str(refused)
    assert len(acked) * len(entry) < 32 << 20
    with pytest.raises(pyzlog.PoolFull):
        lg.append_async(entry).result(timeout=60)
    deadline = time.monotonic() + 60
    while pool_stored(ceph, own_pool) < len(acked) * len(entry) and time.monotonic() < deadline:
        time.sleep(1)  # the mgr reports usage every second or so
    assert pool_stored(ceph, own_pool) >= len(acked) * len(entry)
    subprocess.run(["ceph", "-c", ceph.conf, "osd", "pool", "set-quota", own_pool, "max_bytes", "0"],
                   check=True, capture_output=True, timeout=60)
    while True:  # space returns: appends go on by themselves once the OSDs know it
        try:
            acked.append(lg.append(entry))
            break
        except pyzlog.PoolFull:
            assert time.monotonic() < deadline + 60, "appends did not resume after the quota was lifted"
            time.sleep(0.5)
    recs = [r for r in Log.open(rados_cluster, own_pool, log_name).stream() if r.kind == RecordKind.DATA]
    assert {r.position for r in recs} >= set(acked)


def test_bench_storage(ceph, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`zlog bench storage` on a small log of small objects: every object within
    its slots, the pool's bytes counted by Ceph, trim_to giving them back (the
    figures are the bench's; the test checks they follow from what it saw)."""
    from test_cli import ok, run

    out = tmp_path / "storage.json"
    before = set(ok(run(ceph, "ls")).split())
    ok(run(ceph, "bench", "storage", "--entries", "20000", "--size", "512", "--slots", "1000",
           "--out", str(out), timeout=600))
    r = json.loads(out.read_text())
    assert r["kind"] == "storage" and r["log"]["slots"] == 1000 and r["log"]["format"] == "data"
    o = r["objects"]
    assert o["count"] == 20 and o["max_entries"] == 1000 and o["after_trim_holding"] == 10
    assert r["bounds_met"] == {"slots": True, "ceph_keys": True, "size": True}
    ps, tr = r["pool_stored"], r["trim"]
    assert ps["log_share"] > 20000 * 512 * 0.9  # Ceph counts the entries' bytes
    assert tr["drop"] == pytest.approx((ps["filled"] - ps["trimmed"]) / ps["log_share"])
    assert tr["target_met"] == (tr["drop"] >= 0.40)
    assert set(ok(run(ceph, "ls")).split()) == before  # the bench removed its log


def test_a_stream_crosses_many_stripes_without_spinning(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Issue 24's soak: a stream (following or not) stopped for good near a
    stripe's end: the scan's read-ahead looped for ever when an object's next
    position was past the range's end while the next position was not."""
    import threading

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=4, slots=1024)  # a stripe: 4096 positions
    for _ in range(0, 5000, 16):
        lg.append_many([b"x" * 256] * 16)
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0))
    assert [r.position for r in recs] == list(range(5008))
    got: list[int] = []
    done = threading.Event()

    def follow() -> None:
        for rec in Log.open(rados_cluster, ceph.pool, log_name).stream(4000, follow=True, hole_wait=1.0):
            got.append(rec.position)
            if rec.position == 9007:
                done.set()
                return

    threading.Thread(target=follow, daemon=True).start()
    for _ in range(0, 4000, 16):
        lg.append_many([b"y" * 256] * 16)
    assert done.wait(120), f"the following stream stopped at {got[-1] if got else None}"
    assert got == list(range(4000, 9008))
