"""The C++ path of async appends (pyzlog._appender).

Through python-rados, each async append costs the client a Python sequencer
round trip per batch and a Python completion callback per entry; on a small
machine that, not the cluster, bounds appends/s. An Appender queues entries
in C++, takes positions for all of them with one sequencer request, sends the
class "write" calls with librados aio on its own RADOS connection, and hands
back (ticket, position, code) triples that one thread here collects in
batches. Anything not plainly OK comes back unsent (HANDED_BACK) or refused,
and AsyncOps handles it in Python (refresh, retry, slow tail finding).

Entries queued together for one data object go out as one write_many
(all or nothing; if the class refuses it because one position was taken, the
others are written one by one at their positions, so no holes are left).

Log.open(..., coalesce=False) sends one write per entry instead; set
PYZLOG_NATIVE_APPENDS=0 to send every async append through python-rados.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import metrics
from ..core.cluster import connection_settings
from ..core.errors import ZlogError
from ..core.layout import data_oid_prefix
from ..core.objects import native_call, on_exit
from ..core.sequencer import SequencerClient
from ..core.state import LogState

if TYPE_CHECKING:
    from ..core.wire import Meta

logger = logging.getLogger("pyzlog")

#: done(item, position, code): code 0 stored, -errno refused, or HANDED_BACK
Done = Callable[[Any, int, int], None]
#: the code of an entry handed back unsent (appender.h; checked when an Appender opens)
HANDED_BACK = 1


def enabled() -> bool:
    return os.environ.get("PYZLOG_NATIVE_APPENDS", "1") != "0"


class NativeAppends:
    """One C++ Appender for one log, and the thread that reports its outcomes."""

    def __init__(self, log: LogState, seqr: SequencerClient, done: Done, coalesce: bool) -> None:
        from .. import _appender  # type: ignore[attr-defined]  # the C++ extension

        if _appender.HANDED_BACK != HANDED_BACK:
            raise RuntimeError(f"pyzlog._appender hands back with code {_appender.HANDED_BACK}, not {HANDED_BACK}")
        client, conf_file, options = connection_settings(log.cluster)
        self._log_name = log.name
        self._meta: Meta | None = None
        self._tickets = itertools.count()  # next() is atomic: appends may come from many threads
        self._pending: dict[int, Any] = {}
        self._done = done
        self._closed = False
        self._thread = threading.Thread(target=self._report, name="pyzlog-append-done", daemon=True)
        with native_call():  # an exit meanwhile waits for this, then closes it (it is in _live)
            self._appender = _appender.Appender(client, conf_file, options, log.pool, log.name,
                                                seqr.host, seqr.port, seqr.timeout, coalesce,
                                                seqr.auth_settings(log.pool))
            self._thread.start()
            _live.add(self)
        metrics.NATIVE.track(self)

    @classmethod
    def open(cls, log: LogState, seqr: SequencerClient | None, done: Done,
             coalesce: bool) -> NativeAppends | None:
        """None (after one warning) if the C++ path cannot serve this log."""
        if not enabled() or seqr is None:
            return None
        try:
            return cls(log, seqr, done, coalesce)
        except (ImportError, RuntimeError, ZlogError) as e:
            logger.warning("async appends to %r go through python-rados: the C++ path is unavailable (%s)",
                           log.name, e)
            return None

    def append(self, meta: Meta, stored: bytes, item: Any) -> None:
        """Queue `stored` for the newest view of `meta`; done(item, ...) follows."""
        if meta is not self._meta:
            view = meta.views[-1]
            self._appender.set_view(meta.epoch, data_oid_prefix(self._log_name, view), view.width, view.start)
            self._meta = meta
        ticket = next(self._tickets)
        self._pending[ticket] = item
        try:
            self._appender.append(ticket, stored)
        except BaseException:
            del self._pending[ticket]
            raise

    def stats(self) -> dict[str, int]:
        """sequencer_requests, class_calls, entries_sent, split_batches, handed_back."""
        return dict(self._appender.stats())

    def _report(self) -> None:
        wait, pending, done = self._appender.wait, self._pending, self._done
        while True:
            outcomes = wait(1024, 0.2)
            for ticket, pos, code in outcomes:
                try:
                    done(pending.pop(ticket), pos, code)
                except Exception:  # noqa: BLE001 - this thread must outlive one bad callback
                    logger.exception("async append completion failed")
            if not outcomes and self._closed:
                return

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        metrics.NATIVE.close(self, self.stats())  # before close: stats() after it can abort at exit
        drained = self._appender.close(timeout)
        self._closed = True
        self._thread.join(timeout)
        _live.discard(self)
        if not drained:
            logger.warning("log %r closed with %d async appends still in flight",
                           self._log_name, self._appender.in_flight)


_live: weakref.WeakSet[NativeAppends] = weakref.WeakSet()


def _close_all() -> None:
    for n in list(_live):
        n.close(10.0)


on_exit(_close_all)
