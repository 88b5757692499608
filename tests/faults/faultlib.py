"""Shared pieces of the fault tests: appender and reader threads that record
every operation into a History, the final scan, and the child process that
takes a position and dies."""
from __future__ import annotations

import functools
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pyzlog
from pyzlog import Log, RecordKind

from history import APPEND, FAIL, OK, UNKNOWN, History, payload

log = logging.getLogger("faults")

SENTINEL_WRITER = "sentinel"



def outcome_of(error: BaseException) -> str:
    """A refusal is a failure (nothing stored); a timeout or anything
    unexpected is unknown (it may have been stored)."""
    if isinstance(error, pyzlog.ZlogError) and not isinstance(error, pyzlog.ClusterUnavailable):
        return FAIL
    return UNKNOWN


def append_recorded(h: History, lg: Log, writer: str, seq: int) -> int | None:
    """One append of payload(writer, seq), recorded: ok with its position,
    unknown for a timeout (it may have been stored), fail for a refusal."""
    data = payload(writer, seq)
    op = h.invoke(APPEND, writer, data=data)
    try:
        pos = lg.append(data)
    except Exception as e:  # noqa: BLE001 - recorded, never lost
        h.complete(op, outcome_of(e), error=e)
        return None
    h.complete(op, OK, position=pos)
    return pos


class Workload:
    """`appenders` threads, each with its own Log (and sequencer address),
    appending until stopped; and optionally one reader following the log
    from position 0 with Log.stream(follow=True), recording every Record.

    With async_window > 0, one more appender uses append_async with that many
    entries in flight (the C++ path: one sequencer request and one write_many
    per object for what is queued together).

    stop() stops the appenders, appends a sentinel entry and waits for the
    reader to reach it, so the reader has seen every position below it."""

    def __init__(self, h: History, cluster: Any, pool: str, name: str, *,
                 sequencer: str | None = None, appenders: int = 3, reader: bool = True,
                 hole_wait: float = 1.0, pause: float = 0.002, prefix: str = "w",
                 async_window: int = 0) -> None:
        self.h = h
        self.cluster = cluster
        self.pool = pool
        self.name = name
        self.sequencer = sequencer
        self.n = appenders
        self.with_reader = reader
        self.hole_wait = hole_wait
        self.pause = pause
        self.prefix = prefix
        self.async_window = async_window
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reader: threading.Thread | None = None
        self._sentinel = payload(SENTINEL_WRITER, 0)
        self.reader_errors: list[str] = []
        self.appender_errors: dict[str, int] = {}
        self.reader_done = threading.Event()

    # ------------------------------------------------------------ threads
    def _append_loop(self, writer: str) -> None:
        lg = Log.open(self.cluster, self.pool, self.name, sequencer=self.sequencer)
        seq = 0
        try:
            while not self._stop.is_set():
                if append_recorded(self.h, lg, writer, seq) is None:
                    self.appender_errors[writer] = self.appender_errors.get(writer, 0) + 1
                    time.sleep(0.05)
                seq += 1
                if self.pause:
                    time.sleep(self.pause)
        finally:
            lg.close()

    def _async_append_loop(self, writer: str) -> None:
        lg = Log.open(self.cluster, self.pool, self.name, sequencer=self.sequencer,
                      max_in_flight=self.async_window)
        window = threading.Semaphore(self.async_window)

        def done(op: Any, fut: Any) -> None:
            err = fut.exception()
            if err is None:
                self.h.complete(op, OK, position=fut.result())
            else:
                self.h.complete(op, outcome_of(err), error=err)
                self.appender_errors[writer] = self.appender_errors.get(writer, 0) + 1
            window.release()

        seq = 0
        try:
            while not self._stop.is_set():
                if not window.acquire(timeout=0.2):
                    continue
                data = payload(writer, seq)
                op = self.h.invoke(APPEND, writer, data=data)
                try:
                    lg.append_async(data).add_done_callback(functools.partial(done, op))
                except Exception as e:  # noqa: BLE001 - recorded, never lost
                    self.h.complete(op, outcome_of(e), error=e)
                    window.release()
                seq += 1
                if self.pause and seq % 8 == 0:
                    time.sleep(self.pause)
            for _ in range(self.async_window):  # every append has an outcome
                window.acquire(timeout=180)
        finally:
            lg.close()

    def _read_loop(self) -> None:
        lg = Log.open(self.cluster, self.pool, self.name)
        stream_id = f"{self.prefix}-reader"
        self.h.begin_stream(stream_id, 0)
        stream = lg.stream(0, follow=True, hole_wait=self.hole_wait)
        try:
            while True:
                t0 = time.monotonic()
                try:
                    rec = next(stream)
                except pyzlog.ZlogError as e:  # e.g. a timeout during an OSD fault: go on
                    self.reader_errors.append(f"{type(e).__name__}: {e}")
                    time.sleep(0.2)
                    continue
                self.h.stream_record(stream_id, stream_id, rec, start=t0)
                if rec.kind == RecordKind.DATA and rec.data == self._sentinel:
                    self.reader_done.set()
                    return
        except BaseException as e:  # a thread's death is otherwise silent: stop() reports it
            self.reader_errors.append(f"the reader died: {type(e).__name__}: {e}")
            raise
        finally:
            lg.close()

    def start(self) -> "Workload":
        for i in range(self.n):
            t = threading.Thread(target=self._append_loop, args=(f"{self.prefix}{i}",),
                                 name=f"appender-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.async_window:
            t = threading.Thread(target=self._async_append_loop, args=(f"{self.prefix}-async",),
                                 name="async-appender", daemon=True)
            t.start()
            self._threads.append(t)
        if self.with_reader:
            self._reader = threading.Thread(target=self._read_loop, name="reader", daemon=True)
            self._reader.start()
        return self

    def stop(self, timeout: float = 180.0) -> None:
        """Stop the appenders (each finishes its current append), then append
        the sentinel and wait for the reader to reach it."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(1.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        assert not stuck, f"appenders did not stop within {timeout:.0f}s: {stuck}"
        if self._reader is not None:
            lg = self._open_after_fault(deadline)
            try:
                for _ in range(1):
                    data = self._sentinel
                    op = self.h.invoke(APPEND, SENTINEL_WRITER, data=data)
                    try:
                        pos = lg.append(data)
                    except pyzlog.ClusterUnavailable as e:
                        self.h.complete(op, UNKNOWN, error=e)
                        raise AssertionError(f"the sentinel append timed out: {e}") from e
                    self.h.complete(op, OK, position=pos)
                    break
            finally:
                lg.close()
            self._reader.join(max(30.0, deadline - time.monotonic()))
            assert not self._reader.is_alive(), "the reader did not reach the end of the log"
            # a reader that ended without reaching the sentinel died (a dead thread is not alive)
            assert self.reader_done.is_set(), f"the reader stopped early: {self.reader_errors[-1:]}"

    def _open_after_fault(self, deadline: float) -> Log:
        """Log.open for the sentinel, again while the cluster is slow to answer
        (a healed network fault leaves sessions reconnecting for a while): it
        reads only metadata, so trying again changes nothing."""
        while True:
            try:
                return Log.open(self.cluster, self.pool, self.name, sequencer=self.sequencer)
            except (pyzlog.Timeout, pyzlog.ClusterUnavailable):
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def counts(self) -> dict[str, int]:
        ops = self.h.ops
        return {
            "acked": sum(1 for o in ops if o.kind == APPEND and o.outcome == OK),
            "failed": sum(1 for o in ops if o.kind == APPEND and o.outcome == FAIL),
            "unknown": sum(1 for o in ops if o.kind == APPEND and o.outcome == UNKNOWN),
        }

    def async_acked(self) -> int:
        return sum(1 for o in self.h.ops if o.kind == APPEND and o.outcome == OK
                   and o.process == f"{self.prefix}-async")

    def acked_since(self, t: float) -> int:
        return sum(1 for o in self.h.ops if o.kind == APPEND and o.outcome == OK and o.end and o.end > t)


def final_scan(cluster: Any, pool: str, name: str, hole_wait: float = 1.0,
               attempts: int = 3) -> dict[int, pyzlog.Record]:
    """Every position of the log, by a fresh client, after the faults stopped."""
    last: Exception | None = None
    for _ in range(attempts):
        lg = Log.open(cluster, pool, name)
        stream = lg.stream(0, hole_wait=hole_wait)
        try:
            return {r.position: r for r in stream}
        except pyzlog.ClusterUnavailable as e:
            last = e
            time.sleep(2)
        finally:
            lg.close()
    raise AssertionError(f"final scan failed {attempts} times: {last}")


def wait_until(pred: Any, timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def hold_position(conf: str, pool: str, name: str, sequencer: str | None, out_path: str) -> None:
    """Child process (multiprocessing spawn): take one position, tell the
    parent which, then hang without writing it until killed."""
    r = pyzlog.connect(conf)
    lg = Log.open(r, pool, name, sequencer=sequencer)
    pos = lg.take_positions(1)
    Path(out_path).write_text(json.dumps({"position": pos, "epoch": lg.epoch}))
    while True:
        time.sleep(60)
