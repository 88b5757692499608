"""Making a data-format view's objects (docs/storage.md, "Stripes").

No write makes a data-format object: init does, with the object's geometry,
once the object's stripe is open in the log's metadata. Opening is a
compare-and-swap at the writer's epoch (meta_open_stripe), so a client
whose epoch is stale can neither open a stripe nor, since init seals what
it makes at that epoch, store into a stripe opened after an epoch change
began: tail finding counts the open stripes in its own compare-and-swap
(tailfind.py). A writer or filler meets a missing object as ENOENT, makes
it here, and sends its call again to the same position; tail finding
makes the missing objects of the stripes it seals, and a trimmer those of
the stripes it names (not those a listing could not find). Whoever makes
an object gives it the log's trim point (give_trim_point).

Opening is by count: a fill far past the tail opens every stripe below its
own and makes one. Whatever looks at every object of a range of stripes
(trim_to, status, the damage scan) takes them from made_places, whose cost
follows the objects that exist, not the stripes open.
"""
from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from .cluster import open_ioctx
from .errors import error_from
from .layout import Place, place_named, stripe_end, stripe_places, stripe_start, view_end, view_places
from .native import Op
from .state import LogState
from .wire import View

if TYPE_CHECKING:
    import rados

#: a range of stripes with up to this many objects is asked object by object,
#: without looking at the pool (made_places)
NAMED_MAX = 16384


def make(log: LogState, epoch: int, place: Place) -> int:
    """Make the object of `place`, with the rest of its stripe, for calls at
    `epoch`: 0, or -ESTALE if the log's epoch moved on (refresh and retry),
    or the -errno of a call that failed."""
    view = place.view
    meta = log.meta
    newest = meta.views[-1]
    if view.epoch == newest.epoch:
        if place.stripe >= log.open_stripes(view):
            code = log.meta_store.open_stripe(epoch, place.stripe)
            if code:
                return code
            log.opened(view, place.stripe)
        end = None
    else:
        # a closed view's positions all lie in stripes opened before it closed
        end = view_end(meta.views, view)
    places = stripe_places(log.name, view, place.stripe)
    for p, (code, _) in zip(places, log.conn.calls([(log.data, p.oid, Op.INIT, p.init_fields(epoch))
                                                    for p in places])):
        if code < 0:
            return code
    # once per stripe: the client's metadata shows what it opened (read by give_trim_point)
    code = give_trim_point(log, places, epoch)
    if code:
        return code
    last = stripe_end(view, place.stripe)
    if end is not None and last is not None and end < last:
        # what a reconfiguration closed, an object made after it must refuse
        # too: positions at or past the view's end belong to the next view
        for code, _ in log.conn.calls([(log.data, p.oid, Op.CLOSE, {"epoch": epoch, "position": end,
                                                                    "format": p.format}) for p in places]):
            if code < 0 and code not in (-errno.ESTALE, -errno.EINVAL):
                return code
    return 0


def give_trim_point(log: LogState, places: list[Place], epoch: int) -> int:
    """Objects just made (by make, or by tail finding's seal) refuse what
    lies below the log's trim point, read now that they exist: a trim_to
    raises it before it looks for objects, so one it did not find gets it
    here. The trim point is no epoch's: an object sealed above `epoch`
    meanwhile is trimmed at its own. 0 or -errno."""
    trim_below = log.refresh().trim_below
    todo = [p for p in places if trim_below > stripe_start(p.view, p.stripe)]
    at = {p.oid: epoch for p in todo}
    for _ in range(8):
        if not todo:
            return 0
        stale = []
        for p, (code, _) in zip(todo, log.conn.calls([
                (log.data, p.oid, Op.TRIM_TO, {"epoch": at[p.oid], "position": trim_below - 1, "format": p.format})
                for p in todo])):
            if code == -errno.ESTALE:
                stale.append(p)
            elif code < 0:
                return code
        for p, (code, st) in zip(stale, log.conn.calls([(log.data, p.oid, Op.STAT, {"format": p.format})
                                                        for p in stale])):
            if code < 0:
                return code
            at[p.oid] = st.sealed_epoch
        todo = stale
    return -errno.ESTALE


def made_places(log: LogState, view: View, stripes: range | None = None) -> list[Place]:
    """The objects of `stripes` of `view` (default: every open one) that may
    exist, by stripe and index: every name, or, when the names outnumber
    the objects in the pool (a fill far past the tail opened millions of
    stripes), those the pool's listing shows. An object made after the
    listing began is not in it: a trim_to raises the trim point first, and
    its maker gives it the trim point (give_trim_point)."""
    if stripes is None:
        stripes = range(view.stripes) if view.bounded else range(1)
    named = len(stripes) * view.width
    if not view.bounded or named <= NAMED_MAX:
        return view_places(log.name, view, stripes)
    import rados

    ioctx = open_ioctx(log.cluster, log.pool)  # data objects are in the default namespace
    try:
        if named <= _pool_objects(ioctx):
            return view_places(log.name, view, stripes)
        found = [p for o in ioctx.list_objects()
                 if (p := place_named(log.name, view, o.key)) is not None and p.stripe in stripes]
    except rados.Error as e:
        raise error_from(e, f"listing the objects of pool {log.pool!r}") from None
    finally:
        ioctx.close()
    return sorted(found, key=lambda p: (p.stripe, p.index))


def _pool_objects(ioctx: rados.Ioctx) -> int:
    """How many objects the pool holds (every namespace), 0 if Ceph cannot say."""
    import rados

    try:
        return int(ioctx.get_stats()["num_objects"])
    except (rados.Error, KeyError, ValueError):
        return 0
