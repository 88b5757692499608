"""Named consumers' committed positions, kept in RADOS beside the log.

A consumer `C` of log `L` in pool `P` keeps its position in one object of
the pool's metadata namespace (layout.META_NAMESPACE), named
``~consumer/L/C``. A log's metadata object is named after the log, and log
names start with a letter or digit and have no '/' (layout.check_name), so
no log can take this name, and '/' splits the log from the consumer however
many '.' either holds.

The position is the next one the consumer has not processed (as a Kafka
committed offset). It sits in the object's omap under ``position`` as 20
decimal digits, so that comparing bytes compares numbers, and every commit
is one write op guarded by ``omap_cmp(position < new)``: a commit that would
move it back (another instance of the consumer got further) fails as a
whole in the OSD, and nothing a client does can lower it but `reset`.
These are plain objects (no class call), so they go through python-rados,
like the registry; each call is one round trip.
"""
from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CommitRefused, InvalidRequest, ZlogError, error_from
from .layout import check_name, check_position

if TYPE_CHECKING:
    import rados

#: every consumer object's name starts with this; no log name can
CONSUMER_PREFIX = "~consumer/"
_POSITION, _AT, _BY = "position", "committed_at", "committed_by"
#: a commit that keeps meeting an object created or removed under it gives up
_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class Committed:
    """A consumer's stored position: the next position it has not processed,
    when it was committed (Unix time) and by which client (host:pid)."""

    position: int
    committed_at: float
    committed_by: str


def consumer_oid(log: str, consumer: str) -> str:
    check_name(log)
    return f"{CONSUMER_PREFIX}{log}/{check_consumer_name(consumer)}"


def check_consumer_name(name: str) -> str:
    """Consumer names follow the rule of log names (layout.check_name)."""
    try:
        return check_name(name)
    except InvalidRequest:
        raise InvalidRequest(f"bad consumer name {name!r}: 1-200 characters of letters, digits, '_', '.', "
                             "'-', starting with a letter or digit") from None


def is_log_object(key: str) -> bool:
    """Is this object of the metadata namespace a log's metadata (not a consumer's)?"""
    return not key.startswith(CONSUMER_PREFIX)


def parse_oid(key: str) -> tuple[str, str] | None:
    """(log, consumer) of a consumer object's name, None for any other object."""
    if not key.startswith(CONSUMER_PREFIX):
        return None
    log, sep, consumer = key[len(CONSUMER_PREFIX):].partition("/")
    return (log, consumer) if sep and log and consumer else None


def log_names(meta_ioctx: rados.Ioctx) -> list[str]:
    """The logs of a pool: the metadata namespace without the consumer objects."""
    return sorted(k for k in (o.key for o in meta_ioctx.list_objects()) if is_log_object(k))


def list_consumers(meta_ioctx: rados.Ioctx, log: str | None = None) -> dict[str, dict[str, Committed]]:
    """{log: {consumer: Committed}} for every consumer of the pool (or of `log`)."""
    out: dict[str, dict[str, Committed]] = {}
    for obj in meta_ioctx.list_objects():
        parsed = parse_oid(obj.key)
        if parsed is None or (log is not None and parsed[0] != log):
            continue
        got = read(meta_ioctx, *parsed)
        if got is not None:  # removed since the listing
            out.setdefault(parsed[0], {})[parsed[1]] = got
    return out


def _who() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pad(position: int) -> bytes:
    return b"%020d" % position


def _parse(vals: dict[str, bytes], oid: str) -> Committed:
    try:
        return Committed(int(vals[_POSITION]), float(vals.get(_AT, b"0")), vals.get(_BY, b"").decode())
    except (KeyError, ValueError) as e:
        raise ZlogError(f"consumer object {oid!r} holds no valid position ({e!r})") from None


def read(meta_ioctx: rados.Ioctx, log: str, consumer: str) -> Committed | None:
    """The stored position of `consumer` of `log`, None if it never committed."""
    import rados

    oid = consumer_oid(log, consumer)
    op = meta_ioctx.create_read_op()
    try:
        it, _ = meta_ioctx.get_omap_vals_by_keys(op, (_POSITION, _AT, _BY))
        meta_ioctx.operate_read_op(op, oid)
        vals = dict(it)
    except rados.ObjectNotFound:
        return None
    except rados.Error as e:
        raise error_from(e, f"read the position of consumer {consumer!r} of log {log!r}") from None
    finally:
        meta_ioctx.release_read_op(op)
    return _parse(vals, oid) if vals else None


def _write_op(meta_ioctx: rados.Ioctx, position: int, *, create: bool, guard: bool) -> Any:
    import rados

    op = meta_ioctx.create_write_op()
    if create:
        op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
    elif guard:
        # stored < new, compared as bytes: the OSD refuses the whole op otherwise
        op.omap_cmp(_POSITION, _pad(position).decode(), rados.LIBRADOS_CMPXATTR_OP_LT)
    meta_ioctx.set_omap(op, (_POSITION, _AT, _BY), (_pad(position), b"%.3f" % time.time(), _who().encode()))
    return op


def commit(meta_ioctx: rados.Ioctx, log: str, consumer: str, position: int) -> int:
    """Store `position` unless the stored one is already there or beyond.

    Returns `position`. Raises CommitRefused (with the stored position) if
    another instance committed further: a position never goes back."""
    import rados

    check_position(position)
    oid = consumer_oid(log, consumer)
    what = f"commit position {position} of consumer {consumer!r} of log {log!r}"
    for _ in range(_ATTEMPTS):
        for create in (False, True):
            op = _write_op(meta_ioctx, position, create=create, guard=True)
            try:
                meta_ioctx.operate_write_op(op, oid)
                return position
            except rados.ObjectNotFound:
                continue  # never committed: create it (exclusively: a racing creator wins, we compare)
            except rados.ObjectExists:
                break  # created meanwhile: compare with what it holds
            except rados.Error as e:
                if getattr(e, "errno", None) != errno.ECANCELED:
                    raise error_from(e, what) from None
                break  # the stored position is not below ours
            finally:
                meta_ioctx.release_write_op(op)
        stored = read(meta_ioctx, log, consumer)
        if stored is None:
            continue  # reset or removed meanwhile: try again
        if stored.position == position:
            return position  # already there (a commit of the same position again)
        if stored.position > position:
            raise CommitRefused(consumer, log, position, stored)
    raise ZlogError(f"{what}: the consumer's object kept being created and removed under the commit")


def commit_async(meta_ioctx: rados.Ioctx, log: str, consumer: str, position: int,
                 done: Callable[[int], None]) -> None:
    """The guarded write of commit() without waiting: done(0 or -errno) runs
    on a librados thread when it returns. Anything but 0 (never committed,
    or the stored position is not below this one) is for commit() to sort
    out, off that thread: a librados callback must not block on librados."""
    import rados

    check_position(position)
    oid = consumer_oid(log, consumer)
    op = _write_op(meta_ioctx, position, create=False, guard=True)

    def finished(comp: Any) -> None:
        meta_ioctx.release_write_op(op)
        done(int(comp.get_return_value()))

    try:
        meta_ioctx.operate_aio_write_op(op, oid, oncomplete=finished)
    except rados.Error as e:
        meta_ioctx.release_write_op(op)
        raise error_from(e, f"commit position {position} of consumer {consumer!r} of log {log!r}") from None


def reset(meta_ioctx: rados.Ioctx, log: str, consumer: str, position: int) -> None:
    """Set the stored position to `position` unconditionally (an operator's
    rewind or skip; instances running meanwhile may commit over it)."""
    import rados

    check_position(position)
    op = _write_op(meta_ioctx, position, create=False, guard=False)
    try:
        meta_ioctx.operate_write_op(op, consumer_oid(log, consumer))
    except rados.Error as e:
        raise error_from(e, f"reset consumer {consumer!r} of log {log!r}") from None
    finally:
        meta_ioctx.release_write_op(op)


def remove(meta_ioctx: rados.Ioctx, log: str, consumer: str) -> bool:
    """Forget a consumer's position; False if it had none."""
    import rados

    try:
        meta_ioctx.remove_object(consumer_oid(log, consumer))
        return True
    except rados.ObjectNotFound:
        return False
    except rados.Error as e:
        raise error_from(e, f"remove consumer {consumer!r} of log {log!r}") from None
