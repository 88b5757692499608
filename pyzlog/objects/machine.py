"""The base class of every replicated object.

A subclass holds in-memory state whose only source of truth is the log. It
implements `apply(command, position)`, which must be deterministic: the same
commands in the same order give the same state and results in every
process (no clocks, randomness, I/O or iteration over sets). It proposes
commands with `propose()`, which returns apply's result once this process
has applied the command. For checkpoints it implements `snapshot()` (plain
data: what the codec carries) and `restore(state)`.

Transactions: a method that reads state calls `self.read_guard(key)` first,
so a transaction records the version it read; `propose()` inside a
transaction buffers the command into the commit record. `read_version(key)`
is the version a transaction is validated against: by default the
object's, which is position + 1 of the last command applied to it (0: none).
"""
from __future__ import annotations

import threading
from contextvars import ContextVar
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pyzlog import InvalidRequest

from . import codec
from .errors import NotHosted


class Host(Protocol):
    """What an object and a transaction need of the runtime hosting them
    (runtime.Runtime), named here so this module does not import it."""

    _lock: threading.RLock
    _objects: dict[int, StateMachine]
    client_id: int
    # what ReplicatedMap.put_async's C way looks at (native/propose.c, put)
    _started: bool
    _tx: ContextVar[Transaction | None]
    _core: tuple[Any, ...]

    def current_transaction(self) -> Transaction | None: ...
    def propose(self, obj: StateMachine, payload: bytes) -> Future[Any]: ...
    def propose_wait(self, obj: StateMachine, payload: bytes, timeout: float | None = None) -> Any: ...
    def _commit(self, streams: list[int], body: bytes, timeout: float | None) -> Any: ...
    def sync(self, timeout: float | None = None) -> int: ...


class StateMachine:
    #: recorded in checkpoints, so a checkpoint is never loaded into another type
    type_name: ClassVar[str] = "machine"

    def __init__(self) -> None:
        self._runtime: Host | None = None
        self.name: str = ""
        self.stream: int = 0
        #: position + 1 of the last command applied to this object (0: none)
        self.version: int = 0

    # ------------------------------------------------------ to implement
    def apply(self, command: Any, position: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.apply")

    def snapshot(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.snapshot (needed for checkpoints)")

    def restore(self, state: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__}.restore (needed for checkpoints)")

    def read_version(self, key: Any) -> int:
        """The version a transaction that read `key` is validated against."""
        return self.version

    # --------------------------------------------- encoding of commands
    def encode_command(self, command: Any) -> bytes:
        return codec.dumps(command)

    def apply_payload(self, data: bytes, off: int, position: int) -> Any:
        """Decode the command at data[off:] and apply it (the built-in
        objects decode their own compact forms here)."""
        return self.apply(codec.loads(data[off:]) if off else codec.loads(data), position)

    # ----------------------------------------------------------- for use
    @property
    def runtime(self) -> Host:
        if self._runtime is None:
            raise NotHosted(f"{type(self).__name__} is not hosted by a runtime (Runtime.host)")
        return self._runtime

    def propose(self, command: Any, timeout: float | None = None) -> Any:
        """Append `command` and return apply's result once applied here; in a
        transaction, buffer it into the commit record and return None."""
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.write(self, self.encode_command(command))
            return None
        return self.runtime.propose_wait(self, self.encode_command(command), timeout)

    def propose_async(self, command: Any) -> Future[Any]:
        """Append `command`; a Future of apply's result (not in a transaction)."""
        return self.runtime.propose(self, self.encode_command(command))

    def propose_payload(self, payload: bytes, timeout: float | None = None) -> Any:
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.write(self, payload)
            return None
        return self.runtime.propose_wait(self, payload, timeout)

    def read_guard(self, key: Any = None) -> Transaction | None:
        """Call before reading state: inside a transaction, records the
        version read (and returns the transaction)."""
        rt = self._runtime
        if rt is None:
            return None
        tx = rt.current_transaction()
        if tx is not None:
            tx.read(self, key, self.read_version(key))
        return tx

    def sync(self, timeout: float | None = None) -> None:
        """Play the log to its tail: reads after this see every command
        acknowledged before the call (linearizable reads)."""
        self.runtime.sync(timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} version {self.version}>"


# ------------------------------------------------------------ transactions
# Tango-style optimistic transactions.
# 
# Inside `with runtime.transaction() as tx:` the hosted objects' reads record
# (stream, key, version) and their writes are buffered (with an overlay, so
# the transaction reads its own writes). At the end one commit record is
# appended: the read set with its versions and the write set as the objects'
# own command payloads. Every replica plays it at the same position and
# commits it iff each version read is still the current one there; then it
# applies the writes, each stamped with the record's position. No
# coordinator, no locks: the decision is a function of the log.
# 
# A read-only transaction appends nothing: it commits if every version it
# read is still current when it ends (checked under the state lock), so its
# reads were one consistent state.


@dataclass(frozen=True)
class TxnResult:
    committed: bool
    results: list[Any] = field(default_factory=list)  # each write's result, in order (if committed)


class Transaction:
    def __init__(self, runtime: Host, owner: object = None) -> None:
        self.runtime = runtime
        #: the asyncio task, or else the thread, that opened it: the only one whose commands it takes
        self.owner = owner
        #: its block is over (committed, aborted or left): it takes nothing more
        self.ended = False
        self.reads: dict[tuple[int, Any], int] = {}
        self.writes: list[tuple[int, bytes]] = []
        self.streams: set[int] = set()
        #: per object, state the transaction wrote (objects keep what they need here)
        self.overlay: dict[int, Any] = {}
        self.committed: bool | None = None
        self.results: list[Any] = []
        self.position: int | None = None

    def read(self, obj: StateMachine, key: Any, version: int) -> None:
        self.reads.setdefault((obj.stream, _hashable(key)), version)
        self.streams.add(obj.stream)

    def write(self, obj: StateMachine, payload: bytes) -> None:
        if self.ended:  # (a holder of it past its block: a write would be dropped)
            raise InvalidRequest("this transaction is over: its block has ended")
        if obj._runtime is not self.runtime:
            raise InvalidRequest(f"{obj!r} is not hosted by this transaction's runtime")
        self.writes.append((obj.stream, payload))
        self.streams.add(obj.stream)

    def overlay_of(self, obj: StateMachine, make: Any) -> Any:
        got = self.overlay.get(obj.stream)
        if got is None:
            got = self.overlay[obj.stream] = make()
        return got

    def commit(self, timeout: float | None = None) -> bool:
        rt = self.runtime
        if not self.writes:
            with rt._lock:
                objs = rt._objects
                self.committed = all(objs[s].read_version(k) == v for (s, k), v in self.reads.items())
            return self.committed
        body = codec.dumps([[[s, k, v] for (s, k), v in self.reads.items()],
                            [[s, p] for s, p in self.writes]], codec.MAX_DEPTH)  # keys read: ARG_DEPTH
        result = rt._commit(sorted(self.streams), body, timeout)
        self.committed = bool(result.committed)
        self.results = list(result.results)
        return self.committed


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise InvalidRequest(f"a key must be hashable, not {type(key).__name__}") from None
    return key
