"""One table from errno to typed error (pyzlog.core.errors.error_for)."""
from __future__ import annotations

import errno

import pytest

import pyzlog
from pyzlog.core.errors import error_for

TABLE = [
    (errno.ESTALE, pyzlog.StaleEpoch), (errno.ECANCELED, pyzlog.EpochChanged),
    (errno.EINVAL, pyzlog.InvalidRequest), (errno.EFBIG, pyzlog.EntryTooLarge),
    (errno.EOPNOTSUPP, pyzlog.ClassNotLoaded), (errno.EPROTONOSUPPORT, pyzlog.ProtocolMismatch),
    (errno.EBADMSG, pyzlog.ProtocolMismatch), (errno.EIO, pyzlog.Corrupt),
    (errno.ETIMEDOUT, pyzlog.Timeout), (errno.ESHUTDOWN, pyzlog.Blocklisted),
    (errno.ENOTCONN, pyzlog.ClusterUnavailable), (errno.EDQUOT, pyzlog.PoolFull), (errno.ENOSPC, pyzlog.PoolFull),
    (errno.EACCES, pyzlog.PermissionDenied), (errno.EPERM, pyzlog.PermissionDenied),
    (errno.ENOENT, pyzlog.ZlogError), (errno.EXDEV, pyzlog.ZlogError),
]


@pytest.mark.parametrize("code,kind", TABLE)
def test_every_errno_has_its_error_and_keeps_the_errno(code: int, kind: type) -> None:
    for signed in (code, -code):
        e = error_for(signed, "write on obj.0", oid="obj.0", pool="zlog")
        assert type(e) is kind and e.errno == code
        assert "write on obj.0" in str(e)


@pytest.mark.parametrize("code,kind", [(errno.EROFS, pyzlog.ReadOnly), (errno.ENOMSG, pyzlog.Filled),
                                       (errno.EIDRM, pyzlog.Trimmed), (errno.ENODATA, pyzlog.NotWritten),
                                       (errno.ENOENT, pyzlog.NotWritten)])
def test_position_errors_name_the_position(code: int, kind: type) -> None:
    e = error_for(-code, "read at 7", position=7)
    assert type(e) is kind and e.position == 7 and e.errno == code  # type: ignore[attr-defined]


def test_error_kinds_fit_how_python_code_catches_them() -> None:
    assert isinstance(error_for(-errno.ETIMEDOUT, "x"), TimeoutError)  # a timeout is a TimeoutError too
    assert isinstance(error_for(-errno.EINVAL, "x"), ValueError)  # and a bad argument a ValueError
    assert all(issubclass(k, pyzlog.ZlogError) for _, k in TABLE)
    full = error_for(-errno.EDQUOT, "append", pool="logs")
    assert isinstance(full, pyzlog.PoolFull) and full.pool == "logs" and "logs" in str(full)
    bad = error_for(-errno.EIO, "read_range", oid="zlog.x.1.0", position=3)
    assert isinstance(bad, pyzlog.Corrupt) and bad.oid == "zlog.x.1.0" and "zlog.x.1.0" in str(bad)
