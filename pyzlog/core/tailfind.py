"""Slow tail finding (CORFU) and every other epoch change: seal every object
of the newest view at a new epoch, then take the max over them (writes, fills
and trims). All objects are contacted concurrently with aio, not one after
another. Also the repair of an epoch change someone else left half done."""
from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from . import wire
from .errors import EpochChanged, StaleEpoch, ZlogError
from .layout import Place, stripe_places, view_places
from .metadata import Geometry
from .native import Op
from .state import LogState
from .stripes import give_trim_point

logger = logging.getLogger("pyzlog")


def _each(log: LogState, op: Op, places: list[Place], **fields: Any) -> list[tuple[Place, int, Any]]:
    """`op` on every object at once: [(place, code, value)]."""
    results = log.conn.calls([(log.data, p.oid, op, {**fields, "format": p.format}) for p in places])
    return [(p, code, value) for p, (code, value) in zip(places, results)]


def _check(log: LogState, op: Op, oid: str, code: int) -> None:
    if code < 0:
        raise log.conn.error(code, f"{op.name.lower()} on {oid}", pool=log.data, oid=oid, op=op)


def stat_places(log: LogState, places: list[Place]) -> list[wire.ObjectStat]:
    """The stat of each object that exists, all asked concurrently."""
    stats = []
    for p, code, value in _each(log, Op.STAT, places):
        if code == -errno.ENOENT:
            continue
        _check(log, Op.STAT, p.oid, code)
        stats.append(value)
    return stats


def highest_sealed(log: LogState, places: list[Place]) -> int:
    """The highest epoch sealed on any of `places` (0 for objects not made yet)."""
    return max((st.sealed_epoch for st in stat_places(log, places)), default=0)


def stat_objects(log: LogState, oids: list[str]) -> list[wire.ObjectStat]:
    """stat_places of omap-format objects, by name."""
    return stat_places(log, [_omap(oid) for oid in oids])


def _omap(oid: str) -> Place:
    return Place(oid, wire.View(0, 0, 1), 0, 0)


def highest_position(log: LogState, places: list[Place], epoch: int) -> int | None:
    """The highest position written or filled in any of `places` (None if all
    are empty or missing), all asked concurrently at `epoch`. Raises
    StaleEpoch if an object is sealed above `epoch`."""
    top: int | None = None
    for p, code, pos in _each(log, Op.MAX_POSITION, places, epoch=epoch):
        if code == -errno.ENOENT:
            continue
        _check(log, Op.MAX_POSITION, p.oid, code)
        if pos is not None and (top is None or pos > top):
            top = pos
    return top


def newest_position(log: LogState, meta: wire.Meta) -> int | None:
    """The highest position written, filled or trimmed in the newest view,
    without sealing: a data-format view's open stripes are asked from the
    last one back, until one holds something."""
    view = meta.views[-1]
    if not view.bounded:
        return highest_position(log, view_places(log.name, view), meta.epoch)
    for stripe in range(log.open_stripes(view) - 1, -1, -1):
        top = highest_position(log, stripe_places(log.name, view, stripe), meta.epoch)
        if top is not None:
            return top
    return None


def refresh_with_newest(log: LogState, wanted: Callable[[wire.Meta], bool]) -> tuple[wire.Meta, int | None]:
    """log.refresh(), then newest_position() under the metadata read if
    wanted(meta) (else None), in one round trip where it can: the newest
    view's last open stripe is asked at the epoch this client knew, beside
    the metadata read, and the answers are kept only if the metadata read is
    that snapshot. It only ever moves forward (epoch, stripes, trim point,
    sequencer), so then nothing changed between the two reads that bracket
    the positions' answers: they are what asking after the read would give.
    Otherwise they are dropped and asked again. (A slow append, with no
    sequencer, pays two round trips before its write, not three.)"""
    known = log.meta
    view = known.views[-1]
    stripes = log.open_stripes(view) if view.bounded else 1
    if stripes == 0:
        meta = log.refresh()
        return meta, newest_position(log, meta) if wanted(meta) else None
    places = stripe_places(log.name, view, stripes - 1) if view.bounded else view_places(log.name, view)
    results = log.conn.calls([log.meta_store.request()] + [
        (log.data, p.oid, Op.MAX_POSITION, {"epoch": known.epoch, "format": p.format}) for p in places])
    meta = log.adopt(log.meta_store.parse(*results[0]))
    if not wanted(meta):
        return meta, None
    if meta != known:
        return meta, newest_position(log, meta)
    top: int | None = None
    for p, (code, pos) in zip(places, results[1:]):
        if code == -errno.ENOENT:
            continue
        _check(log, Op.MAX_POSITION, p.oid, code)  # StaleEpoch, as newest_position would raise it
        if pos is not None and (top is None or pos > top):
            top = pos
    for stripe in range(stripes - 2, -1, -1) if view.bounded and top is None else ():
        top = highest_position(log, stripe_places(log.name, view, stripe), meta.epoch)
        if top is not None:
            break
    return meta, top


def seal_places(log: LogState, places: list[Place], epoch: int) -> None:
    """Seal every object at `epoch`. A data-format object of an open stripe
    that nobody made yet is made, sealed at `epoch` (so a writer making it
    late finds it sealed), with the log's trim point. Raises StaleEpoch if
    some object is already sealed at `epoch` or above (someone else is
    sealing)."""
    missing = []
    for p, code, _ in _each(log, Op.SEAL, places, epoch=epoch):
        if code == -errno.ENOENT and p.view.bounded:
            missing.append(p)
        elif code == -errno.ESTALE:
            e = StaleEpoch(f"{p.oid} is sealed at or above epoch {epoch}", errno=errno.ESTALE)
            e.sealed = highest_sealed(log, places)  # type: ignore[attr-defined]  # the next try goes above it
            raise e
        else:
            _check(log, Op.SEAL, p.oid, code)
    if missing:
        inits = log.conn.calls([(log.data, p.oid, Op.INIT, p.init_fields(epoch)) for p in missing])
        for p, (code, _) in zip(missing, inits):
            _check(log, Op.INIT, p.oid, code)
        # made meanwhile by a writer (sealed lower): seal it now; made by us: sealed already
        for p, code, _ in _each(log, Op.SEAL, missing, epoch=epoch):
            if code != -errno.ESTALE:
                _check(log, Op.SEAL, p.oid, code)
        # a trim_to that listed the pool before they existed left them to their maker
        code = give_trim_point(log, missing, epoch)
        if code < 0:
            raise log.conn.error(code, f"trimming {len(missing)} object(s) made while sealing", pool=log.data,
                                 oid=missing[0].oid, op=Op.TRIM_TO)


def close_places(log: LogState, places: list[Place], epoch: int, end: int) -> None:
    """Record on every object (sealed at `epoch` by us) that its view ends at
    `end`: from then on they refuse positions >= end, whatever a client's
    epoch. StaleEpoch if someone sealed one higher meanwhile."""
    for p, code, _ in _each(log, Op.CLOSE, places, epoch=epoch, position=end):
        _check(log, Op.CLOSE, p.oid, code)


def _seal_newest(log: LogState, view: wire.View, stripes: int, epoch: int) -> tuple[list[Place], list[wire.ObjectStat]]:
    """Seal the newest view's objects that may hold its last positions, and
    stat them: an omap view's every object; a data-format view's open
    stripes from the last one back until one holds something (the stripes
    below it hold only lower positions, so they cannot change the tail)."""
    if not view.bounded:
        places = view_places(log.name, view)
        seal_places(log, places, epoch)
        return places, stat_places(log, places)
    sealed: list[Place] = []
    stats: list[wire.ObjectStat] = []
    for stripe in range(stripes - 1, -1, -1):
        places = stripe_places(log.name, view, stripe)
        seal_places(log, places, epoch)
        got = stat_places(log, places)
        sealed += places
        stats += got
        if any(st.max_position is not None or st.view_end is not None for st in got):
            break
    return sealed, stats


def seal_new_epoch(log: LogState, width: int | None, failure: str, attempts: int = 50,
                   above: int = 0, sequencer: str | None = None) -> tuple[int, int]:
    """The one way a log moves to a new epoch, above `above` and any epoch seen.

    Seal the newest view's objects (_seal_newest), then stat them. If one
    records a view end, an earlier reconfiguration was cut in half after
    closing it: finish that one (close the rest at the same end, install a
    view from there). Otherwise the next position is the one after
    everything stored or trimmed; with `width` (a reconfiguration) close the
    objects there and install a view of `width` objects from it (in the
    newest view's format), else install the epoch for the same view (slow
    tail finding). With `sequencer`, the install records it as the log's
    sequencer. Installing is a compare-and-swap on the metadata, which for
    a data-format view also expects the stripes it sealed to be all the open
    ones; a data-format view is closed only once a first compare-and-swap
    has installed the new epoch, since no stripe can be opened after that
    (closing first would let a stripe opened meanwhile hold positions past
    the end), and its objects are sealed above that first epoch, so that no
    one stores anything at it. Races (a seal refused, a CAS lost) retry with jittered
    back-off, and `failure` is the error after `attempts`.

    Returns (new_epoch, next_position): no client at an older epoch can write
    to the newest view's objects, and every position stored or trimmed so
    far is below next_position."""
    delay = 0.005
    for _ in range(attempts):
        meta = log.refresh()
        view = meta.views[-1]
        stripes = view.stripes
        last = stripe_places(log.name, view, stripes - 1) if view.bounded and stripes else view_places(log.name, view)
        epoch = max(meta.epoch, above, highest_sealed(log, last)) + 1
        try:
            places, stats = _seal_newest(log, view, stripes, epoch)
            if any(st.sealed_epoch != epoch for st in stats):
                raise StaleEpoch("sealed higher by someone else")
            ends = {st.view_end for st in stats if st.view_end is not None}
            tops = [st.max_position for st in stats if st.max_position is not None]
            nxt = max(ends) if ends else (max(view.start, max(tops) + 1) if tops else view.start)
            cas_stripes = stripes if view.bounded else wire.ANY_STRIPES
            if not ends and width is None:
                log.meta_store.new_epoch(meta.epoch, epoch, sequencer, stripes=cas_stripes)
            elif not view.bounded:
                # only one proposer can close at one epoch: one end
                close_places(log, places, epoch, nxt)
                log.meta_store.propose_view(meta.epoch, epoch, nxt, width or view.width, sequencer)
            else:
                # The objects are sealed one above the epoch installed first,
                # so nothing is stored at that epoch: a slow append joining it
                # would land past the end the view is closed at next, or in a
                # stripe it opens that nobody closes (the install then expects
                # the stripes as sealed, and retries if one was opened).
                seal_places(log, places, epoch + 1)
                log.meta_store.new_epoch(meta.epoch, epoch, sequencer, stripes=cas_stripes)
                close_places(log, places, epoch + 1, nxt)
                log.meta_store.propose_view(epoch, epoch + 1, nxt, width or view.width, sequencer,
                                            Geometry.of(view), stripes=cas_stripes)
                epoch += 1
        except (StaleEpoch, EpochChanged) as e:
            above = max(above, getattr(e, "sealed", 0))
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.5)
            continue
        # never below the log's trim point: a trim above the tail raises the
        # objects it finds, and the newest view may have had none yet
        return epoch, max(nxt, log.refresh().trim_below)
    raise ZlogError(failure)


def find_tail(log: LogState, attempts: int = 50, above: int = 0,
              sequencer: str | None = None) -> tuple[int, int]:
    """Install a new epoch on `log` (above `above`) and find its tail: slow
    tail finding. With `sequencer`, record it as the log's sequencer (a
    sequencer taking the log over). Returns (epoch, next_position)."""
    return seal_new_epoch(
        log, None,
        f"log {log.name!r}: could not seal a new epoch after {attempts} attempts "
        "(another sequencer or reconfiguration keeps racing)", attempts, above, sequencer)


def repair(log: LogState, stale_epoch: int) -> None:
    """The log's objects refuse `stale_epoch` and no newer epoch has been
    installed for a while: whoever started an epoch change (a sequencer's
    recovery, a reconfiguration) died or stalls between sealing and
    installing. Finish it by installing a newer epoch ourselves."""
    with log.repair_lock:
        if log.refresh().epoch > stale_epoch:
            return  # another thread (or process) got there first
        logger.warning("log %r: objects sealed above epoch %d and no newer epoch installed; "
                       "finishing the epoch change", log.name, stale_epoch)
        try:
            find_tail(log)
        except ZlogError as e:
            logger.warning("log %r: could not finish the epoch change: %s", log.name, e)
