"""pyzlog: a globally ordered, shared, append-only log on Ceph RADOS."""
from pkgutil import extend_path

# Python run from a checkout's root imports this source folder, which has no
# compiled parts (_seqr, _appender, _fastread, cls/): they are found in the
# copy `./dev setup` built and installed from this checkout.
__path__ = extend_path(__path__, __name__)

from .core.cluster import connect
from .core.errors import (ClassNotLoaded, ClusterUnavailable, EntryTooLarge, EpochChanged, Filled,
                     InvalidRequest, LogExists, LogNotFound, NotWritten, PermissionDenied,
                     PoolNotFound, PositionError, ReadOnly, SequencerRefused, SequencerUnavailable,
                     StaleEpoch, Trimmed, ZlogError)
from .client.log import Log
from .client.reader import Record, RecordKind
from .core.sequencer import SequencerClient
from .core.seqr_auth import Credentials, TLSSettings

__all__ = [
    "connect", "Log", "Record", "RecordKind", "SequencerClient", "SequencerUnavailable",
    "SequencerRefused", "Credentials", "TLSSettings",
    "ZlogError", "ClusterUnavailable", "PermissionDenied", "PoolNotFound", "LogNotFound",
    "LogExists", "InvalidRequest", "EntryTooLarge", "ClassNotLoaded", "StaleEpoch",
    "EpochChanged", "PositionError", "ReadOnly", "Filled", "Trimmed", "NotWritten",
]
__version__ = "0.1.0"
