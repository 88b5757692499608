"""Typed errors. Every outcome of an object class call maps to one class here."""
from __future__ import annotations

import errno as _errno


class ZlogError(Exception):
    """Base of every error pyzlog raises."""


class ClusterUnavailable(ZlogError):
    """The Ceph cluster could not be reached or did not answer in time."""


class PermissionDenied(ZlogError):
    """cephx refused the client (wrong key, client name or caps)."""


class PoolNotFound(ZlogError):
    """The RADOS pool does not exist."""


class LogNotFound(ZlogError):
    """No log of that name in the pool."""


class LogExists(ZlogError):
    """create() of a log name that is already taken."""


class InvalidRequest(ZlogError):
    """The object class refused a malformed request (EINVAL), or bad arguments."""


class EntryTooLarge(ZlogError):
    """An entry over the size limit (the object class's EFBIG)."""


class ClassNotLoaded(ZlogError):
    """The OSDs do not have cls_zlog loaded (EOPNOTSUPP)."""


class StaleEpoch(ZlogError):
    """The request's epoch is below the one sealed on the object."""


class EpochChanged(ZlogError):
    """A compare-and-swap on the log's metadata lost: the epoch moved on."""


class PositionError(ZlogError):
    """An outcome that concerns one position of the log."""

    def __init__(self, position: int, message: str | None = None) -> None:
        self.position = position
        super().__init__(message or f"position {position}: {self.__doc__}")


class ReadOnly(PositionError):
    """already written (positions are write-once)"""


class Filled(PositionError):
    """filled with junk: never usable"""


class Trimmed(PositionError):
    """trimmed: its space was reclaimed"""


class NotWritten(PositionError):
    """not written yet"""


# errno values returned by cls_zlog (see cls_zlog/cls_zlog.cc).
_POSITION_ERRORS: dict[int, type[PositionError]] = {
    _errno.EROFS: ReadOnly,
    _errno.ENOMSG: Filled,
    _errno.EIDRM: Trimmed,
    _errno.ENODATA: NotWritten,
}


def from_errno(err: int, what: str, position: int | None = None) -> ZlogError:
    """The typed error for a negative (or positive) errno from a class call."""
    err = abs(err)
    if position is not None and err in _POSITION_ERRORS:
        return _POSITION_ERRORS[err](position)
    if err == _errno.ESTALE:
        return StaleEpoch(f"{what}: stale epoch")
    if err == _errno.ECANCELED:
        return EpochChanged(f"{what}: the log's epoch changed concurrently")
    if err == _errno.EINVAL:
        return InvalidRequest(f"{what}: invalid request")
    if err == _errno.EFBIG:
        return EntryTooLarge(f"{what}: entry over the size limit")
    if err == _errno.EOPNOTSUPP:
        return ClassNotLoaded(f"{what}: cls_zlog is not loaded in the OSDs")
    if err in (_errno.ETIMEDOUT, _errno.ESHUTDOWN, _errno.ENOTCONN):
        return ClusterUnavailable(f"{what}: cluster did not answer ({_errno.errorcode.get(err, err)})")
    if err in (_errno.EACCES, _errno.EPERM):
        return PermissionDenied(f"{what}: permission denied by cephx: this client's osd caps on the pool "
                                "lack what cls_zlog needs ('r', 'w', 'class-read' and 'class-write', "
                                "e.g. osd 'allow rwx pool=POOL'; see docs/deploy.md)")
    return ZlogError(f"{what}: {_errno.errorcode.get(err, 'errno')} ({err})")


class SequencerUnavailable(ZlogError):
    """No sequencer answered (not running, unreachable, or timed out)."""


class SequencerRefused(SequencerUnavailable):
    """A sequencer answered but refused this client: no key or a wrong key for
    the pool, a pool it does not serve, TLS required; or the client refused
    the sequencer (it could not prove it holds the pool's key)."""
