"""Typed errors, and the one table from an errno to the error it means.

Every path that gets a code back from the storage (the native data plane,
the metadata calls, the append pipeline) turns it into an exception with
`error_for`; nothing else maps errno values. Every error carries the errno it
came from (`.errno`, None for errors no errno caused).
"""
from __future__ import annotations

import errno as _errno


class ZlogError(Exception):
    """Base of every error pyzlog raises."""

    #: the errno this error came from, if one did
    errno: int | None = None

    def __init__(self, message: str = "", *, errno: int | None = None) -> None:
        super().__init__(message)
        if errno is not None:
            self.errno = errno


class ClusterUnavailable(ZlogError):
    """The Ceph cluster could not be reached or did not answer in time."""


class Timeout(ClusterUnavailable, TimeoutError):
    """An operation did not finish in time (a TimeoutError too)."""


class PermissionDenied(ZlogError):
    """cephx refused the client (wrong key, client name or caps)."""


class Blocklisted(PermissionDenied):
    """The cluster blocklisted this client's connection (`zlog revoke`, or
    `ceph osd blocklist add`): every OSD refuses its requests with
    EBLOCKLISTED (ESHUTDOWN, 108, on Linux). Nothing is retried: the
    connection never works again, a new one needs a valid key."""


#: the OSDs' answer to a blocklisted client (Ceph's EBLOCKLISTED is ESHUTDOWN on Linux)
EBLOCKLISTED = _errno.ESHUTDOWN


def is_blocklisted(e: BaseException) -> bool:
    """Was `e` the cluster refusing this client as blocklisted (pyzlog's error, or python-rados')?"""
    return isinstance(e, Blocklisted) or abs(getattr(e, "errno", 0) or 0) == EBLOCKLISTED


class PoolNotFound(ZlogError):
    """The RADOS pool does not exist."""


class PoolFull(ZlogError):
    """The pool is at its quota, or the cluster at its full ratio: nothing
    more can be stored until space returns."""

    def __init__(self, message: str = "", *, errno: int | None = None, pool: str | None = None) -> None:
        super().__init__(message, errno=errno)
        self.pool = pool


class LogNotFound(ZlogError):
    """No log of that name in the pool."""


class LogClosed(ZlogError):
    """The Log was closed: its async operations are refused (final: no retry
    gets through)."""


class LogExists(ZlogError):
    """create() of a log name that is already taken."""


class InvalidRequest(ZlogError, ValueError):
    """Bad arguments, or a request the object class refused as malformed (EINVAL)."""


class EntryTooLarge(InvalidRequest):
    """An entry over the size limit (the object class's EFBIG)."""


class ClassNotLoaded(ZlogError):
    """The OSDs do not have cls_zlog loaded (EOPNOTSUPP)."""


class ProtocolMismatch(ZlogError):
    """The object class or the client is too old for the other (EPROTONOSUPPORT),
    or a reply did not parse (EBADMSG)."""


class Corrupt(ZlogError):
    """Stored data is damaged (the object class's EIO): an object whose
    header is lost next to its entries, or an entry that does not parse. The
    object class refuses every call on such an object until an operator
    repairs it (zlog check --deep)."""

    def __init__(self, message: str = "", *, errno: int | None = None, oid: str | None = None,
                 position: int | None = None) -> None:
        super().__init__(message, errno=errno)
        self.oid = oid
        self.position = position


class CorruptEntry(Corrupt):
    """A position whose entry cannot be read because it, or the header of
    the object holding it, is damaged at rest: `position` and `oid` name
    them. Raised by read() and by streams (on_corrupt="fail", the default);
    `zlog check --log NAME --deep` lists every such position, `zlog repair`
    rebuilds a lost header (docs/faults.md)."""

    #: always a position (error_for() and the streams make one only for a position)
    position: int
    #: set by streams: True when the entry's object has lost its header
    #: (not only the entry is damaged); False when not known to be so
    whole: bool = False


class StaleEpoch(ZlogError):
    """The request's epoch is below the one sealed on the object."""


class EpochChanged(ZlogError):
    """A compare-and-swap on the log's metadata lost: the epoch moved on."""


class PositionError(ZlogError):
    """An outcome that concerns one position of the log."""

    def __init__(self, position: int, message: str | None = None, *, errno: int | None = None) -> None:
        self.position = position
        super().__init__(message or f"position {position}: {self.__doc__}", errno=errno)


class ReadOnly(PositionError):
    """already written (positions are write-once)"""


class Filled(PositionError):
    """filled with junk: never usable"""


class Trimmed(PositionError):
    """trimmed: its space was reclaimed"""


class NotWritten(PositionError):
    """not written yet"""


class SequencerUnavailable(ZlogError):
    """No sequencer answered (not running, unreachable, or timed out)."""


class StreamsUnsupported(ZlogError):
    """The sequencer does not answer stream requests (a zlog-seqr older than
    streams): appends with backpointers cannot be made through it."""


class SequencerRefused(SequencerUnavailable):
    """A sequencer answered but refused this client: no key or a wrong key for
    the pool, a pool it does not serve, TLS required, or it kept the client
    over its position budget; or the client refused the sequencer (it could
    not prove it holds the pool's key)."""


class CommitRefused(ZlogError):
    """A named consumer's commit would move its stored position back: another
    instance of the consumer committed further (core.offsets). Nothing was
    written; `committed` is what is stored (an offsets.Committed)."""

    def __init__(self, consumer: str, log: str, attempted: int, committed: object) -> None:
        self.consumer, self.log, self.attempted, self.committed = consumer, log, attempted, committed
        super().__init__(f"consumer {consumer!r} of log {log!r}: cannot commit position {attempted}: "
                         f"position {getattr(committed, 'position', committed)} is already committed "
                         "(another instance got further; positions never go back)")


#: cls_zlog's answers about one position (cls_zlog/ops.h, ZLOG_ERR_*)
_POSITION_ERRORS: dict[int, type[PositionError]] = {
    _errno.EROFS: ReadOnly,
    _errno.ENOMSG: Filled,
    _errno.EIDRM: Trimmed,
    _errno.ENODATA: NotWritten,
}
#: every other errno with a meaning of its own: (error, what it says)
_ERRORS: dict[int, tuple[type[ZlogError], str]] = {
    _errno.ESTALE: (StaleEpoch, "stale epoch"),
    _errno.ECANCELED: (EpochChanged, "the log's epoch changed concurrently"),
    _errno.EINVAL: (InvalidRequest, "invalid request"),
    _errno.EFBIG: (EntryTooLarge, "entry over the size limit"),
    _errno.EOPNOTSUPP: (ClassNotLoaded, "cls_zlog is not loaded in the OSDs (see docs/deploy.md)"),
    _errno.EPROTONOSUPPORT: (ProtocolMismatch, "the object class does not speak this request's version"),
    _errno.EBADMSG: (ProtocolMismatch, "malformed reply from the object class"),
    _errno.EIO: (Corrupt, "stored data is damaged (see zlog check --deep)"),
    _errno.ETIMEDOUT: (Timeout, "the cluster did not answer in time"),
    # the data plane's own closed connection is ENOTCONN: ESHUTDOWN comes only from the OSDs
    EBLOCKLISTED: (Blocklisted, "this client is blocklisted by the cluster (its key was revoked, e.g. by "
                                "`zlog revoke`): the connection cannot be used again; connect anew with a valid key"),
    _errno.ENOTCONN: (ClusterUnavailable, "the connection to the cluster is closed"),
    _errno.EDQUOT: (PoolFull, "the pool is at its quota"),
    _errno.ENOSPC: (PoolFull, "the pool or the cluster is full"),
    _errno.EACCES: (PermissionDenied, "permission denied by cephx"),
    _errno.EPERM: (PermissionDenied, "permission denied by cephx"),
}


def error_for(code: int, what: str, *, position: int | None = None, oid: str | None = None,
              pool: str | None = None) -> ZlogError:
    """The typed error for an errno (negative or positive) from `what`.

    `position`: the call concerned one position (NotWritten for a read of an
    object never created, ReadOnly/Filled/Trimmed/NotWritten for the class's
    answers about it). `oid` and `pool` go into the errors that name them."""
    err = abs(code)
    if position is not None and err in _POSITION_ERRORS:
        return _POSITION_ERRORS[err](position, errno=err)
    if position is not None and err == _errno.ENOENT:
        return NotWritten(position, errno=err)  # the object was never created
    kind, says = _ERRORS.get(err, (ZlogError, f"{_errno.errorcode.get(err, 'errno')} ({err})"))
    where = f" ({oid})" if oid and kind in (Corrupt, PermissionDenied) else ""
    message = f"{what}{where}: {says}"
    if kind is PermissionDenied:
        message += (": this client's osd caps on the pool lack what cls_zlog needs ('r', 'w', 'class-read' "
                    "and 'class-write', e.g. osd 'allow rwx pool=POOL'; see docs/deploy.md)")
    if kind is PoolFull:
        return PoolFull(f"{message}{f' (pool {pool!r})' if pool else ''}: appends resume once space returns",
                        errno=err, pool=pool)
    if kind is Corrupt:  # about one position: CorruptEntry
        return (Corrupt if position is None else CorruptEntry)(message, errno=err, oid=oid, position=position)
    return kind(message, errno=err)


def error_from(e: Exception, what: str) -> ZlogError:
    """The typed error for an exception of a library that carries an errno
    (python3-rados' rados.Error): error_for its code, or a ZlogError
    quoting it when it has none."""
    code = getattr(e, "errno", None)
    return error_for(-code, what) if isinstance(code, int) and code else ZlogError(f"{what}: {e}")
