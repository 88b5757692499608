"""pyzlog: a globally ordered, shared, append-only log on Ceph RADOS."""
from pkgutil import extend_path

# Python run from a checkout's root imports this source folder, which has no
# compiled parts (_seqr, _appender, _dataplane, libzlog_dataplane, cls/): they are found in the
# copy `./dev setup` built and installed from this checkout.
__path__ = extend_path(__path__, __name__)

try:  # every call to the storage goes through the native data plane: without it, nothing works
    from . import _dataplane  # noqa: F401
except ImportError as e:
    raise ImportError(
        f"pyzlog's native data plane (pyzlog._dataplane) is not built or cannot load ({e}): build it with "
        "`./dev setup` in a checkout, or `pip install .` (needs Debian's librados-dev, libradospp-dev, "
        "cmake and g++)") from e

from .core.batching import AppendBatching
from .core.cluster import connect
from .core.futures import LazyFuture  # the Future async calls hand out; layers on the client hand it out too
from .core.errors import (Blocklisted, ClassNotLoaded, CommitRefused, ClusterUnavailable, Corrupt, CorruptEntry, EntryTooLarge, EpochChanged, Filled,
                          InvalidRequest, LogClosed, LogExists, LogNotFound, NotWritten, PermissionDenied, PoolFull,
                          PoolNotFound, PositionError, ProtocolMismatch, ReadOnly, SequencerRefused,
                          SequencerUnavailable, StaleEpoch, Timeout, Trimmed, ZlogError)
from .client.consumer import Consumer
from .client.log import Log
from .client.reader import HoleClock, Record, RecordKind
from .core.scan import RowSet
from .core.sequencer import SequencerClient
from .core.seqr_auth import Credentials, TLSSettings

__all__ = [
    "connect", "AppendBatching", "Log", "Record", "RecordKind", "SequencerClient", "SequencerUnavailable",
    "SequencerRefused", "Credentials", "TLSSettings",
    "ZlogError", "ClusterUnavailable", "PermissionDenied", "Blocklisted", "PoolNotFound", "LogNotFound", "LogClosed",
    "LogExists", "InvalidRequest", "EntryTooLarge", "ClassNotLoaded", "StaleEpoch",
    "EpochChanged", "PositionError", "ReadOnly", "Filled", "Trimmed", "NotWritten", "PoolFull", "Corrupt", "CorruptEntry",
    "ProtocolMismatch", "Timeout", "CommitRefused", "Consumer", "HoleClock", "LazyFuture", "RowSet",
]
__version__ = "0.1.0"
