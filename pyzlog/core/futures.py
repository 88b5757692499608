"""LazyFuture: the concurrent.futures.Future that async appends, async
reads and replicated-object proposals hand out.

A Future's Condition (a Condition, an RLock and a deque) costs more than
the rest of an async append in Python, and most futures are never waited
on before they are settled. A LazyFuture makes its Condition on first use,
under one lock that settling a future nobody has looked at takes too, so
Future's semantics hold: whoever makes the Condition (result(),
exception(), cancel(), concurrent.futures.wait) then sees the settled state
under it, and a future someone waits on is settled the ordinary way, with
the notification. Callbacks and done() need no Condition: a callback added
to a pending future is kept under the same lock and run by the thread that
settles it, after the lock is let go, as Future does.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import _base as _futures
from typing import Any

from .._appender import settle_futures as _settle_futures  # the C++ extension (untyped)

#: reentrant: a finalizer or a signal handler that runs on a thread holding
#: it (say, during an allocation in settle_all) may touch a future too
_make_condition = threading.RLock()
_DONE = (_futures.CANCELLED, _futures.CANCELLED_AND_NOTIFIED, _futures.FINISHED)


class LazyFuture(Future[Any]):
    """A concurrent.futures.Future whose Condition is made on first use."""

    _waiters: list[Any]
    _done_callbacks: list[Callable[[Future[Any]], object]]

    def __init__(self) -> None:  # no super().__init__(): it would make the Condition
        self._state = _futures.PENDING
        self._result = None
        self._exception = None
        self._cond: threading.Condition | None = None

    def __getattr__(self, name: str) -> Any:
        """Future's lists of waiters and callbacks, made on first use too (two
        objects fewer per future for the garbage collector to track). Every
        use is under a lock: _make_condition until the Condition is made,
        the Condition after."""
        if name == "_waiters" or name == "_done_callbacks":
            made: list[Any] = []
            setattr(self, name, made)
            return made
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # Future's _condition is an attribute; here, deliberately, a property made on first use
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            made = threading.Condition()  # made before the lock: nothing allocated under it
            with _make_condition:
                cond = self._cond
                if cond is None:
                    cond = self._cond = made
        return cond

    def result(self, timeout: float | None = None) -> Any:
        """Future.result, with no Condition made for a future already settled
        with a result (FINISHED is final, and its result was stored before it)."""
        if self._state == _futures.FINISHED and self._exception is None:
            return self._result
        try:
            return super().result(timeout)
        except BaseException:
            self._let_go_if_held()
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Future.exception, with no Condition made for a settled future: the
        usual done-callback (`lambda f: f.exception()`) runs on a settled one."""
        if self._state == _futures.FINISHED:
            return self._exception
        try:
            return super().exception(timeout)
        except BaseException:
            self._let_go_if_held()
            raise

    def _let_go_if_held(self) -> None:
        """After result() or exception() raised: a Ctrl-C inside Future's
        `with self._condition` (Condition.__enter__ is Python code; the
        interrupt can come once its lock's acquire has returned, before the
        with block holds it) leaves the Condition's lock held by this thread,
        and whoever settles the future then waits for it for ever (a
        runtime's player). Nobody calls result() holding it, so it is let go."""
        cond = self._cond
        if cond is not None:
            lock: Any = cond._lock  # type: ignore[attr-defined]  # an RLock (C): _is_owned is typeshed's gap
            while lock._is_owned():
                lock.release()

    def done(self) -> bool:
        return self._state in _DONE  # one read of one attribute: no lock needed to take a snapshot

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        if self._cond is None:
            with _make_condition:
                # the list in the instance's dict: a miss on self._done_callbacks would raise and
                # format an AttributeError before __getattr__ made it (most of this call's cost).
                # The dict is fetched (maybe made: an allocation) before the check, and no call
                # comes between the check and the store: a signal handler runs when a call
                # returns, and one that settled this future there would leave fn never run
                d = self.__dict__
                if self._cond is None and self._state not in _DONE:  # run by whoever settles it
                    if "_done_callbacks" in d:
                        d["_done_callbacks"].append(fn)
                    else:
                        d["_done_callbacks"] = [fn]
                    return
        super().add_done_callback(fn)  # settled (fn runs now), or watched: Future's own way

    def _settle_locked(self, result: Any, exception: BaseException | None) -> bool:
        """With _make_condition held: settle if nobody has made a Condition
        and it is still pending; False otherwise. (settle_all's C loop,
        native/appender_hot.cc settle_futures, does the same.)"""
        if self._cond is not None or self._state in _DONE:
            return False
        self._result, self._exception = result, exception
        self._state = _futures.FINISHED
        return True

    def _settle_unwatched(self, result: Any, exception: BaseException | None) -> bool:
        """Settle without a Condition if nobody has made one (so nobody
        waits); False if somebody has. Its callbacks run here."""
        if self._cond is not None:
            return False
        with _make_condition:
            settled = self._settle_locked(result, exception)
            twice = not settled and self._cond is None  # settled already, and nobody watching
        if twice:  # raised with the lock let go: repr() makes the Condition, which takes it
            raise InvalidStateError(f"{self._state}: {self!r}")
        if settled and "_done_callbacks" in self.__dict__:
            self._run_callbacks()
        return settled

    def _run_callbacks(self) -> None:
        """What Future does after settling: each callback, an error logged, not
        raised. On a pyzlog thread a callback's SystemExit is logged too: the
        thread settles every later operation of its connection, and the
        callbacks after this one must still run."""
        for fn in self._done_callbacks:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - as Future: a callback's error is the callback's
                _futures.LOGGER.exception("exception calling callback for %r", self)
            except BaseException:
                if threading.current_thread() is threading.main_thread():
                    raise
                _futures.LOGGER.exception("a callback for %r tried to end its thread: ignored", self)

    def set_result(self, result: Any) -> None:
        if not self._settle_unwatched(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._settle_unwatched(None, exception):
            super().set_exception(exception)

    @staticmethod
    def settle_all(done: Iterable[tuple[Future[Any], Any]]) -> None:
        """set_result for each (future, result), taking the lock that
        _settle_unwatched takes once for all of them, not once each. A
        future its owner cancelled meanwhile stays cancelled. The loop
        under the lock is _settle_locked's, in C (it runs once per async
        append: pyzlog._appender.settle_futures)."""
        if not isinstance(done, list):
            done = list(done)  # the caller's iterable is not run under the lock
        called, watched = _settle_futures(done, LazyFuture, _make_condition, _DONE, _futures.FINISHED)
        for fut in called:
            fut._run_callbacks()
        for fut, result in watched:
            try:  # no cancelled() first: it would make a Condition for every subclass's future (aio's _Sent)
                fut.set_result(result)
            except InvalidStateError:  # its owner cancelled it
                pass
            except Exception:  # noqa: BLE001 - a given future's own error (append_async(future=)):
                _futures.LOGGER.exception("settling %r failed", fut)  # the others are still settled


__all__ = ["LazyFuture"]
