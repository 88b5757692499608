"""Making a data-format view's objects (docs/storage.md, "Stripes").

No write makes a data-format object: init does, with the object's geometry,
once the object's stripe is open in the log's metadata. Opening is a
compare-and-swap at the writer's epoch (meta_open_stripe), so a client
whose epoch is stale can neither open a stripe nor, since init seals what
it makes at that epoch, store into a stripe opened after an epoch change
began: tail finding counts the open stripes in its own compare-and-swap
(tailfind.py). A writer, filler or trimmer meets a missing object as
ENOENT, makes it here, and sends its call again to the same position.
Objects made after the log's trim point rose get its watermark here: the
trim_to that raised it listed only the stripes open then (client/ops.py).
"""
from __future__ import annotations

import errno

from .layout import Place, stripe_end, stripe_places, stripe_start, view_end
from .native import Op
from .state import LogState


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
    # once per stripe: the client's metadata shows what it opened, and the
    # trim point as it was once the objects existed
    trim_below = log.refresh().trim_below
    if trim_below > stripe_start(view, place.stripe):
        # the log's trim point rose before the stripe opened or its objects
        # were made (read after both, so a trim_to that did not list the
        # stripe raised it before): its objects refuse what lies below
        for code, _ in log.conn.calls([(log.data, p.oid, Op.TRIM_TO, {"epoch": epoch, "position": trim_below - 1,
                                                                      "format": p.format}) for p in places]):
            if code < 0:
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
