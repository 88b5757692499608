"""Slow tail finding (CORFU) and every other epoch change: seal every object
of the newest view at a new epoch, then take the max over them (writes, fills
and trims). All objects are contacted concurrently with aio, not one after
another. Also the repair of an epoch change someone else left half done."""
from __future__ import annotations

import errno
import logging
import random
import time
from typing import Any

from . import wire
from .errors import EpochChanged, StaleEpoch, ZlogError
from .layout import view_objects
from .native import Op
from .state import LogState

logger = logging.getLogger("pyzlog")


def _each(log: LogState, op: Op, oids: list[str], **fields: Any) -> list[tuple[str, int, Any]]:
    """`op` on every object at once: [(oid, code, value)]."""
    results = log.conn.calls([(log.data, oid, op, fields) for oid in oids])
    return [(oid, code, value) for oid, (code, value) in zip(oids, results)]


def _check(log: LogState, op: Op, oid: str, code: int) -> None:
    if code < 0:
        raise log.conn.error(code, f"{op.name.lower()} on {oid}", pool=log.data, oid=oid, op=op)


def stat_objects(log: LogState, oids: list[str]) -> list[wire.ObjectStat]:
    """The stat of each object that exists, all asked concurrently."""
    stats = []
    for oid, code, value in _each(log, Op.STAT, oids):
        if code == -errno.ENOENT:
            continue
        _check(log, Op.STAT, oid, code)
        stats.append(value)
    return stats


def highest_sealed(log: LogState, oids: list[str]) -> int:
    """The highest epoch sealed on any of `oids` (0 for objects not created yet)."""
    return max((st.sealed_epoch for st in stat_objects(log, oids)), default=0)


def highest_position(log: LogState, oids: list[str], epoch: int) -> int | None:
    """The highest position written or filled in any of `oids` (None if all
    are empty or missing), all asked concurrently at `epoch`. Raises
    StaleEpoch if an object is sealed above `epoch`."""
    top: int | None = None
    for oid, code, pos in _each(log, Op.MAX_POSITION, oids, epoch=epoch):
        if code == -errno.ENOENT:
            continue
        _check(log, Op.MAX_POSITION, oid, code)
        if pos is not None and (top is None or pos > top):
            top = pos
    return top


def seal_objects(log: LogState, oids: list[str], epoch: int) -> None:
    """Seal every object at `epoch`. Raises StaleEpoch if some object is
    already sealed at `epoch` or above (someone else is sealing)."""
    for oid, code, _ in _each(log, Op.SEAL, oids, epoch=epoch):
        _check(log, Op.SEAL, oid, code)


def close_objects(log: LogState, oids: list[str], epoch: int, end: int) -> None:
    """Record on every object (sealed at `epoch` by us) that its view ends at
    `end`: from then on they refuse positions >= end, whatever a client's
    epoch. StaleEpoch if someone sealed one higher meanwhile."""
    for oid, code, _ in _each(log, Op.CLOSE, oids, epoch=epoch, position=end):
        _check(log, Op.CLOSE, oid, code)


def seal_new_epoch(log: LogState, width: int | None, failure: str, attempts: int = 50,
                   above: int = 0, sequencer: str | None = None) -> tuple[int, int]:
    """The one way a log moves to a new epoch, above `above` and any epoch seen.

    Seal every object of the newest view, then stat them all. If one records
    a view end, an earlier reconfiguration was cut in half after closing it:
    finish that one (close the rest at the same end, install a view from
    there). Otherwise the next position is the one after everything stored or
    trimmed; with `width` (a reconfiguration) close every object there and
    install a view of `width` objects from it, else install the epoch for the
    same view (slow tail finding). With `sequencer`, the install records it
    as the log's sequencer. Installing is a compare-and-swap on the
    metadata; races (a seal refused, the CAS lost) retry with jittered
    back-off, and `failure` is the error after `attempts`.

    Returns (new_epoch, next_position): no client at an older epoch can write
    to the newest view's objects, and every position stored so far is below
    next_position."""
    delay = 0.005
    for _ in range(attempts):
        meta = log.refresh()
        view = meta.views[-1]
        oids = view_objects(log.name, view)
        epoch = max(meta.epoch, above, highest_sealed(log, oids)) + 1
        try:
            seal_objects(log, oids, epoch)
            stats = stat_objects(log, oids)
            if any(st.sealed_epoch != epoch for st in stats):
                raise StaleEpoch("sealed higher by someone else")
            ends = {st.view_end for st in stats if st.view_end is not None}
            if ends:
                nxt = max(ends)  # only one proposer can close at one epoch: one end
                close_objects(log, oids, epoch, nxt)
                log.meta_store.propose_view(meta.epoch, epoch, nxt, width or view.width, sequencer)
            else:
                tops = [st.max_position for st in stats if st.max_position is not None]
                nxt = max(view.start, max(tops) + 1) if tops else view.start
                if width is None:
                    log.meta_store.new_epoch(meta.epoch, epoch, sequencer)
                else:
                    close_objects(log, oids, epoch, nxt)
                    log.meta_store.propose_view(meta.epoch, epoch, nxt, width, sequencer)
        except (StaleEpoch, EpochChanged):
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.5)
            continue
        log.refresh()
        return epoch, nxt
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
