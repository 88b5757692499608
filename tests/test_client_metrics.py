"""pyzlog.client.metrics: the client's counters, served from an application's own
registry, count exactly what the test did against the real cluster."""
from __future__ import annotations


import pytest
from prometheus_client import CollectorRegistry, generate_latest
from seqr_proc import free_port

from pyzlog import Log, RecordKind

from pyzlog.client import metrics


class Deltas:
    """Counter values of `registry` relative to when it was made (the
    counters are per process, and other tests may have counted before)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.base = self.now()

    def now(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        out = {}
        for fam in self.registry.collect():
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def __call__(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return self.now()[key] - self.base.get(key, 0.0)


def test_client_counters_match_what_the_test_did(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    assert metrics.register(registry) is registry
    metrics.register(registry)  # twice: still one collector
    d = Deltas(registry)
    size = 100
    entry = b"e" * size
    with Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address) as log:
        for _ in range(10):
            log.append(entry)
        log.append_many([entry] * 20)
        seqr.pause()  # the first async append waits for its position: it is in flight
        try:
            futs = [log.append_async(entry)]
            assert d("zlog_client_async_in_flight") >= 1
        finally:
            seqr.resume()
        futs += [log.append_async(entry) for _ in range(99)]
        for f in futs:
            f.result(30)
        log.flush()
        assert d("zlog_client_async_in_flight") == 0
        assert d("zlog_client_appends_total") == 130
        assert d("zlog_client_append_bytes_total") == 130 * size

        # a position written behind the sequencer's back: the next append retries
        taken = log.tail()
        log.write(taken, b"first")
        assert log.append(entry) == taken + 1
        assert d("zlog_client_append_retries_total", cause="position_taken") == 1
        assert d("zlog_client_appends_total") == 131

        # a hole below the tail: a reader waits, then fills it (LOST)
        hole = log.take_positions(1)
        log.append(entry)
        base_reads = d("zlog_client_reads_total")
        kinds = [r.kind for r in log.stream(0, hole + 2, hole_wait=0.2)]
        assert kinds.count(RecordKind.LOST) == 1 and kinds.count(RecordKind.DATA) == hole + 1
        assert d("zlog_client_holes_filled_total") == 1
        assert d("zlog_client_reads_total") - base_reads == hole + 1

        before = d("zlog_client_read_bytes_total")
        assert log.read(0) == entry and log.read_async(1).result(30) == entry
        assert d("zlog_client_read_bytes_total") - before == 2 * size
        native = d("zlog_client_native_entries_sent_total")
    assert native + d("zlog_client_native_handed_back_total") >= 100  # async appends went through C++

    # a sequencer that does not answer: appends fall back to slow tail finding
    with Log.open(rados_cluster, ceph.pool, log_name, sequencer=f"127.0.0.1:{free_port()}") as log:
        if log.meta.sequencer:  # the metadata names the live daemon: stop it for this part
            seqr.kill()
        log.append(entry)
        log.append(entry)
    assert d("zlog_client_slow_tail_fallbacks_total") == 1  # once until the sequencer is back
    assert d("zlog_client_slow_tail_positions_total") == 2

    text = generate_latest(registry).decode()
    assert "zlog_client_appends_total" in text and 'cause="stale_epoch"' in text


def test_tally_counts_from_many_threads() -> None:
    import threading

    t = metrics.Tally()

    def work() -> None:
        for _ in range(20000):
            t.inc()
        t.inc(5)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.value == 8 * 20005


def test_histogram_buckets_from_many_threads() -> None:
    import threading

    h = metrics.Histogram((0.1, 1.0))

    def work() -> None:
        for v in (0.05, 0.1, 0.5, 2.0):
            h.observe(v)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    buckets, total = h.snapshot()
    assert buckets == [("0.1", 8), ("1.0", 12), ("+Inf", 16)]  # cumulative; a bound holds values equal to it
    assert abs(total - 4 * 2.65) < 1e-9


def test_append_latency_counts_calls_and_entries(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    metrics.register(registry)
    d = Deltas(registry)
    with Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address) as log:
        for _ in range(5):
            log.append(b"s")
        log.append_many([b"m"] * 10)  # one call
        for f in [log.append_async(b"a") for _ in range(30)]:
            f.result(60)
    assert d("zlog_client_append_seconds_count", path="sync") == 6
    assert d("zlog_client_append_seconds_count", path="async") == 30
    assert d("zlog_client_append_seconds_bucket", path="async", le="+Inf") == 30
    assert d("zlog_client_append_seconds_sum", path="sync") > 0
