"""Who may use a pool's sequencer: the pool's secret, and a client's credentials.

A client proves to zlog-seqr that it may take positions of a pool's logs
with what it already has: cephx access to the pool. Each pool keeps one
secret object, SECRET_OBJECT in the namespace SECRET_NAMESPACE, that only
clients with caps on the pool can read. Client and daemon derive the
handshake's keys from it (docs/seqr-protocol.md, "Handshake").

The object holds the current key and, after a rotation, the previous one,
each with a generation number. Daemons accept both, so a rotation fails no
client: one still holding the previous key is let in until the next
rotation, and a client refused for its generation reads the object again.
`rotate_secret(drop_previous=True)` revokes the previous key at once (a
leaked key); daemons then close the connections that proved it.

The object is made on first use by whoever may write it (a daemon starting,
a client connecting, or `zlog seqr-secret rotate`), with an exclusive create,
so racing creators agree on one secret.
"""
from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .cluster import open_ioctx
from .errors import EBLOCKLISTED, PermissionDenied, ZlogError, error_for, is_blocklisted

if TYPE_CHECKING:
    import rados

#: the namespace of the pool's secret: caps can grant or withhold it alone
SECRET_NAMESPACE = "zlog.auth"
SECRET_OBJECT = "seqr.secret"
SECRET_BYTES = 32
FORMAT = 1


class SecretMissing(ZlogError):
    """The pool has no sequencer secret, and this client may not make one."""


@dataclass(frozen=True)
class Key:
    generation: int
    secret: bytes
    created: float  # wall clock, for operators


@dataclass(frozen=True)
class PoolSecret:
    keys: tuple[Key, ...]  # newest first: the current key, then at most the previous one

    @property
    def current(self) -> Key:
        return self.keys[0]

    def pairs(self) -> list[tuple[int, bytes]]:
        """(generation, secret) of every key accepted, for pyzlog._seqr."""
        return [(k.generation, k.secret) for k in self.keys]

    def encode(self) -> bytes:
        return json.dumps({"format": FORMAT, "keys": [
            {"generation": k.generation, "secret": k.secret.hex(), "created": k.created} for k in self.keys]},
            sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, pool: str) -> PoolSecret:
        try:
            d = json.loads(raw)
            if d["format"] != FORMAT:
                raise ValueError(f"format {d['format']}")
            keys = tuple(Key(int(k["generation"]), bytes.fromhex(k["secret"]), float(k["created"]))
                         for k in d["keys"])
            if not keys or any(len(k.secret) < 16 or not 0 < k.generation < 2**32 for k in keys):
                raise ValueError("no usable key")
        except (ValueError, KeyError, TypeError) as e:
            raise ZlogError(f"the sequencer secret of pool {pool!r} ({SECRET_NAMESPACE}/{SECRET_OBJECT}) is "
                            f"unreadable ({e}): rotate it with `zlog --pool {pool} seqr-secret rotate`") from None
        return cls(tuple(sorted(keys, key=lambda k: -k.generation)))


def _denied(pool: str, what: str) -> PermissionDenied:
    return PermissionDenied(f"cephx refused {what} the sequencer secret of pool {pool!r} (namespace "
                            f"{SECRET_NAMESPACE}): a sequencer client needs osd 'allow r' there, and whoever "
                            "makes or rotates it 'allow rw' (docs/deploy.md)")


def _is_denied(e: rados.Error) -> bool:
    import rados  # python-rados administers the secret; the unit tier imports this module without it

    return isinstance(e, rados.PermissionError) or abs(getattr(e, "errno", 0) or 0) in (errno.EPERM, errno.EACCES)


def _read(io: rados.Ioctx, pool: str) -> tuple[PoolSecret, int]:
    """The secret and the object's version; ObjectNotFound if there is none."""
    import rados  # python-rados administers the secret; the unit tier imports this module without it

    try:
        raw = io.read(SECRET_OBJECT, 1 << 16)
        version = io.get_last_version()
    except rados.ObjectNotFound:
        raise
    except rados.Error as e:
        if _is_denied(e):
            raise _denied(pool, "reading") from None
        if is_blocklisted(e):
            raise error_for(-EBLOCKLISTED, f"reading the sequencer secret of pool {pool!r}") from None
        raise ZlogError(f"cannot read the sequencer secret of pool {pool!r}: {e}") from None
    return PoolSecret.decode(raw, pool), version


def _new_key(generation: int) -> Key:
    return Key(generation, os.urandom(SECRET_BYTES), time.time())


def read_secret(cluster: rados.Rados, pool: str, create: bool = True) -> PoolSecret:
    """The pool's secret; made (generation 1) if there is none and `create`."""
    import rados  # python-rados administers the secret; the unit tier imports this module without it

    io = open_ioctx(cluster, pool, SECRET_NAMESPACE)
    try:
        for _ in range(3):
            try:
                return _read(io, pool)[0]
            except rados.ObjectNotFound:
                if not create:
                    raise SecretMissing(f"pool {pool!r} has no sequencer secret yet: start zlog-seqr --pool "
                                        f"{pool}, or run `zlog --pool {pool} seqr-secret rotate`") from None
            op = io.create_write_op()
            try:
                op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
                op.write_full(PoolSecret((_new_key(1),)).encode())
                io.operate_write_op(op, SECRET_OBJECT)
            except rados.ObjectExists:
                continue  # made meanwhile by someone else: read theirs
            except rados.Error as e:
                if _is_denied(e):
                    raise _denied(pool, "making") from None
                raise ZlogError(f"cannot make the sequencer secret of pool {pool!r}: {e}") from None
            finally:
                op.release()
        raise ZlogError(f"the sequencer secret of pool {pool!r} keeps vanishing")
    finally:
        io.close()


def rotate_secret(cluster: rados.Rados, pool: str, drop_previous: bool = False) -> PoolSecret:
    """A new current key; the current one becomes the previous (still accepted
    until the next rotation), or with `drop_previous` is revoked at once."""
    import rados

    io = open_ioctx(cluster, pool, SECRET_NAMESPACE)
    try:
        for _ in range(10):
            try:
                old, version = _read(io, pool)
            except rados.ObjectNotFound:
                old, version = None, None
            if old is not None and old.current.generation >= 2**32 - 1:
                raise ZlogError(f"the sequencer secret of pool {pool!r} has run out of generations")
            new = _new_key(old.current.generation + 1 if old else 1)
            secret = PoolSecret((new,) if old is None or drop_previous else (new, old.current))
            op = io.create_write_op()
            try:
                # compare and swap: two rotations at once must not lose a key
                if version is None:
                    op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
                else:
                    op.assert_version(version)
                op.write_full(secret.encode())
                io.operate_write_op(op, SECRET_OBJECT)
                return secret
            except (rados.ObjectExists, rados.ObjectNotFound):
                continue
            except rados.Error as e:
                if abs(getattr(e, "errno", 0) or 0) in (errno.ERANGE, errno.EOVERFLOW):
                    continue  # rotated meanwhile: rotate on top of that
                if _is_denied(e):
                    raise _denied(pool, "rotating") from None
                raise ZlogError(f"cannot rotate the sequencer secret of pool {pool!r}: {e}") from None
            finally:
                op.release()
        raise ZlogError(f"the sequencer secret of pool {pool!r} changed under every rotation attempt")
    finally:
        io.close()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class TLSSettings:
    """TLS for sequencer connections. `ca_file`: verify the daemon's
    certificate (and its name: `server_name`, default the host dialled);
    without it the certificate is not checked, and the handshake's channel
    binding is what defeats a man in the middle."""
    enabled: bool = False
    ca_file: str | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls) -> TLSSettings:
        """PYZLOG_SEQR_TLS=1 (TLS), PYZLOG_SEQR_TLS_CA=FILE (TLS, verified),
        PYZLOG_SEQR_TLS_SERVER_NAME=NAME."""
        ca = os.environ.get("PYZLOG_SEQR_TLS_CA") or None
        return cls(_env_flag("PYZLOG_SEQR_TLS") or ca is not None, ca,
                   os.environ.get("PYZLOG_SEQR_TLS_SERVER_NAME") or None)


class Credentials:
    """What a sequencer client proves itself with: the secrets of the pools it
    uses, read through `cluster` with its own cephx caps (and made there on
    first use if it may), and its TLS settings. `insecure`: also talk to a
    daemon that asks for no proof (zlog-seqr --insecure); default from
    PYZLOG_SEQR_INSECURE. Thread-safe enough: a race reads the secret twice."""

    def __init__(self, cluster: rados.Rados | None, tls: TLSSettings | None = None,
                 insecure: bool | None = None) -> None:
        self.cluster = cluster
        self.tls = TLSSettings.from_env() if tls is None else tls
        self.insecure = _env_flag("PYZLOG_SEQR_INSECURE") if insecure is None else insecure
        self._secrets: dict[str, PoolSecret] = {}
        #: grows whenever a secret read again differs from the one held
        self.version = 0

    def keys(self, pool: str, fresh: bool = False) -> list[tuple[int, bytes]]:
        """(generation, secret) pairs for `pool`; read again with `fresh`.
        Raises PermissionDenied / ZlogError when it cannot be read."""
        if self.cluster is None:
            return []
        if fresh or pool not in self._secrets:
            old = self._secrets.get(pool)
            self._secrets[pool] = read_secret(self.cluster, pool)
            if old is not None and old != self._secrets[pool]:
                self.version += 1
        return self._secrets[pool].pairs()

    def native(self, pool: str, fresh: bool = False) -> dict[str, object]:
        """The auth settings pyzlog._seqr.Client and pyzlog._appender take."""
        return {"pool": pool, "keys": self.keys(pool, fresh), "insecure": self.insecure,
                "tls": self.tls.enabled, "tls_ca": self.tls.ca_file or "",
                "tls_server_name": self.tls.server_name or ""}

    def probe(self) -> dict[str, object]:
        """Settings for a liveness probe (a HELLO naming no pool: any answer
        shows a live daemon, which neither logs nor counts it as a refusal)."""
        return {"probe": True, "tls": self.tls.enabled, "tls_ca": self.tls.ca_file or "",
                "tls_server_name": self.tls.server_name or ""}
