"""Slow tail finding (CORFU): seal every object of the newest view at a new
epoch, then take the max of max_position over them. All objects are
contacted concurrently with aio, not one after another."""
from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import wire
from .errors import EpochChanged, StaleEpoch, ZlogError
from .layout import view_objects
from .objects import ClassIO, check

if TYPE_CHECKING:
    from .log import Log


def stat_objects(data: ClassIO, oids: list[str]) -> list[wire.ObjectStat]:
    """The stat of each object that exists, all asked concurrently."""
    futs = [(oid, data.call_async(oid, "stat", b"", 64)) for oid in oids]
    stats = []
    for oid, fut in futs:
        ret, out = fut.result()
        if ret == -errno.ENOENT:
            continue
        check(ret, "stat", oid)
        stats.append(wire.parse_stat(out))
    return stats


def highest_sealed(data: ClassIO, oids: list[str]) -> int:
    """The highest epoch sealed on any of `oids` (0 for objects not created yet)."""
    return max((st.sealed_epoch for st in stat_objects(data, oids)), default=0)


def highest_position(data: ClassIO, oids: list[str], epoch: int) -> int | None:
    """The highest position written or filled in any of `oids` (None if all
    are empty or missing), all asked concurrently at `epoch`. Raises
    StaleEpoch if an object is sealed above `epoch`."""
    futs = [(oid, data.call_async(oid, "max_position", wire.epoch_only(epoch), 64)) for oid in oids]
    top: int | None = None
    for oid, fut in futs:
        ret, out = fut.result()
        if ret == -errno.ENOENT:
            continue
        check(ret, "max_position", oid)
        pos = wire.parse_max_position(out)
        if pos is not None and (top is None or pos > top):
            top = pos
    return top


def seal_objects(data: ClassIO, oids: list[str], epoch: int) -> int | None:
    """Seal every object at `epoch` and return the highest position written or
    filled in any of them (None if all are empty). Raises StaleEpoch if some
    object is already sealed at `epoch` or above (someone else is sealing)."""
    seals = [(oid, data.call_async(oid, "seal", wire.epoch_only(epoch))) for oid in oids]
    for oid, fut in seals:
        check(fut.result()[0], "seal", oid)
    return highest_position(data, oids, epoch)


def seal_new_epoch(log: Log, install: Callable[[int, int, int], None], failure: str,
                   attempts: int = 50) -> tuple[int, int]:
    """The one way a log moves to a new epoch: seal every object of the newest
    view at an epoch above any seen, find the next position after what they
    hold, then `install(expected_epoch, new_epoch, next_position)` by
    compare-and-swap on the metadata. Races (a seal refused, the CAS lost)
    retry with jittered backoff; `failure` is the error after `attempts`.

    Returns (new_epoch, next_position): no client at an older epoch can write
    to the newest view's objects, and every position written so far is below
    next_position."""
    delay = 0.005
    for _ in range(attempts):
        meta = log.refresh()
        view = meta.views[-1]
        oids = view_objects(log.name, view)
        epoch = max(meta.epoch, highest_sealed(log.data, oids)) + 1
        try:
            top = seal_objects(log.data, oids, epoch)
            nxt = view.start if top is None else max(view.start, top + 1)
            install(meta.epoch, epoch, nxt)
        except (StaleEpoch, EpochChanged):
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.5)
            continue
        log.refresh()
        return epoch, nxt
    raise ZlogError(failure)


def find_tail(log: Log, attempts: int = 50) -> tuple[int, int]:
    """Install a new epoch on `log` (same view) and find its tail: slow tail
    finding. Returns (epoch, next_position)."""
    return seal_new_epoch(
        log, lambda expected, epoch, _nxt: log.meta_store.new_epoch(expected, epoch),
        f"log {log.name!r}: could not seal a new epoch after {attempts} attempts "
        "(another sequencer or reconfiguration keeps racing)", attempts)
