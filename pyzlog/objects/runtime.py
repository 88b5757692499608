"""The runtime: hosts a process's replicated objects on one log, proposes
their commands, and plays the log in order into them.

One Runtime per process and log (Tango's runtime). Every object it hosts is
named; the name's hash is the object's stream id in each entry's header
(entry.py), so many objects share one log. The runtime plays entries in
position order on one thread of its own:

- what this process appended and got acknowledged at position p is applied
  from memory when the play reaches p (the bytes at p are known: ours);
- every other range is read with Log.stream_batches, with the gap rules of
  the log: a hole below the tail is waited for, then filled as LOST and
  skipped by every replica alike; FILLED is skipped; TRIMMED means the
  history below is gone, and the runtime reloads from a checkpoint.

A proposal is appended (append_async) with a proposal id; its Future gets
apply's result when the play applies the first copy of that id
(sessions.py: a retried append that stored twice is applied once). An
append that fails is retried with the same bytes until `propose_timeout`;
then the proposal is retired (a RETIRE entry), and the caller learns
whether it had been applied (its result) or never will be (NotApplied).

sync() asks the tail and plays to it, so a read after it sees everything
acknowledged before: linearizable reads. Objects must be hosted before the
runtime starts playing (start(), or the first propose or sync): an object
hosted later would have missed what was played.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import random
import threading
import time
from collections import Counter as Tally, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pyzlog import (ClusterUnavailable, HoleClock, InvalidRequest, LazyFuture, Log, LogClosed, RowSet, Timeout,
                    ZlogError)

from . import codec, entry
from .entry import (CMD, FLAG_BACKPOINTERS, HEADER_SIZE, HEADER_U16, MAGIC, MAGIC_U16, MAX_LAYER_VERSION, NOOP, RETIRE,
                    TXN)
from .errors import (BadEntry, CheckpointError, NotApplied, NotHosted, ObjectsError, OutcomeUnknown, ResultUnavailable,
                     RuntimeClosed, RuntimeFailed, TransactionAborted, WrongType)
from .codec import BYTES, SBYTES, SSTR, STR
from .machine import StateMachine
from .objects import MAP_PUT, ReplicatedMap
from .sessions import Session, Sessions
from ._replay import apply_common as _apply_common, apply_common_columns as _apply_common_columns
from ._replay import configure as _configure_replay, row_at as _row_at
from ._propose import Proposal as _Proposal, configure as _configure_propose, landed as _landed_native
from ._propose import answer as _answer, new_pending as _new_pending_native, own_run as _own_run
from ._propose import configure_put as _configure_put, configure_streams as _configure_streams
from ._propose import enqueue as _enqueue_native
from ._propose import propose as _propose_native, stream_entries as _stream_entries
from .streams import BehindTrim as _Trimmed, WalkStats, kinds_of, walk
from .machine import Transaction, TxnResult

if TYPE_CHECKING:
    from .checkpoint import CheckpointInfo, CheckpointStore
    from .objects import Counter, Queue, Register

logger = logging.getLogger("pyzlog.objects")
# the native loop takes the format's constants from where they are defined (entry, codec, objects)
_configure_replay(MAGIC_U16, HEADER_SIZE, CMD, FLAG_BACKPOINTERS, MAP_PUT, SSTR, SBYTES, ReplicatedMap)
_configure_put(CMD, MAP_PUT, SSTR, STR, SBYTES, BYTES)  # (ReplicatedMap.put_async's common case, in C)
_configure_streams(entry.VERSION, FLAG_BACKPOINTERS)  # (a streams batch's entries, in C)

M = TypeVar("M", bound=StateMachine)

#: entries applied per hold of the state lock (readers and checkpoints wait at most this long)
CHUNK = 512
KIND_TRIMMED = RowSet.KIND_NAMES.index("trimmed")  # a RowSet row's kind code
#: seconds between retries of a failed append (doubling up to the max)
RETRY_FIRST, RETRY_MAX = 0.05, 2.0
#: the player's pause after an error it retries (a cluster or sequencer outage)
PLAY_BACKOFF_MAX = 2.0
#: threads sending queued proposals (each one append_many at a time), and
#: the most entries one append_many takes
SENDERS = 2
#: an idle sender looks at the queue this often even if no proposer woke it (a backstop only:
#: every proposal that finds all senders idle wakes one)
SEND_BACKSTOP_SECONDS = 0.5
MAX_BATCH = 256
#: streams on, proposals queued for the senders past which put_async waits for room (as
#: Log.append_async waits past max_in_flight): a proposer faster than the log is held back
MAX_QUEUED = 8 * MAX_BATCH
#: most streams (objects written) one entry may belong to with streams on, and
#: most objects a streams runtime hosts (its stream requests name them all)
MAX_STREAMS_PER_REQUEST = 64
#: while own appends are in flight, how long the player waits for the next
#: position to turn out to be one of them before reading it from the log
#: (where it may still be unwritten, and the read would wait on it as a hole)
OWN_GRACE = 0.005
#: _wake_at with no wait_applied caller
NO_WAITER = 1 << 64
#: wait_applied past the log's tail asks it again after this, doubling up to TAIL_POLL_MAX
TAIL_POLL_FIRST = 0.01
TAIL_POLL_MAX = 1.0


def _seq_clock() -> int:
    """Where a runtime with a fixed client id starts its seqs, at the least:
    microseconds since the epoch. A client proposes far fewer than a million
    entries a second, so the seqs an earlier run of it used stay below this,
    those that a streams replica never reads and those still on their way
    included (the log's own count cannot see either). Its first entry's
    low-water mark then tells every replica to drop such late copies."""
    return time.time_ns() // 1000


def _seq_taken(seq: int) -> NotApplied:
    """What a proposal learns when the log holds another entry of its client
    id under its seq: a runtime started with the same client_id while this
    one's appends were on their way took the seq first (or it was retired)."""
    return NotApplied(f"proposal {seq}: the log holds another entry of this client id under its seq (a runtime "
                      "started with the same client_id took it first, or the seq was retired): it was not "
                      "applied and never will be")


class _Pending(_Proposal):
    """One proposal: its fields are _Proposal's (native/propose.c, which
    makes most of them): seq, data (the entry), future (what the proposer
    holds), deadline, maybe_stored (an attempt failed in a way that may
    have stored it), attempts, retire (a RETIRE entry: the seqs it
    retires), streams (the entry's, with streams on), result and ok
    (apply's outcome, kept until the future is settled), flying (an attempt
    to append it holds a count of the runtime's in flight, given back once,
    by _landed; one attempt at a time) and runtime."""
    __slots__ = ()

    # what the client's async pipeline settles for its append (Log.append_async(future=)): the
    # proposal stands for its append's Future, so none is made per append. set_result(position) is
    # _Proposal's (in C: Runtime._landed at once)
    def set_exception(self, error: BaseException | None) -> None:
        assert self.runtime is not None
        self.runtime._appended(self, None, error if error is not None else ZlogError("append failed"))


_configure_propose(MAGIC, entry.PLAIN_VERSION, _Pending, LazyFuture())


@dataclass
class Stats:
    """What the play has done (for tests, benchmarks and operators)."""
    applied: int = 0          # entries of this layer applied (or skipped as not hosted)
    duplicates: int = 0       # copies of a proposal skipped
    foreign: int = 0          # entries not of this layer
    gaps: int = 0             # filled or lost positions skipped
    read: int = 0             # positions read from the log
    from_memory: int = 0      # own entries applied without reading them back
    reloads: int = 0          # checkpoints loaded
    retries: int = 0          # appends retried
    aborted: int = 0          # transactions aborted by replay


def _owner() -> object:
    """Who a transaction opened now belongs to: the running asyncio task,
    or else the calling thread."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs on this thread
        task = None
    return task if task is not None else threading.current_thread()


def _outside_transaction(obj: StateMachine) -> None:
    """A command that a transaction cannot buffer (an async one, a queue's
    claim, ack or release, a state machine's own) would take effect at once,
    even if the transaction aborts."""
    raise InvalidRequest(f"a command for {obj!r} cannot be part of a transaction (it would take effect "
                         "even if the transaction aborts): make it before or after the transaction")


def _tell(future: Future[Any], error: BaseException) -> None:
    """Settle `future` with `error` unless it is settled already (also when
    another thread settles it between the look and the set)."""
    if not future.done():
        try:
            future.set_exception(error)
        except InvalidStateError:
            pass


class Runtime:
    """Hosts replicated objects on `log` for this process.

    hole_wait: seconds to wait for a hole's writer before filling it (LOST).
    client_id: this runtime's proposal id space (default random); a process
        that restarts with the same id continues its seqs after the log's.
    checkpoints: where checkpoints are written and started from (checkpoint.py).
    follow: if set, seconds between tail checks when idle, so reads without
        sync() are at most about that stale; None: play only on demand.
    propose_timeout: seconds a proposal's append is retried before it is retired.
    keep_decisions: keep {position: committed} of every transaction decided
        here in `decisions` (for audits and tests: it grows with the log).
    streams: append every entry with its streams' backpointers from the
        sequencer, and play only the entries of the objects hosted here by
        following them (docs/objects.md, "Streams"). Every runtime that
        appends to the log must run with streams on, or a stream-only
        reader misses its entries.
    """

    def __init__(self, log: Log, *, hole_wait: float = 2.0, client_id: int | None = None,
                 checkpoints: CheckpointStore | None = None, follow: float | None = None,
                 propose_timeout: float = 120.0, keep_decisions: bool = False, streams: bool = False) -> None:
        if not isinstance(log, Log):
            raise InvalidRequest(f"Runtime needs a pyzlog.Log, not {type(log).__name__}")
        if client_id is not None and not (isinstance(client_id, int) and 0 < client_id < 1 << 64):
            raise InvalidRequest(f"client_id is an integer in 1..2**64-1, not {client_id!r}")
        try:  # (as comparisons: NaN fails each, where a NaN propose_timeout retried a failing append for ever)
            good = hole_wait >= 0 and propose_timeout > 0 and (follow is None or follow > 0)
        except TypeError:
            good = False
        if not good:
            raise InvalidRequest("hole_wait >= 0, propose_timeout > 0 and follow > 0 (or None) are numbers, not "
                                 f"{hole_wait!r}, {propose_timeout!r}, {follow!r}")
        self.log = log
        self.streams = bool(streams)
        self.walk_stats = WalkStats()
        self.hole_wait = hole_wait
        #: the player's gap clock, kept across its reads (one per gap between
        #: own entries): a hole is filled hole_wait after the player first knew
        #: it lay below the tail, not waited for anew by each read that meets it
        self._holes = HoleClock(hole_wait)
        self.follow = follow
        self.propose_timeout = propose_timeout
        self.checkpoints = checkpoints
        self.client_id = client_id or random.SystemRandom().randrange(1, 1 << 64)
        self._fixed_id = client_id is not None
        self.stats = Stats()
        self.decisions: dict[int, bool] | None = {} if keep_decisions else None

        self._objects: dict[int, StateMachine] = {}
        self._initial: dict[int, Any] = {}  # each object's empty state, to reset it on a reload
        self._lock = threading.RLock()  # the state: held while applying, snapshotting, validating
        # progress, targets, own positions. Held with `with self._cv_lock` (a lock's __enter__ is C), never
        # `with self._cv`: a Ctrl-C raised inside Condition.__enter__ (Python code) after it took the
        # lock left it held for good, and every thread of the runtime waited on it
        self._cv_lock = threading.Lock()
        self._cv = threading.Condition(self._cv_lock)
        self.applied = 0  # every position below this is played
        self._target = 0
        #: positions wait_applied callers wait for past the tail, and how many wait for each
        self._wants: Tally[int] = Tally()
        #: positions any wait_applied caller waits for, and the lowest (the player wakes
        #: waiters once `applied` reaches it, not after every chunk it applies)
        self._waiting: Tally[int] = Tally()
        self._wake_at = NO_WAITER
        self._tail_poll = TAIL_POLL_FIRST  # seconds between tail polls while someone wants more
        self._next_tail_poll = 0.0
        self._poller: threading.Thread | None = None  # asks the tail for them (_poll_tail)
        self._walk_to = 0  # streams: the player walks toward it first (_wait_applied)
        self._own: dict[int, bytes] = {}  # acknowledged own appends not yet played
        self._in_flight = 0  # own appends submitted, not yet acknowledged or failed (under _cv)
        self._grace_pos, self._grace_end = -1, 0.0
        self._queue: deque[_Pending] = deque()  # proposals waiting for a sender
        self._send_cv_lock = threading.Lock()  # held as _cv_lock is
        self._send_cv = threading.Condition(self._send_cv_lock)
        self._idle_senders = 0
        self._room = threading.Condition(self._send_cv_lock)  # the queue went below MAX_QUEUED
        self._room_waiters = 0  # proposers waiting on _room (under _send_cv_lock)
        #: a proposer has woken an idle sender that has not looked at the queue yet: the
        #: proposers after it need not (a burst of proposals meeting idle senders, as when a
        #: batch's futures settle at once, each took the lock to notify: 1.2 us a put)
        self._nudged = False
        self._senders: list[threading.Thread] = []
        # one thread plays at a time: the player, or a caller (_play_here). An RLock (C): its
        # _is_owned tells a caller whether a Ctrl-C just after its acquire left it holding it
        self._play_lock: Any = threading.RLock()  # (typeshed does not list the C RLock's _is_owned)
        self._applying = False  # _apply_rows is under way (or stopped half way by an exception)
        self._own_heap: list[int] = []
        self._pending: dict[int, _Pending] = {}
        self._sessions = Sessions()
        self._streams_seen: set[int] = set()
        #: every stream with an entry below `applied` is in _streams_seen: a replica of
        #: the whole log, from its start or from a complete checkpoint (so its own can be)
        self._sees_every_stream = not self.streams
        self._done: list[_Pending] = []  # applied, to settle once the state lock is let go
        self._one_stream: dict[int, tuple[int]] = {}  # (stream,) per object: one tuple, not one per proposal

        self._plock = threading.Lock()  # seqs and the low-water mark
        self._next_seq = 1
        self._unsettled: deque[int] = deque()
        self._settled: set[int] = set()
        #: what native/propose.c takes and changes (under these locks, as the Python does)
        self._core = (self._plock, self._cv_lock, self._pending, self._unsettled, self._settled, self._own,
                      self._own_heap, self._queue, self._cv)

        self._started = False
        self._start_lock = threading.Lock()
        #: close() was called: no new proposal is taken (those pending are still sent and played)
        self._closing = False
        #: close() is past its drain: the player, the senders and the retrier stop
        self._stopping = False
        self._closed = False  # close() got to the end: every pending proposal is told
        #: an apply stopped by Ctrl-C (or SystemExit): an object may be half changed, so the
        #: state must never leave this runtime (state_snapshot, checkpoint refuse)
        self._torn: BaseException | None = None
        self._failed: BaseException | None = None
        self._player: threading.Thread | None = None
        self._retrier: threading.Thread | None = None
        self._retry_q: list[tuple[float, int, _Pending]] = []  # (when, tie, pending) heap, under _cv
        self._retry_tie = 0
        #: the open transaction: a context variable, so asyncio tasks sharing a thread do not share it
        #: (a plain put of one went into another's transaction); a task or thread started inside the
        #: block inherits the variable but is not its owner (current_transaction)
        self._tx: ContextVar[Transaction | None] = ContextVar("pyzlog-transaction", default=None)

    # ------------------------------------------------------------ hosting
    def host(self, name: str, obj: M) -> M:
        """Host `obj` under `name` (before the runtime starts playing)."""
        if not isinstance(obj, StateMachine):
            raise InvalidRequest(f"host() takes a StateMachine, not {type(obj).__name__}")
        sid = entry.stream_id(name)
        with self._start_lock:
            if self._started:
                raise InvalidRequest(f"host {name!r} before the runtime starts playing the log (it would have "
                                     "missed what was played)")
            if obj._runtime is not None:
                raise InvalidRequest(f"{obj!r} is already hosted")
            other = self._objects.get(sid)
            if other is not None:
                raise InvalidRequest(f"an object named {other.name!r} is already hosted here"
                                     + ("" if other.name == name else " (its stream id is the same)"))
            if self.streams and len(self._objects) >= MAX_STREAMS_PER_REQUEST:
                raise InvalidRequest(f"with streams on, a runtime hosts at most {MAX_STREAMS_PER_REQUEST} objects "
                                     "(one sequencer request names their streams): host the rest in another "
                                     "runtime, or play the whole log (streams=False)")
            obj._runtime, obj.name, obj.stream = self, name, sid
            try:
                self._initial[sid] = codec.dumps(obj.snapshot(), codec.MAX_DEPTH)
            except NotImplementedError:
                self._initial[sid] = None
            self._objects[sid] = obj
        return obj

    def _get_or_host(self, name: str, cls: type[M]) -> M:
        obj = self._objects.get(entry.stream_id(name))
        if obj is not None:
            if type(obj) is not cls or obj.name != name:
                raise WrongType(f"{name!r} is hosted here as a {type(obj).__name__}, not a {cls.__name__}")
            return obj
        return self.host(name, cls())

    def map(self, name: str) -> ReplicatedMap:
        return self._get_or_host(name, ReplicatedMap)

    def counter(self, name: str) -> Counter:
        from .objects import Counter
        return self._get_or_host(name, Counter)

    def register(self, name: str) -> Register:
        from .objects import Register
        return self._get_or_host(name, Register)

    def queue(self, name: str) -> Queue:
        from .objects import Queue
        return self._get_or_host(name, Queue)

    def hosted(self) -> dict[str, StateMachine]:
        return {o.name: o for o in self._objects.values()}

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Runtime:
        """Start playing: from the newest usable checkpoint if there is one,
        else from position 0 (CheckpointError if the log is trimmed there)."""
        with self._start_lock:
            if self._started:
                return self
            self._check_open()
            # The threads start first, held at `gate` (a lock this thread holds): the player
            # connects to the sequencer (its first request, a tail or a stream's, would) while this
            # thread reads the first position and any checkpoint. The gate is let go by one C call
            # in the finally, so a Ctrl-C anywhere leaves either a started runtime whose threads all
            # run, or one not started whose threads return (close() joins them: they stay
            # _player and _senders until the next start).
            gate = threading.Lock()
            gate.acquire()
            try:
                self._player = threading.Thread(target=self._run, args=(gate,),
                                                name=f"zlog-objects-play-{self.log.name}", daemon=True)
                self._senders = [threading.Thread(target=self._send_loop, args=(gate,), daemon=True,
                                                  name=f"zlog-objects-send-{self.log.name}-{i}")
                                 for i in range(SENDERS if self.streams else 0)]  # (without streams: _submit)
                for t in (self._player, *self._senders):
                    t.start()
                first = self.log.first_position()
                info = self._load_newest(first) if self.checkpoints is not None else None
                if info is None and first > 0:
                    raise CheckpointError(f"log {self.log.name!r} is trimmed below {first} and no checkpoint "
                                          "covers the objects hosted here: the state cannot be rebuilt")
                self._started = True  # (no call between this and the release: no Ctrl-C can come between)
            finally:
                gate.release()
        if self._fixed_id:  # a restarted client: its seqs go on above every one it used before
            self.sync()
            with self._plock:
                self._next_seq = max(self._next_seq, self._sessions.max_seq(self.client_id) + 1, _seq_clock())
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop playing. The log stays open. No proposal is taken from the
        call on (RuntimeClosed); those pending are first sent and played,
        for up to half of `timeout`, so their Futures tell what happened to
        each: an append stored before the play stops is applied by every
        replica, and its proposer learns its result, never RuntimeClosed.
        (Not from the runtime's own threads or the client's: a done-callback
        that closes the runtime cannot wait for the play it runs on.) What
        is still pending then fails with RuntimeClosed. Appends already sent
        (a sender's batch, a retry) are waited for, up to `timeout`, so that
        they land before a runtime started again with this client id
        appends: that one's first entry drops later copies by its low-water
        mark, which a streams replica of other objects does not read."""
        start = time.monotonic()
        end = start + timeout
        with self._cv_lock:
            if self._closed:
                return
            self._closing = True
            self._cv.notify_all()  # (a wait_applied is told RuntimeClosed)
        me = threading.current_thread()
        # (not on the client's completion or retry thread: what is on its way lands on that thread)
        on_client_thread = me.name.startswith("pyzlog-")
        try:
            with self._send_cv_lock:
                self._room.notify_all()  # a proposer held back for room: its proposal is queued, and sent
            if self._started and not on_client_thread and me is not self._player and me not in self._senders:
                self._drain(start + timeout / 2)  # the other half: the threads' ends and the appends on their way
            self._stop_threads()
            for t in (self._player, self._retrier, *self._senders):
                if t is not None and t is not me:
                    try:
                        t.join(max(0.0, end - time.monotonic()))
                    except RuntimeError:  # never started: a Ctrl-C in its start()
                        pass
            with self._cv_lock:
                while self._in_flight and not on_client_thread and (left := end - time.monotonic()) > 0:
                    self._cv.wait(left)
                if self._in_flight:
                    logger.warning("runtime of %r closed with %d own appends still on their way: their proposals "
                                   "are told RuntimeClosed, yet each may still be applied, if it lands before a "
                                   "runtime of client id %d appends again", self.log.name, self._in_flight,
                                   self.client_id)
        finally:
            # also when a wait above is interrupted (Ctrl-C): the player and senders are stopping,
            # so a proposal left pending now would never be told anything. Told before it is taken
            # out: an interrupt between the two leaves it for the next close(), told already.
            self._stop_threads()
            while left_over := list(self._pending.items()):
                for seq, p in left_over:
                    _tell(p.future, RuntimeClosed("the runtime was closed before the proposal was applied"))
                    self._pending.pop(seq, None)
            self._closed = True

    def _drain(self, end: float) -> None:
        """close()'s first step: until `end`, wait for the pending proposals
        (no new one is taken) to be settled: sent, played, and told."""
        while True:
            with self._cv_lock:
                futures = [p.future for p in self._pending.values() if not p.future.done()]
            if not futures:
                return
            for f in futures:  # one at a time: LazyFuture's wait lets go of its lock when interrupted
                left = end - time.monotonic()
                if left <= 0:
                    return
                try:
                    f.exception(left)
                except CancelledError:
                    continue
                except TimeoutError:
                    return

    def _stop_threads(self) -> None:
        """Tell the player, the senders and the retrier to stop (and anything
        waiting on the runtime to look again); no new proposal is taken."""
        with self._cv_lock:
            self._closing = self._stopping = True
            self._cv.notify_all()
        with self._send_cv_lock:
            self._send_cv.notify_all()
            self._room.notify_all()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._failed is not None:
            raise RuntimeFailed(f"the runtime stopped: {self._failed}") from self._failed
        if self._closing:
            raise RuntimeClosed("the runtime is closed")

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    # ------------------------------------------------------------ proposing
    def propose(self, obj: StateMachine, payload: bytes) -> Future[Any]:
        """Append a command for `obj` (hosted here); a Future of its result."""
        if obj._runtime is not self:
            raise NotHosted(f"{obj!r} is not hosted by this runtime")
        if self._tx.get() is not None and self.current_transaction() is not None:
            _outside_transaction(obj)
        return self._propose(CMD, obj.stream, payload)

    def propose_wait(self, obj: StateMachine, payload: bytes, timeout: float | None = None) -> Any:
        """propose(obj, payload).result(timeout), with the append made and
        the log played on the calling thread when it can be (no thread
        switch on the way: what one-at-a-time callers wait for)."""
        if obj._runtime is not self:
            raise NotHosted(f"{obj!r} is not hosted by this runtime")
        if self._tx.get() is not None and self.current_transaction() is not None:
            _outside_transaction(obj)
        return self._call(CMD, obj.stream, payload, timeout)

    def _call(self, kind: int, stream: int, body: bytes, timeout: float | None,
              streams: tuple[int, ...] | None = None) -> Any:
        self._not_on_player("wait for a proposal")
        p = self._new_pending(kind, stream, body, None, streams)
        p.attempts += 1
        failed: BaseException | None = None  # an append's error not yet handed to _append_failed
        pos = -1  # where the append stored the entry, once it returned
        played = False  # this thread's play (and its wake-up of the player) is over
        try:
            with self._cv_lock:
                closing = self._closing  # looked at again once counted: close() waits for what it counts
                if not closing:
                    self._in_flight += 1
                    p.flying = True  # (no call between this and the count: no Ctrl-C can come between)
            if closing:
                self._drop(p, RuntimeClosed("the runtime is closed"))
                return p.future.result(0)
            try:
                if self.streams:
                    pos, stored = self._store([p])[0]
                else:
                    pos, stored = self.log.append(p.data), p.data
            except Exception as e:  # noqa: BLE001 - retried, or told, like any failed append
                failed = e
                self._landed(None, p=p)
                self._append_failed(p, e)
                failed = None
            else:
                self._landed(pos, stored, wake=False, p=p)
                self._play_here(pos + 1)
                played = True
        finally:
            if pos >= 0 and not p.flying and not played:
                # Ctrl-C after the append landed, before this thread's play was over: the player takes
                # it from here (_landed woke nobody, and an own append that landed above this one
                # meanwhile did not either)
                with self._cv_lock:
                    if self._target < pos + 1:
                        self._target = pos + 1
                    self._cv.notify_all()
            if p.flying or failed is not None:
                # Ctrl-C (or SystemExit) before the append's outcome was counted: before it,
                # mid-append, or between its return and _landed. The entry may be stored. The caller stops
                # here; the proposal is retried in the background like any append that may
                # have been stored, so it is applied at most once and its outcome still
                # reaches the play
                self._landed(None, p=p)
                p.maybe_stored = True
                self._append_failed(p, ZlogError("the append was interrupted"))
        return p.future.result(timeout)

    def _store(self, batch: list[_Pending]) -> list[tuple[int, bytes]]:
        """Streams on: append the batch's entries, each with its streams'
        backpointers (one sequencer request per set of streams); (position,
        bytes stored) of each. Entries of no stream are appended plainly."""
        out: list[tuple[int, bytes] | None] = [None] * len(batch)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(batch):
            groups.setdefault(p.streams, []).append(i)
        for streams, idx in groups.items():
            datas = [batch[i].data for i in idx]
            if not streams:
                for i, pos in zip(idx, self.log.append_many(datas)):
                    out[i] = (pos, batch[i].data)
                continue
            made: dict[int, bytes] = {}

            def build_all(first: int, k: int, answer: Any, round_: list[bytes],
                          made: dict[int, bytes] = made) -> list[bytes]:
                # each entry with its backpointers, in C (native/propose.c: entry_backpointers and
                # entry.with_backpointers for the round)
                try:
                    stored = _stream_entries(first, k, answer, round_, Log.STREAM_FIRST_LEVEL)
                except (ValueError, OverflowError) as e:  # (a backpointer not below its entry: nothing sent)
                    raise InvalidRequest(f"entries with backpointers: {e}") from None
                made.update(zip(range(first, first + len(stored)), stored))
                return stored

            for i, pos in zip(idx, self.log.append_streams(list(streams), datas, build_all=build_all)):
                out[i] = (pos, made[pos])
        return out  # type: ignore[return-value]

    def _new_pending(self, kind: int, stream: int, body: bytes, retire: list[int] | None = None,
                     streams: tuple[int, ...] | None = None) -> _Pending:
        """A new proposal, registered: its seq and low-water mark (under
        _plock), its entry and its record, in C (native/propose.c; an error
        between the steps leaves its seq settled, nothing registered)."""
        if not self._started:
            self.start()
        if self._failed is not None or self._closing:
            self._check_open()
        p: _Pending = _new_pending_native(self, self._core, kind, stream, body, retire,  # (configured: a _Pending)
                                          self._streams_of(kind, stream) if streams is None else streams)
        return p

    def _streams_of(self, kind: int, stream: int) -> tuple[int, ...]:
        if kind != CMD:
            return ()
        streams = self._one_stream.get(stream)
        if streams is None:
            streams = self._one_stream[stream] = (stream,)
        return streams

    def _propose(self, kind: int, stream: int, body: bytes, retire: list[int] | None = None,
                 streams: tuple[int, ...] | None = None) -> Future[Any]:
        if self.streams or retire is None:
            if not self._started:
                self.start()
            if self._failed is not None or self._closing:
                self._check_open()
            if streams is None:
                streams = self._streams_of(kind, stream)
            if self.streams:
                # an entry is made once its position and backpointers are known: the senders append
                # what is queued in batches (append_streams), one sequencer request each. Registered
                # and queued in C (native/propose.c, enqueue: no interrupt can leave it registered
                # and not queued), then _queued
                return _enqueue_native(self, self._core, kind, stream, body, retire, streams)
            # the common proposal, in C (native/propose.c): _new_pending's and _submit's steps, with
            # what can go wrong between them handed to _settle, _not_sent and _send_failed (one call)
            return _propose_native(self, self._core, kind, stream, body, streams)
        p = self._new_pending(kind, stream, body, retire, streams)
        tried = p.attempts  # into the client's async append pipeline, from this thread
        try:
            self._submit(p)
        except BaseException:
            if p.attempts == tried:  # (Ctrl-C) as _submit was called: never sent, nothing counted
                self._drop(p, NotApplied(f"proposal {p.seq}: interrupted before it was appended"))
            raise
        return p.future

    def _queued(self, p: _Pending) -> Future[Any]:
        """Streams on: p was just queued for the senders (its attempt
        counted; native/propose.c, enqueue). p's future."""
        q = self._queue  # (p counts as in flight while queued: _grace_left)
        if self._stopping or self._failed is not None:  # close() or _fail may have told the pending ones
            self._not_sent(p, None)                       # before this one was registered
            return p.future
        # wake a sender for the first of a batch (one that wakes takes what is
        # queued, and one going idle looks first), when every sender is idle
        # (two proposers may both see a length of 2), or past one batch's worth
        idle = self._idle_senders
        if idle and (len(q) == 1 or idle == SENDERS or len(q) > MAX_BATCH) and not self._nudged:
            self._nudged = True
            with self._send_cv_lock:
                self._send_cv.notify()
        if len(q) > MAX_QUEUED:
            self._wait_for_room()
        return p.future

    def _wait_for_room(self) -> None:
        """Hold a proposer back while more than MAX_QUEUED proposals wait
        for the senders (its own is queued already: an interrupt here loses
        nothing), until they take some or the runtime closes or fails. Not
        on the thread playing the log (a Future's callback): its play would wait."""
        if threading.current_thread() is self._player or self._play_lock._is_owned():
            return
        with self._send_cv_lock:
            self._room_waiters += 1
            try:
                while len(self._queue) > MAX_QUEUED and not self._closing and self._failed is None:
                    self._room.wait(SEND_BACKSTOP_SECONDS)
            finally:
                self._room_waiters -= 1

    def _room_made(self) -> None:
        """A sender took a batch from the queue: wake the proposers waiting for room."""
        if self._room_waiters:
            with self._send_cv_lock:
                self._room.notify_all()

    def _settle(self, seq: int) -> None:
        with self._plock:
            self._settled.add(seq)

    def _submit(self, p: _Pending) -> None:
        p.attempts += 1
        if self.streams:  # appended here, alone, with its backpointers
            with self._cv_lock:
                self._in_flight += 1
            try:
                pos, stored = self._store([p])[0]
            except BaseException as e:  # noqa: BLE001 - judged like a failed append
                self._landed(None)
                self._append_failed(p, e)
                return
            self._landed(pos, stored)
            return
        handed = False  # the append's outcome goes to _appended, or was judged here
        try:
            with self._cv_lock:
                closing = self._stopping or self._failed is not None
                if not closing:
                    self._in_flight += 1
                    p.flying = True  # (no call between this and the count: no Ctrl-C can come between)
            if closing:  # close() or _fail may have told the pending ones before this one was registered
                handed = True
                self._not_sent(p, None)
                return
            try:
                self.log.append_async(p.data, future=p)  # its outcome: p.set_result or p.set_exception
            except Exception as e:  # noqa: BLE001 - judged like a failed append
                handed = True
                self._send_failed(p, e)
                return
            handed = True
        finally:
            if not handed:
                self._send_failed(p, None)

    def _not_sent(self, p: _Pending, error: BaseException | None) -> None:
        """A proposal registered, not sent: the runtime is closing or has
        failed (error None; close() or _fail may have told the pending ones
        before this one was registered), or an interrupt came before its
        append was handed over (raised again by the caller)."""
        if error is not None:
            self._drop(p, NotApplied(f"proposal {p.seq}: interrupted before it was appended"))
        elif self._failed is not None:
            failed = RuntimeFailed(f"the runtime stopped: {self._failed}")
            failed.__cause__ = self._failed
            self._drop(p, failed)
        else:
            self._drop(p, RuntimeClosed("the runtime was closed before the proposal was applied"))

    def _send_failed(self, p: _Pending, e: BaseException | None) -> None:
        """p's append_async raised `e`: a failed append, retried or told; or
        (not an Exception, or None: not known) Ctrl-C or SystemExit on the
        proposer's thread, maybe inside append_async once the pipeline took
        the entry: retried in the background, applied at most once (a late
        outcome of this attempt counts for the next, or for none: _landed
        acts once)."""
        self._landed(None, p=p)
        if isinstance(e, Exception):
            self._append_failed(p, e)
        else:
            p.maybe_stored = True
            self._append_failed(p, ZlogError("the append was interrupted"))

    def _send_loop(self, gate: Any) -> None:
        """Send queued proposals: everything queued (up to MAX_BATCH) in one
        append_many, so a proposal costs no client Future or callback of
        its own, and the batch one sequencer request and one write per object."""
        if not self._through(gate):
            return
        q = self._queue
        while True:
            with self._send_cv_lock:
                self._idle_senders += 1  # before looking: a proposer that queues after the look notifies
                # a nudge is cleared before each look at the queue: a proposal queued before the
                # clear is seen by the look, one after it nudges again (a nudge that found no sender
                # waiting is not left standing)
                self._nudged = False
                try:
                    while not q and not self._stopping:
                        self._send_cv.wait(SEND_BACKSTOP_SECONDS)
                        self._nudged = False
                finally:
                    self._idle_senders -= 1
            if self._stopping:
                return
            batch: list[_Pending] = []
            try:
                while len(batch) < MAX_BATCH:
                    batch.append(q.popleft())
            except IndexError:
                pass
            if not batch:
                continue
            self._room_made()
            if self._failed is not None:  # its proposers were told RuntimeFailed (_fail): nothing more is appended
                for p in batch:
                    self._not_sent(p, None)
                continue
            with self._cv_lock:
                self._in_flight += len(batch)  # out of the queue, not yet stored
            try:
                if self.streams:
                    placed = self._store(batch)
                else:
                    placed = list(zip(self.log.append_many([p.data for p in batch]), [p.data for p in batch]))
            except BaseException as e:  # noqa: BLE001 - each proposal is judged and retried alone
                with self._cv_lock:
                    self._in_flight -= len(batch)
                    self._cv.notify_all()
                if isinstance(e, InvalidRequest) and len(batch) > 1:
                    for p in batch:  # one bad entry refuses the call: send each alone, so only it fails
                        self._submit(p)
                    continue
                # a batch is one write per object: some may be stored before another is refused,
                # so a proposal of it that is given up on is retired, never told NotApplied outright
                partly = len(batch) > 1
                for p in batch:
                    p.maybe_stored = p.maybe_stored or partly
                    self._append_failed(p, e)
                continue
            with self._cv_lock:
                self._in_flight -= len(batch)
                own, heap, applied = self._own, self._own_heap, self.applied
                top = -1
                for pos, stored in placed:
                    if pos >= applied:
                        own[pos] = stored
                        heapq.heappush(heap, pos)
                    if pos > top:
                        top = pos
                if top + 1 > self._target:
                    self._target = top + 1
                self._cv.notify_all()

    def _landed(self, pos: int | None, data: bytes | None = None, wake: bool = True,
                p: _Pending | None = None) -> None:
        """An own append is over (stored at pos, or failed). Wake the player
        only when it can move: pos is the next position to play, or nothing
        of ours is in flight any more. Waking it for every append would cost
        a thread switch per entry. `p`: the proposal whose attempt holds the
        count (p.flying); nothing is done if it was given back already. In
        C (native/propose.c, landed), under _cv_lock: it runs once per put."""
        _landed_native(self, self._core, pos, data, wake, p)

    def _play_here(self, target: int) -> None:
        """Play to `target` on this thread if no one else is playing; else
        (or if it cannot finish) leave it to the player, woken."""
        interrupted: BaseException | None = None
        lock = self._play_lock
        if not lock._is_owned():  # (else this thread plays already: a done-callback of its apply)
            try:
                if lock.acquire(blocking=False):
                    self._play(target)
            except (_Trimmed, ZlogError) as e:
                if isinstance(e, ObjectsError):  # a damaged or unsupported entry: the runtime stops here
                    self._fail(e)
                # else a trim or an outage: the player reloads or retries
            except BaseException as e:  # noqa: BLE001 - a bug; told to every waiter
                if isinstance(e, Exception) or self._applying:  # (mid-apply, an object may be half changed)
                    logger.exception("playing log %r stopped", self.log.name)
                    self._fail(e)
                else:  # Ctrl-C in a read or a hole's wait: nothing changed, the player plays on
                    interrupted = e
            finally:
                # (also when a Ctrl-C came just after the acquire returned; no check of ownership first:
                # a Ctrl-C after one left the lock held, this thread refused as its player for good)
                try:
                    lock.release()
                except RuntimeError:  # not held here: the acquire did not get it
                    pass
        with self._cv_lock:
            # the player takes what is left: past `target` too (an own append that landed
            # meanwhile above a position in flight here did not wake it: _landed)
            if self.applied < max(target, self._target):
                self._cv.notify_all()
        if interrupted is not None:
            raise interrupted

    def _appended(self, p: _Pending, position: int | None, error: BaseException | None) -> None:
        """An async append's outcome, on the client's completion (or retry)
        thread: keep it short. Once per append (p.flying: its in-flight
        count, given back by the first call)."""
        if not p.flying:
            return
        if error is not None:
            self._landed(None, p=p)
            self._append_failed(p, error)
            return
        self._landed(position, p.data, p=p)

    def _append_failed(self, p: _Pending, e: BaseException) -> None:
        refused = isinstance(e, ZlogError) and not isinstance(e, ClusterUnavailable)
        if isinstance(e, InvalidRequest) and not p.maybe_stored:  # bad input: no retry helps, nothing stored
            self._drop(p, e)
            return
        p.maybe_stored = p.maybe_stored or not refused
        if p.future.done():  # applied meanwhile (an earlier copy was stored after all)
            return
        if isinstance(e, LogClosed) or time.monotonic() >= p.deadline or self._stopping:
            self._give_up(p, e)  # (a closed Log refuses every retry: no use waiting for the deadline)
            return
        self.stats.retries += 1
        delay = min(RETRY_FIRST * 2 ** min(p.attempts - 1, 8), RETRY_MAX)
        logger.info("append of proposal %d failed (%s); again in %.2fs", p.seq, e, delay)
        self._schedule(p, delay)

    def _drop(self, p: _Pending, e: BaseException) -> None:
        self._pending.pop(p.seq, None)
        self._settle(p.seq)
        _tell(p.future, e)

    def _give_up(self, p: _Pending, cause: BaseException) -> None:
        if not p.maybe_stored:  # every attempt was refused: nothing is stored, nothing will be
            until = "" if isinstance(cause, LogClosed) else " until the deadline"
            self._drop(p, NotApplied(f"proposal {p.seq}: every append was refused{until} (last: {cause})"))
            return
        if p.retire:  # a RETIRE that cannot be stored: the proposals it was for stay unknown
            self._drop(p, OutcomeUnknown(f"retiring proposals {p.retire} failed: {cause}"))
            return
        # an attempt may have stored it: retire the seq, then the play tells
        threading.Thread(target=self._retire, args=(p, cause), daemon=True,
                         name="zlog-objects-retire").start()

    def _retire(self, p: _Pending, cause: BaseException) -> None:
        try:
            f = self._propose(RETIRE, 0, entry.pack_u64s([p.seq]), retire=[p.seq], streams=p.streams)
            f.result(self.propose_timeout + 60)
        except BaseException as e:  # noqa: BLE001 - told to the proposer
            self._pending.pop(p.seq, None)
            if not p.future.done():
                p.future.set_exception(OutcomeUnknown(
                    f"proposal {p.seq}: its appends failed ({cause}) and retiring it failed ({e}); it may "
                    "still be applied, at most once"))
            return
        # the play resolved p if a copy came before the RETIRE; otherwise it never will be applied
        self._pending.pop(p.seq, None)
        if not p.future.done():
            p.future.set_exception(NotApplied(f"proposal {p.seq} was retired after its appends failed "
                                              f"({cause}): it was not applied and never will be"))

    def _schedule(self, p: _Pending, delay: float) -> None:
        with self._cv_lock:
            self._retry_tie += 1
            heapq.heappush(self._retry_q, (time.monotonic() + delay, self._retry_tie, p))
            if self._retrier is None:
                self._retrier = threading.Thread(target=self._retry_loop, name="zlog-objects-retry", daemon=True)
                self._retrier.start()
            self._cv.notify_all()

    def _retry_loop(self) -> None:
        while True:
            with self._cv_lock:
                while not self._stopping and (not self._retry_q or self._retry_q[0][0] > time.monotonic()):
                    self._cv.wait(max(0.001, self._retry_q[0][0] - time.monotonic()) if self._retry_q else None)
                if self._stopping:
                    return
                _, _, p = heapq.heappop(self._retry_q)
            if not p.future.done():
                self._submit(p)

    # ---------------------------------------------------------------- sync
    def sync(self, timeout: float | None = None) -> int:
        """Play to the log's tail as of now; returns it. Reads after this
        reflect every command acknowledged before the call."""
        self.start()
        tail = self.log.tail()
        self._wait_applied(tail, timeout, handed_out=tail)
        return tail

    def _not_on_player(self, what: str) -> None:
        # the player's thread, or a caller's while it plays (a done-callback of a Future its play
        # settles): either would wait for a play that only this thread can make
        if threading.current_thread() is self._player or self._play_lock._is_owned():
            raise InvalidRequest(f"cannot {what} in a Future's callback (on the thread playing the log): it "
                                 "would wait for itself")

    def wait_applied(self, position: int, timeout: float | None = None) -> None:
        """Play every position below `position` (Timeout after `timeout` s).
        Positions the sequencer has not handed out yet are waited for (the
        log's tail is asked again, less and less often), never played."""
        if isinstance(position, bool) or not isinstance(position, int):
            raise InvalidRequest(f"a position is an int, not {position!r}")
        self._wait_applied(position, timeout, handed_out=0)

    def _wait_applied(self, position: int, timeout: float | None, handed_out: int) -> None:
        """wait_applied; `handed_out`: every position below it is known to
        have been handed out. The player's target only ever names such
        positions: it waits hole_wait for an unwritten one and then fills it
        as LOST, which for a position nobody holds yet would burn it (and
        every position up to `position`) before its writer comes. Past them,
        a thread of the runtime asks the log's tail (_poll_tail), so this
        thread only waits: its timeout and close() reach it at once. With
        streams, the player first walks toward `position` (a walk stops at
        the tail its own stream request answers: one sequencer request
        instead of two), and the poller starts if that falls short."""
        self.start()
        self._not_on_player("wait for the log to be played")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv_lock:
            handed_out = max(handed_out, self._target, self.applied)
            reach = min(position, handed_out)
            if reach > self._target:
                self._target = reach
            wanted = position > handed_out
            self._waiting[position] += 1
            self._wake_at = min(self._waiting)
            if wanted:
                self._wants[position] += 1
                if self.streams and self._objects:
                    # a walk stops at the tail its own stream request answers: the player walks
                    # toward `position` at once, with no request for the tail first (the
                    # poller is started only if it stops short)
                    self._walk_to = max(self._walk_to, position)
                    self._cv.notify_all()
                else:
                    self._poll_now()
        try:
            if self.applied < reach:
                self._play_here(reach)
            with self._cv_lock:
                while self.applied < position:
                    self._check_open()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise Timeout(f"the log was not played to {position} within {timeout}s (at {self.applied}"
                                      + (f", the log's tail at {self._target})" if wanted else ")"))
                    self._cv.wait(left if left is not None else 1.0)
                self._check_open()
        finally:
            with self._cv_lock:
                self._waiting[position] -= 1
                if not self._waiting[position]:
                    del self._waiting[position]
                self._wake_at = min(self._waiting, default=NO_WAITER)
                if wanted:
                    self._wants[position] -= 1
                    if not self._wants[position]:
                        del self._wants[position]

    def _poll_now(self) -> None:
        """Under _cv: ask the tail (_poll_tail) at once, and then less and less often."""
        self._tail_poll = TAIL_POLL_FIRST
        self._next_tail_poll = 0.0
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_tail, name="zlog-objects-tail", daemon=True)
            self._poller.start()
        self._cv.notify_all()

    def _wants_more(self) -> bool:
        """Under _cv: some wait_applied waits past every position known handed out."""
        return max(self._wants, default=0) > max(self._target, self.applied)

    def _poll_tail(self) -> None:
        """The tail poller's thread, while wait_applied callers wait past the
        tail: asks the log's tail (every TAIL_POLL_FIRST s, doubling up to
        TAIL_POLL_MAX) and moves the player's target to it. A thread of its
        own: the request can take a sequencer's whole timeout, which must
        hold up neither the player (own entries to play) nor close()."""
        while True:
            with self._cv_lock:
                while True:
                    if self._stopping or self._failed is not None:
                        self._poller = None
                        return
                    if not self._wants_more():
                        self._cv.wait()
                        continue
                    left = self._next_tail_poll - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                self._next_tail_poll = time.monotonic() + self._tail_poll
                self._tail_poll = min(self._tail_poll * 2, TAIL_POLL_MAX)
            try:
                tail = self.log.tail()
            except ZlogError as e:  # an outage: asked again at the next poll; the waiters' timeouts tell
                logger.debug("log %r: asking the tail for wait_applied: %s", self.log.name, e)
                continue
            except BaseException as e:  # noqa: BLE001 - a bug: told to every waiter, as the player's are
                logger.exception("log %r: asking the tail for wait_applied failed", self.log.name)
                with self._cv_lock:
                    self._poller = None
                self._fail(e)
                return
            with self._cv_lock:
                if tail > self._target:
                    self._target = tail
                    self._cv.notify_all()

    # ---------------------------------------------------------- transactions
    def current_transaction(self) -> Transaction | None:
        """The transaction the calling asyncio task (or thread, outside one)
        has open here: not one whose block has ended, nor one a task or
        thread started inside the block inherited with its context."""
        tx = self._tx.get()
        if tx is None or tx.ended or tx.owner is not _owner():
            return None
        return tx

    @contextmanager
    def transaction(self, sync: bool = True, timeout: float | None = None) -> Iterator[Transaction]:
        """An optimistic transaction across the objects hosted here: reads
        record the versions they saw, writes are buffered; at the end of the
        block one commit record is appended, and every replica commits or
        aborts it by replay alone (were the versions read still current at
        the record's position?). `tx.committed` tells which. A read-only
        transaction appends nothing: it commits if its reads are still
        current at its end. An exception in the block appends nothing."""
        if self.current_transaction() is not None:
            raise InvalidRequest("transactions do not nest")
        if sync:
            self.sync(timeout)
        else:
            self.start()
        tx = Transaction(self, _owner())
        token = None
        try:  # (set inside: a Ctrl-C as it returns leaves it set, yet ended below)
            token = self._tx.set(tx)
            yield tx
        finally:
            tx.ended = True  # (for every context holding it: current_transaction passes it over)
            if token is not None:
                try:
                    self._tx.reset(token)
                except ValueError:  # left in another context (a generator closed elsewhere): that one's is its own
                    pass
        tx.commit(timeout)

    def atomically(self, fn: Callable[[], Any], retries: int = 20, timeout: float | None = None) -> Any:
        """Run `fn` in a transaction until it commits; its return value.
        TransactionAborted after `retries` aborts."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidRequest(f"retries is how many aborts to retry, 0 or more, not {retries!r}")
        for attempt in range(retries + 1):
            with self.transaction(timeout=timeout) as tx:
                out = fn()
            if tx.committed:
                return out
            time.sleep(min(0.001 * 2 ** attempt, 0.1) * random.random())
        raise TransactionAborted(f"the transaction aborted {retries + 1} times")

    def _commit(self, streams: list[int], body: bytes, timeout: float | None) -> Any:
        if self.streams and len(streams) > MAX_STREAMS_PER_REQUEST:
            raise InvalidRequest(f"with streams on, a transaction writes at most {MAX_STREAMS_PER_REQUEST} objects")
        return self._call(TXN, 0, entry.pack_u64s(streams) + body, timeout, tuple(streams))

    def noop(self, timeout: float | None = None) -> int:
        """Append an entry that changes nothing and wait until it is played
        (a barrier); returns the runtime's applied position after it."""
        self._call(NOOP, 0, b"", timeout)
        return self.applied

    # ------------------------------------------------------------- playing
    def _through(self, gate: Any) -> bool:
        """A thread of start(): wait until start() is over; False if this
        thread is to return (that start failed, or a later one made others)."""
        gate.acquire()
        gate.release()  # (the next one waiting goes through too)
        me = threading.current_thread()
        return self._started and (me is self._player or me in self._senders)

    def _run(self, gate: Any) -> None:
        try:
            self.log.warm_sequencer()
        except Exception:  # noqa: BLE001 - only a head start: the first request meets whatever it was
            logger.debug("log %r: connecting to the sequencer ahead failed", self.log.name, exc_info=True)
        if not self._through(gate):
            return
        backoff = 0.0
        next_poll = 0.0
        while True:
            with self._cv_lock:
                while True:
                    if self._stopping:
                        return
                    if self._target > self.applied or self._walk_to > self.applied:
                        left = self._grace_left(self.applied)
                        if left <= 0:
                            break
                        self._cv.wait(left)
                        continue
                    if self.follow is not None:
                        wait = next_poll - time.monotonic()
                        if wait <= 0:
                            break
                        self._cv.wait(wait)
                    else:
                        self._cv.wait()
                target, walk_to, self._walk_to = self._target, self._walk_to, 0
            try:
                if target <= self.applied and walk_to <= self.applied:  # a follow poll
                    next_poll = time.monotonic() + (self.follow or 0.0)
                    tail = self.log.tail()
                    with self._cv_lock:
                        self._target = target = max(self._target, tail)
                with self._play_lock:
                    try:
                        self._play(target)
                        if walk_to > self.applied:
                            self._play(walk_to, past_tail=True)
                    finally:
                        if walk_to:
                            with self._cv_lock:
                                if self.applied < walk_to and self._wants_more():
                                    self._poll_now()  # the walk stopped at the tail (or failed)
                backoff = 0.0
            except _Trimmed as t:
                try:
                    self._reload_after_trim(t.position)
                except BaseException as e:  # noqa: BLE001 - the runtime cannot go on
                    self._fail(e)
                    return
            except ObjectsError as e:  # a damaged or unsupported entry, a transaction it cannot decide
                self._fail(e)
                return
            except ZlogError as e:  # an outage: the log's own retries ran out; try again later
                backoff = min(max(backoff * 2, 0.05), PLAY_BACKOFF_MAX)
                logger.warning("playing log %r at %d: %s; again in %.2fs", self.log.name, self.applied, e, backoff)
                with self._cv_lock:
                    self._cv.wait(backoff)
            except BaseException as e:  # noqa: BLE001 - a bug; told to every waiter
                logger.exception("playing log %r stopped", self.log.name)
                self._fail(e)
                return

    def _grace_left(self, at: int) -> float:
        """Under _cv: seconds to wait before reading position `at` from the
        log (0: read it now). While own appends are in flight, `at` may be
        one of them: reading it now could find it unwritten and wait on it
        as a hole, and the acknowledgement will bring its bytes anyway."""
        if (self._in_flight == 0 and not self._queue) or at in self._own:
            return 0.0
        now = time.monotonic()
        if self._grace_pos != at:
            self._grace_pos, self._grace_end = at, now + OWN_GRACE
        return max(0.0, self._grace_end - now)

    def _fail(self, e: BaseException) -> None:
        with self._cv_lock:
            self._failed = e
            self._cv.notify_all()
        # the pending proposals, and those applied but not yet told (a Ctrl-C in _apply_rows' settling)
        told, self._done = self._done, []
        for p in [*self._pending.values(), *told]:
            self._pending.pop(p.seq, None)
            if not p.future.done():
                exc = RuntimeFailed(f"the runtime stopped: {e}")
                exc.__cause__ = e
                _tell(p.future, exc)

    def _play(self, target: int, past_tail: bool = False) -> None:
        """Play to `target` (every position below it handed out), or with
        `past_tail` (streams only) as far toward it as the log's tail is."""
        while self.applied < target and not self._stopping:
            at = self.applied
            with self._cv_lock:  # a run of our own acknowledged entries from `at` on: their bytes are known
                run, nxt = _own_run(self._own_heap, self._own, at, min(target, at + CHUNK))
            if run:
                self.stats.from_memory += len(run)
                self._apply_rows(range(at, at + len(run)), run, None)
                continue
            with self._cv_lock:
                if self._grace_left(at) > 0:
                    return  # to the wait: `at` may be ours, acknowledged any moment
            end = target if nxt is None else min(target, nxt)
            if self.streams and self._objects:
                if not self._play_streams(at, end, past_tail):
                    return  # at the tail, short of target: the tail poller takes it from here
                continue
            if past_tail:
                return
            for batch in self.log.stream_batches(at, end, hole_wait=self.hole_wait, known_tail=target,
                                                 hole_clock=self._holes, rows=True):
                if type(batch) is RowSet:  # the rows as read: applied from the replies, no bytes per entry
                    n = batch.num_rows
                    self.stats.read += n
                    cols = batch.columns()
                    for i in range(0, n, CHUNK):
                        self._apply_rows(rows=(batch, cols, i, min(n, i + CHUNK)))
                    if self._stopping:
                        return
                    continue
                col = batch.column(0)
                n = len(col)
                first = col[0].as_py() if n else 0
                # a range is every position once, gaps as rows: no int object per row
                positions: Sequence[int] = range(first, first + n) if n and col[n - 1].as_py() == first + n - 1 \
                    else col.to_pylist()
                datas = batch.column(1).to_pylist()
                self.stats.read += n
                kinds = kinds_of(batch)
                for i in range(0, n, CHUNK):
                    self._apply_rows(positions[i:i + CHUNK], datas[i:i + CHUNK],
                                     kinds[i:i + CHUNK] if kinds is not None else None)
                if self._stopping:
                    return

    def _play_streams(self, at: int, end: int, past_tail: bool = False) -> bool:
        """Play [at, end) reading only the hosted objects' entries
        (streams.walk): what the backpointers cannot vouch for is scanned.
        `past_tail`: end may lie past the tail; False if the walk stopped short."""
        with self._cv_lock:
            known = {p: d for p, d in self._own.items() if at <= p}
        positions, datas, kinds, upto = walk(self.log, sorted(self._objects), at, end, known,
                                             self.hole_wait, self.walk_stats, self._holes, past_tail)
        self.stats.read += len(positions)
        for i in range(0, len(positions), CHUNK):
            self._apply_rows(positions[i:i + CHUNK], datas[i:i + CHUNK],
                             kinds[i:i + CHUNK] if kinds is not None else None)
        if upto > self.applied:
            with self._lock:
                if upto > self.applied:
                    self.applied = upto
            with self._cv_lock:
                self._cv.notify_all()
        if upto < end:
            if past_tail:
                return False
            raise ZlogError(f"the log's tail is at {upto}, below {end}: playing again later")
        return True

    def _apply_rows(self, positions: Sequence[int] = (), datas: Sequence[bytes | None] = (),
                    kinds: list[str] | None = None,
                    rows: tuple[RowSet, tuple[int, int, int, int], int, int] | None = None) -> None:
        """Apply entries (in position order, from self.applied on) under the
        state lock, then settle the proposals they answered and wake waiters.
        `rows` (RowSet, its columns, first row, end row): the entries are
        those rows instead (positions, datas and kinds unused), read where
        they lie (the RowSet is held meanwhile).
        The loop keeps its counts in locals and stores `applied` once at the
        end (or at the entry that stopped it): per entry, attribute stores
        cost as much as the rest of a put's apply. The common entries (a
        command for an object not hosted here or a map put, admitted in
        the usual way) are applied in C (native/replay.c); this loop takes
        the rest, the same way."""
        unpack = HEADER_U16.unpack_from
        common = _apply_common
        objects = self._objects
        sessions = self._sessions.by_client
        seen = self._streams_seen
        me = self.client_id
        pending = self._pending
        done = self._done
        stats = self.stats
        applied = self.applied
        n_applied = n_gaps = n_foreign = n_dup = 0
        if rows is None:
            cols = None
            i, n = 0, len(datas)
        else:
            _, cols, i, n = rows
            common_cols = _apply_common_columns
        self._applying = True  # until the lot is applied and settled: an interrupt meanwhile stops the runtime
        try:
            with self._lock:
                try:
                    while i < n:
                        # the common entries in C (native/replay.c), up to the first it leaves to this loop
                        if cols is None:
                            j, k = common(positions, datas, i, sessions, objects, seen, me, pending, done)
                            if j > i:
                                n_applied += k
                                applied = positions[j - 1] + 1
                                i = j
                                if i == n:
                                    break
                            pos, data = positions[i], datas[i]
                            trimmed = data is None and kinds is not None and kinds[i] == "trimmed"
                        else:
                            j, k, after = common_cols(cols, n, i, sessions, objects, seen, me, pending, done)
                            if j > i:
                                n_applied += k
                                applied = after
                                i = j
                                if i == n:
                                    break
                            pos, data, kind = _row_at(cols, n, i)
                            trimmed = kind == KIND_TRIMMED
                        i += 1
                        if data is None:
                            if trimmed:
                                raise _Trimmed(pos)
                            n_gaps += 1
                            applied = pos + 1
                            continue
                        end = len(data)
                        if end < HEADER_SIZE:
                            n_foreign += 1
                            applied = pos + 1
                            continue
                        magic, version, kind, flags, client, seq, lwm, stream = unpack(data)
                        if magic != MAGIC_U16 or version == 0 or version > MAX_LAYER_VERSION:  # (entry.py)
                            n_foreign += 1
                            applied = pos + 1
                            continue
                        if version > 2 or version < 1 or kind > 4 or kind < 1:
                            entry.check(version, kind)
                        if not flags & FLAG_BACKPOINTERS:
                            off = HEADER_SIZE
                        elif end > 57 and data[38] == 1:  # one stream: the section's length at a glance
                            off = 58 + data[57] * (data[55] + data[56])
                        else:
                            off = entry.body_offset(data)
                        s = sessions.get(client)
                        if s is None:
                            s = sessions[client] = Session(lwm)
                        if lwm <= s.lwm <= seq and seq not in s.seen:
                            s.seen.add(seq)  # Session.admit's common case, inline (no lwm moved, nothing pruned)
                        elif not s.admit(seq, lwm):
                            n_dup += 1
                            applied = pos + 1
                            if client == me and seq in pending:  # ours, its seq taken first: never applied now
                                taken = pending[seq]
                                taken.result, taken.ok = _seq_taken(seq), False
                                done.append(taken)  # (then out of pending, as below)
                                del pending[seq]
                            continue
                        ok = True
                        if kind == CMD:
                            obj = objects.get(stream)
                            if obj is None:
                                seen.add(stream)  # a hosted object's stream is told by its version (state_snapshot)
                                result = None
                            else:
                                try:
                                    result = obj.apply_payload(data, off, pos)
                                    obj.version = pos + 1
                                except Exception as e:  # noqa: BLE001 - the command's outcome, the same everywhere
                                    seen.add(stream)  # (its version did not move)
                                    result, ok = e, False
                        elif kind == TXN:
                            result = self._apply_txn(data, pos, off)
                        elif kind == RETIRE:
                            seqs, _ = entry.unpack_u64s(data, off)
                            result = [q for q in seqs if q in s.seen]
                            for q in seqs:
                                s.admit(q, lwm)
                        else:
                            result = None
                        n_applied += 1
                        applied = pos + 1
                        if client == me:
                            p = pending.get(seq)
                            if p is not None:
                                pd = p.data  # the entry is this proposal if kind, stream and body are its own
                                if pd[3] == kind and pd[29:37] == data[29:37] and data[off:] == pd[HEADER_SIZE:]:
                                    p.result, p.ok = result, ok
                                else:
                                    p.result, p.ok = _seq_taken(seq), False
                                # into done before out of pending: a Ctrl-C between leaves it in one of
                                # them (or both), where _fail tells it; popped first, it was told nothing
                                done.append(p)
                                del pending[seq]
                except BaseException as e:
                    if not isinstance(e, Exception):  # Ctrl-C, SystemExit: maybe mid-entry
                        self._torn = e  # (under the lock: no snapshot sees this state, ever)
                    raise
                finally:
                    self.applied = applied  # under the lock: a snapshot sees state and position together
        except Exception:  # a trim or a damaged entry, met before its entry was applied
            self._applying = False
            raise
        finally:
            stats.applied += n_applied
            stats.gaps += n_gaps
            stats.foreign += n_foreign
            stats.duplicates += n_dup
            if done:
                # their seqs (and what a RETIRE retired) settled under _plock, their results taken (in C)
                answered, failed = _answer(self._plock, self._settled, done)
                for fut, error in failed:
                    fut.set_exception(error)
                LazyFuture.settle_all(answered)  # one lock for the lot; a future nobody waits on needs no Condition
                self._done = []  # (only now: a Ctrl-C in this loop leaves them where _fail tells them)
            if self.applied >= self._wake_at:  # (read after `applied`: a waiter registers before it looks)
                with self._cv_lock:
                    self._cv.notify_all()
        self._applying = False

    def _apply_txn(self, data: bytes, pos: int, off: int = HEADER_SIZE) -> TxnResult | None:
        streams, off = entry.unpack_u64s(data, off)
        objects = self._objects
        self._streams_seen.update(streams)
        if not any(s in objects for s in streams):
            return None
        try:
            reads, writes = codec.loads(data[off:])
            reads = [(int(s), key, int(v)) for s, key, v in reads]
            writes = [(int(s), bytes(p)) for s, p in writes]
        except (TypeError, ValueError) as e:
            raise BadEntry(f"position {pos}: a commit record does not parse ({e})") from None
        if not any(s in objects for s, _ in writes):
            return None  # nothing of it changes what is hosted here: no need to decide
        for s, key, version in reads:
            obj = objects.get(s)
            if obj is None:
                raise NotHosted(f"position {pos}: a transaction writes an object hosted here but read an object "
                                f"(stream {s:#x}) that is not: host every object such transactions read")
            if obj.read_version(key) != version:
                self.stats.aborted += 1
                if self.decisions is not None:
                    self.decisions[pos] = False
                return TxnResult(False, [])
        results: list[Any] = []
        for s, payload in writes:
            obj = objects.get(s)
            if obj is None:
                results.append(None)
                continue
            try:
                results.append(obj.apply_payload(payload, 0, pos))
                obj.version = pos + 1
            except Exception as e:  # noqa: BLE001 - deterministic: the same everywhere
                results.append(e)
        if self.decisions is not None:
            self.decisions[pos] = True
        return TxnResult(True, results)

    # ---------------------------------------------------------- checkpoints
    def state_snapshot(self) -> tuple[int, dict[str, Any]]:
        """(position, state): every hosted object's state after playing every
        position below `position`, with what exactly-once needs."""
        self.start()
        with self._lock:
            bad = self._torn or self._failed
            if bad is not None:  # a checkpoint of it would be started from, and the harm spread
                raise RuntimeFailed(f"the runtime stopped ({bad!r}): its state may be half changed, and is "
                                    "not snapshotted") from bad
            pos = self.applied
            objs = {o.name: [o.type_name, o.version, o.snapshot()] for o in self._objects.values()}
            state = {"v": 1, "position": pos, "objects": objs, "sessions": self._sessions.snapshot(),
                     "streams": sorted(self._streams_seen | {o.stream for o in self._objects.values() if o.version})}
        return pos, state

    def checkpoint(self, sync: bool = True) -> CheckpointInfo:
        """Write a checkpoint of every hosted object (after a sync, by default)."""
        if self.checkpoints is None:
            raise CheckpointError("this runtime has no checkpoint store (Runtime(checkpoints=...))")
        if sync:
            self.sync()
        whole = self._sees_every_stream
        pos, state = self.state_snapshot()
        names = sorted(state["objects"])
        # complete: it holds every object the log has entries for. A streams
        # replica reads only its own streams and cannot tell, nor can one that
        # started from a checkpoint that was not complete, so neither says so
        complete = whole and self._sees_every_stream and set(state["streams"]) <= set(self._objects)
        return self.checkpoints.write(codec.dumps(state, codec.MAX_DEPTH), pos, names, complete)

    def trim(self, keep: int = 1) -> int | None:
        """Trim the log below the oldest of the `keep` newest complete
        checkpoints (ones holding every object the log has entries for:
        any replica can start from them) and delete older checkpoints.
        Returns the highest position trimmed, or None if too few exist."""
        if self.checkpoints is None:
            raise CheckpointError("this runtime has no checkpoint store")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidRequest(f"keep is how many complete checkpoints to keep, at least 1, not {keep!r}")
        infos = self.checkpoints.list()
        complete = [i for i in infos if i.complete]
        if len(complete) < keep or complete[-keep].position == 0:
            return None
        cut = complete[-keep].position
        self.log.trim_to(cut - 1)
        for i in infos:
            if i.position < cut:
                self.checkpoints.remove(i)
        return cut - 1

    def _usable_checkpoint(self, first: int) -> CheckpointInfo | None:
        assert self.checkpoints is not None
        names = {o.name for o in self._objects.values()}
        for info in reversed(self.checkpoints.list()):
            if info.position >= first and (info.complete or names <= set(info.objects)):
                return info
        return None

    def _load(self, info: CheckpointInfo) -> None:
        assert self.checkpoints is not None
        state = codec.loads(self.checkpoints.read(info))
        try:
            pos = int(state["position"])
            objs = state["objects"]
            sessions = Sessions.restore(state["sessions"])
            streams = {int(s) for s in state["streams"]}
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint {info.id} does not parse: {e}") from None
        with self._lock:
            for sid, obj in self._objects.items():
                got = objs.get(obj.name)
                if got is None:
                    initial = self._initial.get(sid)
                    if initial is not None:
                        obj.restore(codec.loads(initial))
                    obj.version = 0
                    continue
                type_name, version, snap = got
                if type_name != obj.type_name:
                    raise WrongType(f"checkpoint {info.id} holds {obj.name!r} as a {type_name}, hosted here as "
                                    f"a {obj.type_name}")
                obj.restore(snap)
                obj.version = int(version)
            self._sessions = sessions
            self._streams_seen = streams
            self._sees_every_stream = not self.streams and info.complete  # its streams are the checkpoint's
            # before any play: a copy of one of these met later is a duplicate of the checkpoint's, not a taken seq
            held = self._held_by_checkpoint()
            with self._cv_lock:
                self.applied = max(pos, 0)
                if self._target < self.applied:
                    self._target = self.applied
                self._cv.notify_all()
        self.stats.reloads += 1
        for p in held:
            self._settle(p.seq)
            if not p.future.done():
                p.future.set_exception(ResultUnavailable(
                    f"proposal {p.seq} was applied (or retired) before the checkpoint this runtime started from"))
        logger.info("log %r: started from checkpoint %s at position %d", self.log.name, info.id, pos)

    def _reload_after_trim(self, position: int) -> None:
        assert self.checkpoints is not None or True
        if self.checkpoints is None:
            raise CheckpointError(f"position {position} of log {self.log.name!r} is trimmed and this runtime has "
                                  "no checkpoint store to start again from")
        info = self._load_newest(position + 1)
        if info is None:
            raise CheckpointError(f"position {position} of log {self.log.name!r} is trimmed and no checkpoint "
                                  "after it covers the objects hosted here")
        logger.warning("log %r: position %d is trimmed; reloaded from the checkpoint at %d", self.log.name,
                       position, info.position)

    def _load_newest(self, first: int) -> CheckpointInfo | None:
        """Load the newest checkpoint at or after `first` that covers what is
        hosted here; None if there is none. A checkpoint deleted between the
        listing and the read (a trim made a newer one) is passed over."""
        for attempt in range(5):
            info = self._usable_checkpoint(first)
            if info is None:
                return None
            try:
                self._load(info)
                return info
            except CheckpointError:
                if attempt == 4 or info in (self.checkpoints.list() if self.checkpoints else []):
                    raise  # still listed: damaged, not replaced
        return None

    def _held_by_checkpoint(self) -> list[_Pending]:
        """Proposals the restored checkpoint already holds (applied, result
        unknown here, or retired), taken out of the pending ones."""
        s = self._sessions.get(self.client_id)
        if s is None:
            return []
        held = [p for p in list(self._pending.values()) if s.applied(p.seq) is not False]
        for p in held:
            self._pending.pop(p.seq, None)
        return held


__all__ = ["Runtime", "Stats"]
