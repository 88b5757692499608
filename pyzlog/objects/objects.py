"""The objects users reach for, each a few lines on StateMachine: a map
(dict-like, with compare-and-set), a counter, a register, and a FIFO queue
consumed exactly once by a group of processes.

Commands are an op byte and codec values (a put is 1 + key + value bytes),
decoded by apply_payload without building a command object. Local reads
(get, len, ...) show the state as played so far; call sync() first for a
linearizable read. Values are shared with the state: do not mutate them.
"""
from __future__ import annotations

import math
import operator
import time
from collections.abc import Iterator
from numbers import Real
from concurrent.futures import Future
from typing import Any

from pyzlog import InvalidRequest

from ._propose import put as _put_native
from .codec import MISSING, dumps, load_from, load_key_value
from .errors import BadEntry, WrongType
from .machine import StateMachine
from .machine import Transaction

MAP_PUT, MAP_DEL, MAP_CAS = 0x10, 0x11, 0x12
CTR_ADD, CTR_SET = 0x20, 0x21
REG_SET, REG_CAS = 0x30, 0x31
Q_PUT, Q_GET, Q_CLAIM, Q_ACK, Q_RELEASE, Q_TAKE = 0x40, 0x41, 0x42, 0x43, 0x44, 0x45

_OP = {op: bytes((op,)) for op in range(256)}


def _args(data: bytes, off: int, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        v, off = load_from(data, off)
        out.append(v)
    if off != len(data):
        raise BadEntry(f"{len(data) - off} bytes after a command")
    return out


def _wrong(obj: StateMachine, op: int) -> WrongType:
    return WrongType(f"{obj.name!r} is a {obj.type_name} here, and op {op:#x} is not one of its commands "
                     "(is the name used as another type elsewhere?)")


#: the longest lease a claim takes (its milliseconds must fit the codec's 64-bit int)
MAX_LEASE_SECONDS = 2**31


def _check_key(key: Any) -> None:
    if type(key) is str:  # the usual key: hashable, and not a list, dict or MISSING
        return
    try:
        hash(key)
    except TypeError:
        raise InvalidRequest(f"a map key must be hashable, not {type(key).__name__}") from None
    if isinstance(key, (list, dict)) or key is MISSING or key is None:
        # (None stands for the whole map in a transaction's read set: a key None
        # read there would be checked against the map's version, and abort)
        raise InvalidRequest(f"a map key cannot be {key!r}")
    if _holds_nan(key):  # stored, it could never be found again: every replica decodes a new NaN
        raise InvalidRequest(f"a map key cannot hold a NaN (it never equals itself): {key!r}")


def _no_missing(what: str, hint: str = "") -> None:
    """MISSING stands for absent (cas, a transaction's deletes): stored as a
    value, a key would read as absent yet be listed, and a queue item could
    not be acked."""
    raise InvalidRequest(f"{what} cannot be MISSING{hint}")


def _holds_nan(key: Any) -> bool:
    if isinstance(key, float):
        return key != key
    return isinstance(key, tuple) and any(_holds_nan(k) for k in key)


def _item_id(qid: Any) -> int:
    """A queue item's id: an int (1.9 and True were taken as item 1)."""
    try:
        if not isinstance(qid, bool):
            return operator.index(qid)
    except TypeError:
        pass
    raise InvalidRequest(f"a queue item's id is an int, not {qid!r}")


# --------------------------------------------------------------------- map
class ReplicatedMap(StateMachine):
    """A replicated dict. put/delete/cas go through the log; get/len/items
    read the local state (sync() first for a linearizable read). Each key
    has a version (position + 1 of its last write) for transactions."""

    type_name = "map"

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[Any, tuple[Any, int]] = {}

    # ------------------------------------------------------------- apply
    def apply_payload(self, data: bytes, off: int, position: int) -> Any:
        op = data[off]
        if op == MAP_PUT:
            key, value = load_key_value(data, off + 1)
            self._data[key] = (value, position + 1)
            return None
        if op == MAP_DEL:
            (key,) = _args(data, off + 1, 1)
            return self._data.pop(key, None) is not None
        if op == MAP_CAS:
            key, expected, new = _args(data, off + 1, 3)
            cur = self._data.get(key)
            if (MISSING if cur is None else cur[0]) != expected or (cur is None) != (expected is MISSING):
                return False
            if new is MISSING:
                self._data.pop(key, None)
            else:
                self._data[key] = (new, position + 1)
            return True
        raise _wrong(self, op)

    def apply(self, command: Any, position: int) -> Any:
        return self.apply_payload(command, 0, position)

    def snapshot(self) -> Any:
        return [[k, v, ver] for k, (v, ver) in self._data.items()]

    def restore(self, state: Any) -> None:
        self._data = {k: (v, int(ver)) for k, v, ver in state}

    def read_version(self, key: Any) -> int:
        if key is None:
            return self.version
        got = self._data.get(key)
        return 0 if got is None else got[1]

    # ------------------------------------------------------------ writes
    def put(self, key: Any, value: Any, timeout: float | None = None) -> None:
        _check_key(key)
        if value is MISSING:
            _no_missing("a map value", " (delete the key instead)")
        payload = _OP[MAP_PUT] + dumps(key) + dumps(value)
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.overlay_of(self, dict)[key] = value
            tx.write(self, payload)
            return
        self.runtime.propose_wait(self, payload, timeout)

    def put_async(self, key: Any, value: Any) -> Future[Any]:
        rt = self._runtime
        if type(key) is str and rt is not None and rt._started and rt._tx.get() is None:
            # the common put (a str or bytes value, outside any transaction) in C
            # (native/propose.c, put): encoded as below, then Runtime._propose's steps
            fut = _put_native(rt, rt._core, self.stream, key, value)
            if fut is not None:
                return fut
        _check_key(key)
        if value is MISSING:
            _no_missing("a map value", " (delete the key instead)")
        return self.runtime.propose(self, _OP[MAP_PUT] + dumps(key) + dumps(value))

    def delete(self, key: Any, timeout: float | None = None) -> bool | None:
        """True if the key was there (None inside a transaction)."""
        _check_key(key)
        payload = _OP[MAP_DEL] + dumps(key)
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.overlay_of(self, dict)[key] = MISSING
            tx.write(self, payload)
            return None
        return bool(self.runtime.propose_wait(self, payload, timeout))

    def cas(self, key: Any, expected: Any, new: Any, timeout: float | None = None) -> bool:
        """Set `key` to `new` if its value is `expected` (MISSING: absent);
        `new` MISSING deletes it. True if it did. In a transaction the
        comparison is made now (the read is validated at commit)."""
        _check_key(key)
        tx = self.runtime.current_transaction()
        if tx is not None:
            if self.get(key, MISSING) != expected:
                return False
            ov = tx.overlay_of(self, dict)
            ov[key] = new
            tx.write(self, _OP[MAP_PUT] + dumps(key) + dumps(new) if new is not MISSING
                     else _OP[MAP_DEL] + dumps(key))
            return True
        payload = _OP[MAP_CAS] + dumps(key) + dumps(expected) + dumps(new)
        return bool(self.runtime.propose_wait(self, payload, timeout))

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        if self.delete(key) is False:
            raise KeyError(key)

    # ------------------------------------------------------------- reads
    def _tx(self) -> Transaction | None:
        rt = self._runtime
        return None if rt is None else rt.current_transaction()

    def get(self, key: Any, default: Any = None) -> Any:
        tx = self._tx()
        if tx is not None:
            if key is None:  # (not a key: it names the whole map in the read set, _check_key)
                raise InvalidRequest("a map key cannot be None")
            ov = tx.overlay.get(self.stream)
            if ov is not None and key in ov:
                v = ov[key]
                return default if v is MISSING else v
            got = self._data.get(key)  # value and version in one lookup: never torn
            tx.read(self, key, 0 if got is None else got[1])
        else:
            got = self._data.get(key)
        return default if got is None else got[0]

    def version_of(self, key: Any) -> int:
        got = self._data.get(key)
        return 0 if got is None else got[1]

    def __getitem__(self, key: Any) -> Any:
        v = self.get(key, MISSING)
        if v is MISSING:
            raise KeyError(key)
        return v

    def __contains__(self, key: Any) -> bool:
        return self.get(key, MISSING) is not MISSING

    def _whole(self) -> dict[Any, Any]:
        tx = self._tx()
        with (self._runtime._lock if self._runtime is not None else _NoLock()):
            if tx is not None:
                tx.read(self, None, self.version)
            out = {k: v for k, (v, _) in self._data.items()}
        if tx is not None:
            for k, v in tx.overlay.get(self.stream, {}).items():
                if v is MISSING:
                    out.pop(k, None)
                else:
                    out[k] = v
        return out

    def __len__(self) -> int:
        return len(self._whole()) if self._tx() is not None else len(self._data)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._whole()))

    def keys(self) -> list[Any]:
        return list(self._whole())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._whole().items())

    def values(self) -> list[Any]:
        return list(self._whole().values())

    def to_dict(self) -> dict[Any, Any]:
        return self._whole()


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ----------------------------------------------------------------- counter
class Counter(StateMachine):
    """A replicated integer: add(n) returns the value after it."""

    type_name = "counter"

    def __init__(self) -> None:
        super().__init__()
        self._value = 0

    def apply_payload(self, data: bytes, off: int, position: int) -> Any:
        op = data[off]
        (n,) = _args(data, off + 1, 1)
        if not isinstance(n, int) or isinstance(n, bool):
            raise BadEntry("a counter command without an integer")
        if op == CTR_ADD:
            self._value += n
        elif op == CTR_SET:
            self._value = n
        else:
            raise _wrong(self, op)
        return self._value

    def snapshot(self) -> Any:
        return self._value

    def restore(self, state: Any) -> None:
        self._value = int(state)

    def _int(self, n: Any) -> None:
        if not isinstance(n, int) or isinstance(n, bool):
            raise InvalidRequest(f"a counter takes integers, not {n!r}")

    def add(self, n: int = 1, timeout: float | None = None) -> int | None:
        """Add `n`; the value after it (None inside a transaction)."""
        self._int(n)
        tx = self.runtime.current_transaction()
        if tx is not None:
            ov = tx.overlay_of(self, lambda: [0, None])
            ov[0] += n
            tx.write(self, _OP[CTR_ADD] + dumps(n))
            return None
        return int(self.runtime.propose_wait(self, _OP[CTR_ADD] + dumps(n), timeout))

    def add_async(self, n: int = 1) -> Future[Any]:
        self._int(n)
        return self.runtime.propose(self, _OP[CTR_ADD] + dumps(n))

    def set(self, n: int, timeout: float | None = None) -> None:
        self._int(n)
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.overlay_of(self, lambda: [0, None])[:] = [0, n]
            tx.write(self, _OP[CTR_SET] + dumps(n))
            return
        self.runtime.propose_wait(self, _OP[CTR_SET] + dumps(n), timeout)

    @property
    def value(self) -> int:
        tx = self.read_guard()
        if tx is not None:
            ov = tx.overlay.get(self.stream)
            if ov is not None:
                total: int = (self._value if ov[1] is None else ov[1]) + ov[0]
                return total
        return self._value

    def __int__(self) -> int:
        return self.value


# ---------------------------------------------------------------- register
class Register(StateMachine):
    """One replicated value (None until set), with compare-and-set."""

    type_name = "register"

    def __init__(self) -> None:
        super().__init__()
        self._value: Any = None

    def apply_payload(self, data: bytes, off: int, position: int) -> Any:
        op = data[off]
        if op == REG_SET:
            (self._value,) = _args(data, off + 1, 1)
            return None
        if op == REG_CAS:
            expected, new = _args(data, off + 1, 2)
            if self._value != expected:
                return False
            self._value = new
            return True
        raise _wrong(self, op)

    def snapshot(self) -> Any:
        return self._value

    def restore(self, state: Any) -> None:
        self._value = state

    def set(self, value: Any, timeout: float | None = None) -> None:
        payload = _OP[REG_SET] + dumps(value)
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.overlay[self.stream] = [value]
            tx.write(self, payload)
            return
        self.runtime.propose_wait(self, payload, timeout)

    def cas(self, expected: Any, new: Any, timeout: float | None = None) -> bool:
        tx = self.runtime.current_transaction()
        if tx is not None:
            if self.get() != expected:
                return False
            self.set(new)
            return True
        return bool(self.runtime.propose_wait(self, _OP[REG_CAS] + dumps(expected) + dumps(new), timeout))

    def get(self) -> Any:
        tx = self.read_guard()
        if tx is not None and self.stream in tx.overlay:
            return tx.overlay[self.stream][0]
        return self._value

    @property
    def value(self) -> Any:
        return self.get()


# ------------------------------------------------------------------- queue
class Queue(StateMachine):
    """A replicated FIFO queue, consumed by a group of processes.

    - put(item) -> the item's id (ids count up from 0 per queue).
    - get() -> (id, item) or None: takes the head for this caller; applied
      once (exactly-once proposals), so each item goes to one caller only.
    - claim(lease) -> (id, item) or None, then ack(id): at-least-once
      processing with exactly one successful ack per item. A claim whose
      lease ran out (by the claiming command's clock, carried in the log, so
      every replica agrees) goes to the next claimer, and then only the new
      holder's ack succeeds. release(id) gives a claim back at once.
    - In a transaction get() takes the head too, validated at commit: a
      consumer that puts its results in the same transaction consumes each
      item exactly once, with its effects.
    """

    type_name = "queue"

    def __init__(self) -> None:
        super().__init__()
        self._items: dict[int, Any] = {}
        self._claims: dict[int, list[Any]] = {}  # id -> [item, consumer, expiry_ms]
        self._next_id = 0

    def apply_payload(self, data: bytes, off: int, position: int) -> Any:
        op = data[off]
        if op == Q_PUT:
            (item,) = _args(data, off + 1, 1)
            qid = self._next_id
            self._next_id += 1
            self._items[qid] = item
            return qid
        if op == Q_GET:
            _args(data, off + 1, 0)
            if not self._items:
                return None
            qid = next(iter(self._items))
            return [qid, self._items.pop(qid)]
        if op == Q_TAKE:
            (qid,) = _args(data, off + 1, 1)
            return self._items.pop(qid, MISSING) is not MISSING
        if op == Q_CLAIM:
            consumer, lease_ms, now_ms = _args(data, off + 1, 3)
            for qid, c in self._claims.items():
                if c[2] <= now_ms:  # expired: to the new claimer
                    c[1], c[2] = consumer, now_ms + lease_ms
                    return [qid, c[0]]
            if not self._items:
                return None
            qid = next(iter(self._items))
            item = self._items.pop(qid)
            self._claims[qid] = [item, consumer, now_ms + lease_ms]
            return [qid, item]
        if op == Q_ACK or op == Q_RELEASE:
            qid, consumer = _args(data, off + 1, 2)
            claim = self._claims.get(qid)
            if claim is None or claim[1] != consumer:
                return False
            del self._claims[qid]
            if op == Q_RELEASE:  # back among the waiting items, in id order
                self._items[qid] = claim[0]
                self._items = dict(sorted(self._items.items()))
            return True
        raise _wrong(self, op)

    def snapshot(self) -> Any:
        return [self._next_id, [[k, v] for k, v in self._items.items()],
                [[k, c[0], c[1], c[2]] for k, c in self._claims.items()]]

    def restore(self, state: Any) -> None:
        next_id, items, claims = state
        self._next_id = int(next_id)
        self._items = {int(k): v for k, v in items}
        self._claims = {int(k): [v, c, int(e)] for k, v, c, e in claims}

    # ------------------------------------------------------------ writes
    def put(self, item: Any, timeout: float | None = None) -> int | None:
        """Append `item`; its id (None inside a transaction)."""
        if item is MISSING:
            _no_missing("a queue item")
        payload = _OP[Q_PUT] + dumps(item)
        tx = self.runtime.current_transaction()
        if tx is not None:
            tx.write(self, payload)
            return None
        return int(self.runtime.propose_wait(self, payload, timeout))

    def put_async(self, item: Any) -> Future[Any]:
        if item is MISSING:
            _no_missing("a queue item")
        return self.runtime.propose(self, _OP[Q_PUT] + dumps(item))

    def get(self, timeout: float | None = None) -> tuple[int, Any] | None:
        """Take the head: (id, item), or None if the queue is empty when the
        command is applied. No other get or claim ever returns this item."""
        tx = self.runtime.current_transaction()
        if tx is not None:
            taken = tx.overlay_of(self, set)
            with self.runtime._lock:
                tx.read(self, None, self.version)
                head = next(((k, v) for k, v in self._items.items() if k not in taken), None)
            if head is None:
                return None
            taken.add(head[0])
            tx.write(self, _OP[Q_TAKE] + dumps(head[0]))
            return head
        got = self.runtime.propose_wait(self, _OP[Q_GET], timeout)
        return None if got is None else (int(got[0]), got[1])

    def claim(self, lease: float = 30.0, consumer: str | None = None,
              timeout: float | None = None) -> tuple[int, Any] | None:
        """Claim the oldest expired claim, else the head, for `lease` seconds."""
        if (not isinstance(lease, Real) or isinstance(lease, bool) or not math.isfinite(lease)
                or not 0 < lease <= MAX_LEASE_SECONDS):
            raise InvalidRequest(f"a lease is a positive number of seconds, at most {MAX_LEASE_SECONDS}, "
                                 f"not {lease!r}")
        who = self._consumer(consumer)
        payload = _OP[Q_CLAIM] + dumps(who) + dumps(math.ceil(lease * 1000)) + dumps(int(time.time() * 1000))
        got = self.runtime.propose_wait(self, payload, timeout)
        return None if got is None else (int(got[0]), got[1])

    def ack(self, qid: int, consumer: str | None = None, timeout: float | None = None) -> bool:
        """Done with a claimed item: True if the claim was still ours (the
        item is consumed, once); False if it was lost to another claimer."""
        payload = _OP[Q_ACK] + dumps(_item_id(qid)) + dumps(self._consumer(consumer))
        return bool(self.runtime.propose_wait(self, payload, timeout))

    def release(self, qid: int, consumer: str | None = None, timeout: float | None = None) -> bool:
        payload = _OP[Q_RELEASE] + dumps(_item_id(qid)) + dumps(self._consumer(consumer))
        return bool(self.runtime.propose_wait(self, payload, timeout))

    def _consumer(self, consumer: str | None) -> str:
        """The consumer named (a str: a claim is held by whoever's name equals
        it), or this runtime's own name."""
        if consumer is None:
            return f"{self.runtime.client_id:016x}"
        if type(consumer) is not str:
            raise InvalidRequest(f"a consumer is named by a str, not {type(consumer).__name__}")
        return consumer

    # ------------------------------------------------------------- reads
    def __len__(self) -> int:
        """Items not taken: waiting, plus claimed but not acknowledged."""
        with self.runtime._lock:
            self.read_guard()
            return len(self._items) + len(self._claims)

    def waiting(self) -> list[tuple[int, Any]]:
        with self.runtime._lock:
            self.read_guard()
            return list(self._items.items())

    def claimed(self) -> dict[int, tuple[Any, str, int]]:
        with self.runtime._lock:
            self.read_guard()
            return {k: (c[0], c[1], c[2]) for k, c in self._claims.items()}

    def peek(self) -> tuple[int, Any] | None:
        with self.runtime._lock:
            self.read_guard()
            return next(iter(self._items.items()), None)


__all__ = ["ReplicatedMap", "Counter", "Register", "Queue", "MISSING"]
