"""Replicated objects on the log (Tango's design on pyzlog).

    import pyzlog
    from pyzlog.objects import Runtime, RadosCheckpoints

    log = pyzlog.Log.open(cluster, "zlog", "state")
    rt = Runtime(log, checkpoints=RadosCheckpoints.for_log(log))
    users, jobs, hits = rt.map("users"), rt.queue("jobs"), rt.counter("hits")
    users["ada"] = {"admin": True}          # appended, applied here, then returns
    rt.sync(); users.get("ada")             # a linearizable read
    with rt.transaction() as tx:            # optimistic, decided by replay
        users["bob"] = users.get("ada")
    tx.committed

Built only on the public pyzlog API (Log, the errors). See docs/objects.md.
"""
from pkgutil import extend_path

# run from a checkout's root, this source folder has no compiled part (_replay): the copy
# `./dev setup` built and installed from this checkout has it (as pyzlog/__init__.py says)
__path__ = extend_path(__path__, __name__)

from .checkpoint import CheckpointInfo, CheckpointStore, RadosCheckpoints
from .codec import MISSING
from .errors import (BadEntry, CheckpointError, NotApplied, NotHosted, ObjectsError, OutcomeUnknown,
                     ResultUnavailable, RuntimeClosed, RuntimeFailed, TransactionAborted, UnsupportedEntry,
                     WrongType)
from .machine import StateMachine
from .objects import Counter, Queue, Register, ReplicatedMap
from .runtime import Runtime, Stats
from .machine import Transaction, TxnResult

__all__ = [
    "Runtime", "Stats", "StateMachine", "ReplicatedMap", "Counter", "Register", "Queue", "MISSING",
    "Transaction", "TxnResult", "RadosCheckpoints", "CheckpointInfo", "CheckpointStore",
    "ObjectsError", "BadEntry", "UnsupportedEntry", "NotHosted", "RuntimeFailed", "RuntimeClosed",
    "OutcomeUnknown", "NotApplied", "ResultUnavailable", "TransactionAborted", "CheckpointError", "WrongType",
]
