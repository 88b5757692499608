"""Client counters for Prometheus: appends and their latency, reads, retries
by cause, fallbacks to slow tail finding, holes filled, bytes in and out,
async operations in flight, the C++ append path's own counts, named
consumers' positions, lag and commits, and cancelled asyncio appends.

An application serves them from its own registry:

    from prometheus_client import CollectorRegistry, start_http_server
    from pyzlog import metrics
    registry = CollectorRegistry(); metrics.register(registry); start_http_server(9401, registry=registry)

(`metrics.register()` with no argument uses prometheus-client's default
registry.) Counting costs the client almost nothing whether or not anyone
registers: each count is an add to an int of the calling thread's own
(Tally), with no lock; a scrape adds the threads' cells up. The C++ append
path counts in C++ (pipeline.AsyncPipeline.stats), read at scrape time.
The counts are per process, over every log it opens.
"""
from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector


class Tally:
    """A counter that many threads add to without a lock: each thread adds to
    a cell only it writes (no lost updates), and `value` adds the cells up.
    A finished thread's cell stays, so counts never go back."""

    __slots__ = ("_local", "_cells", "_lock", "_before_value")

    def __init__(self, before_value: Any = None) -> None:
        self._local = threading.local()
        self._cells: list[list[int]] = []
        self._lock = threading.Lock()
        self._before_value = before_value  # brings counts kept elsewhere in (count_later)

    def inc(self, n: int = 1) -> None:
        try:
            cell = self._local.cell
        except AttributeError:
            cell = self._local.cell = [0]
            with self._lock:
                self._cells.append(cell)
        cell[0] += n

    @property
    def value(self) -> int:
        if self._before_value is not None:
            self._before_value()
        with self._lock:
            return sum(c[0] for c in self._cells)


#: append latency buckets (seconds, upper bounds), 0.5 ms to 10 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """A histogram that many threads observe into without a lock, as Tally
    counts: each thread has a cell of its own (one count per bucket, then
    the sum), and a scrape adds the cells up."""

    __slots__ = ("bounds", "_local", "_cells", "_lock", "_sources")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self._local = threading.local()
        self._cells: list[list[float]] = []
        self._lock = threading.Lock()
        #: observations kept elsewhere (the C++ append path's): each () -> (counts per bucket, sum)
        self._sources: list[Any] = []

    def add_source(self, source: Any) -> None:
        """Observations counted elsewhere, with these bounds, added in at each snapshot."""
        with self._lock:
            if source not in self._sources:
                self._sources.append(source)

    def _cell(self) -> list[float]:
        """The calling thread's cell: a count per bucket, then the sum."""
        try:
            return self._local.cell  # type: ignore[no-any-return]
        except AttributeError:
            cell = self._local.cell = [0] * (len(self.bounds) + 1) + [0.0]
            with self._lock:
                self._cells.append(cell)
            return cell

    def observe(self, value: float) -> None:
        cell = self._cell()
        cell[bisect.bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        cell[-1] += value

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """(cumulative buckets as prometheus-client takes them, sum)."""
        n = len(self.bounds) + 1
        with self._lock:
            cells = [list(c) for c in self._cells]
            sources = list(self._sources)
        for source in sources:
            counts_, sum_ = source()
            cells.append([*counts_, sum_])
        counts = [sum(c[i] for c in cells) for i in range(n)]
        total = 0.0
        buckets = []
        for bound, count in zip([*(str(b) for b in self.bounds), "+Inf"], counts):
            total += count
            buckets.append((bound, total))
        return buckets, sum(c[-1] for c in cells)


#: seconds from an append's call to its entry being stored: "sync" per
#: call (append, append_many, append_slow), "async" per entry (append_async
#: and pyzlog.aio, from the entry's hand-off to the pipeline)
APPEND_SECONDS = {"sync": Histogram(), "async": Histogram()}
#: entries stored by any append path (sync, batch, slow, async, C++)
APPENDS = Tally()
_LATER: weakref.WeakSet[Any] = weakref.WeakSet()


def count_later(counter: Any) -> None:
    """`counter.count()` adds what it counted to READS, BYTES_IN or
    BYTES_OUT before any of them is read: a stream hands records out with
    no count per entry, and the C hot path of async appends takes entries
    with none, and each counts them (exactly) in bulk."""
    _LATER.add(counter)


def _count_pending() -> None:
    for c in list(_LATER):
        c.count()


#: bytes of entries handed to append, as stored (after compression)
BYTES_OUT = Tally(_count_pending)
#: entries read (read, read_async, stream records with data)
READS = Tally(_count_pending)
#: bytes of entries read, as stored
BYTES_IN = Tally(_count_pending)
#: a write refused because the log's epoch moved on: the entry takes a new position
RETRIES_STALE = Tally()
#: a write refused because its position was written, filled or trimmed first
RETRIES_TAKEN = Tally()
#: times a client stopped asking its sequencer and found positions the slow way
SLOW_FALLBACKS = Tally()
#: positions taken by slow tail finding
SLOW_POSITIONS = Tally()
#: sequencer answers RATE_LIMITED (over the connection's position budget), each followed by a wait
RATE_LIMITED = Tally()
#: holes below the tail a reader filled after waiting for their writer (LOST)
HOLES_FILLED = Tally()
#: damaged positions a stream skipped (on_corrupt="skip"), each also a CORRUPT record
CORRUPT_SKIPPED = Tally()
#: named consumers' commits stored, and refused (another instance committed further)
COMMITS = Tally()
COMMITS_REFUSED = Tally()
#: async appends whose awaiting task was cancelled after they were sent, by
#: how they ended (client.aio): "stored", "failed"; "unsent" were never sent
AIO_CANCELLED = {"stored": Tally(), "failed": Tally(), "unsent": Tally()}


def read(nbytes: int) -> None:
    """One entry of `nbytes` read."""
    READS.inc()
    BYTES_IN.inc(nbytes)


def read_many(entries: int, nbytes: int) -> None:
    """`entries` entries of `nbytes` in all read."""
    READS.inc(entries)
    BYTES_IN.inc(nbytes)


class _Tracked:
    """Live objects whose counts are read at scrape time, and what closed
    ones had counted when they closed (so counters never go back)."""

    def __init__(self) -> None:
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()
        self.closed: dict[str, int] = {}
        self._lock = threading.Lock()

    def track(self, obj: Any) -> None:
        self.live.add(obj)

    def close(self, obj: Any, final: dict[str, int]) -> None:
        with self._lock:
            if obj in self.live:
                self.live.discard(obj)
                for k, v in final.items():
                    self.closed[k] = self.closed.get(k, 0) + int(v)

    def totals(self, stats: Any) -> dict[str, int]:
        with self._lock:
            out = dict(self.closed)
            objs = list(self.live)
        for obj in objs:
            try:
                for k, v in stats(obj).items():
                    out[k] = out.get(k, 0) + int(v)
            except Exception:  # noqa: BLE001 - closed meanwhile: its final counts arrive via close()
                pass
        return out


#: named consumers (client.consumer.Consumer, client.aio.AsyncConsumer) whose
#: position and lag a scrape reports: anything with pool, log_name, name,
#: committed and lag(max_age)
CONSUMERS: weakref.WeakSet[Any] = weakref.WeakSet()
#: a scrape reads each consumer's tail again when it is older than this
LAG_MAX_AGE_SECONDS = 1.0

#: pipeline.AsyncPipeline: the C++ path of async appends, one per connection
NATIVE = _Tracked()
#: pipeline.LogAsync: their operations in flight
ASYNC = _Tracked()

_NATIVE_HELP = {
    "sequencer_requests": "sequencer requests of the C++ append path",
    "class_calls": "write and write_many calls the C++ append path sent",
    "entries_sent": "entries the C++ append path sent (retries of a split batch included)",
    "split_batches": "write_many calls refused for a taken position and retried one by one",
    "handed_back": "entries the C++ path handed back to Python unsent (epoch change, sequencer down)",
}


class ClientCollector(Collector):
    def collect(self) -> Iterator[Any]:
        def counter(name: str, help_: str, value: int) -> CounterMetricFamily:
            return CounterMetricFamily(f"zlog_client_{name}", help_, value=value)

        yield counter("appends", "entries stored by appends (all paths)", APPENDS.value)
        yield counter("append_bytes", "bytes of entries handed to append, as stored", BYTES_OUT.value)
        yield counter("reads", "entries read (read, read_async, streams)", READS.value)
        yield counter("read_bytes", "bytes of entries read, as stored", BYTES_IN.value)
        retries = CounterMetricFamily("zlog_client_append_retries", "writes refused and retried at a new position",
                                      labels=["cause"])
        retries.add_metric(["stale_epoch"], RETRIES_STALE.value)
        retries.add_metric(["position_taken"], RETRIES_TAKEN.value)
        yield retries
        yield counter("slow_tail_fallbacks", "times appends fell back to slow tail finding", SLOW_FALLBACKS.value)
        yield counter("sequencer_rate_limited", "sequencer answers RATE_LIMITED this client waited out",
                      RATE_LIMITED.value)
        yield counter("slow_tail_positions", "positions taken by slow tail finding", SLOW_POSITIONS.value)
        yield counter("holes_filled", "holes a reader filled after waiting for their writer (LOST)",
                      HOLES_FILLED.value)
        yield counter("corrupt_skipped", "damaged positions streams skipped (on_corrupt=skip)", CORRUPT_SKIPPED.value)
        in_flight = ASYNC.totals(lambda a: {"in_flight": a.in_flight})
        yield GaugeMetricFamily("zlog_client_async_in_flight", "async appends and reads outstanding",
                                value=in_flight.get("in_flight", 0))
        native = NATIVE.totals(lambda n: n.stats())
        for key, help_ in _NATIVE_HELP.items():
            yield counter(f"native_{key}", help_, native.get(key, 0))
        latency = HistogramMetricFamily("zlog_client_append_seconds", "seconds from an append to its entry "
                                        "stored (sync: per call; async: per entry, from its hand-off)",
                                        labels=["path"])
        for path, hist in APPEND_SECONDS.items():
            buckets, total = hist.snapshot()
            latency.add_metric([path], buckets, total)
        yield latency
        commits = CounterMetricFamily("zlog_client_consumer_commits", "named consumers' commits",
                                      labels=["outcome"])
        commits.add_metric(["committed"], COMMITS.value)
        commits.add_metric(["refused"], COMMITS_REFUSED.value)
        yield commits
        cancelled = CounterMetricFamily("zlog_client_aio_cancelled_appends",
                                        "awaited appends whose task was cancelled, by what became of the entry",
                                        labels=["outcome"])
        for outcome, tally in AIO_CANCELLED.items():
            cancelled.add_metric([outcome], tally.value)
        yield cancelled
        yield from _consumer_gauges()


def _consumer_gauges() -> Iterator[Any]:
    """Each named consumer's committed position and lag (the log's tail in
    storage minus it). Instances of one consumer in this process report as
    one: the furthest committed."""
    best: dict[tuple[str, str, str], Any] = {}
    for c in list(CONSUMERS):
        key = (c.pool, c.log_name, c.name)
        if key not in best or c.committed > best[key].committed:
            best[key] = c
    position = GaugeMetricFamily("zlog_client_consumer_position", "a named consumer's committed position",
                                 labels=["pool", "log", "consumer"])
    lag = GaugeMetricFamily("zlog_client_consumer_lag", "the log's tail minus a named consumer's committed "
                            "position", labels=["pool", "log", "consumer"])
    for key, c in sorted(best.items()):
        position.add_metric(list(key), c.committed)
        try:
            lag.add_metric(list(key), c.lag(LAG_MAX_AGE_SECONDS))
        except Exception:  # noqa: BLE001 - a log unreachable now: no lag sample rather than a failed scrape
            pass
    yield position
    yield lag


_registered: set[int] = set()
_reg_lock = threading.Lock()


def register(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Expose the client's counters in `registry` (prometheus-client's
    default one if None); registering twice in one registry is a no-op."""
    registry = REGISTRY if registry is None else registry
    with _reg_lock:
        if id(registry) not in _registered:
            registry.register(ClientCollector())
            _registered.add(id(registry))
    return registry
