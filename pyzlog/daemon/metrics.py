"""Prometheus metrics of a zlog-seqr daemon (`zlog-seqr --metrics [HOST:]PORT`).

The C++ server counts its answers itself (atomic counters, per-log counters
kept on its io thread, a latency histogram with one clock read per batch of
requests); nothing here runs per request. A scrape reads those counters
through ServerCollector. Recoveries and take-overs are rare and timed in
Python (RecoveryMetrics).

Per-log series are bounded: the first `max_logs` logs the exporter sees get
a series of their own, for as long as the daemon runs; the others are added
up under log="other" (pool "other" too), so a daemon serving many logs does
not blow up the scraper.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .. import _seqr  # type: ignore[attr-defined]
from ..core.errors import InvalidRequest

#: logs with their own series unless --metrics-max-logs says otherwise
DEFAULT_MAX_LOGS = 100
OTHER = "other"
#: per-log counters the C++ server keeps, and their help texts
_PER_LOG = {
    "requests": "requests answered for the log",
    "positions": "positions handed out for the log",
    "stale": "STALE_EPOCH answers (the client's epoch was older than the log's)",
    "retries": "RETRY answers (the log was recovering or not yet served)",
    "recovery_failed": "RECOVERY_FAILED answers (the log is served elsewhere or could not be taken)",
}


def parse_listen(value: str) -> tuple[str, int]:
    """'PORT' (loopback), 'HOST:PORT' or '[V6]:PORT' -> (host, port)."""
    value = value.strip()
    host, sep, port_s = value.rpartition(":")
    if not sep:
        host, port_s = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_s, 10)
    except ValueError:
        raise InvalidRequest(f"bad metrics address {value!r}: expected PORT or HOST:PORT") from None
    if not 0 <= port <= 65535:
        raise InvalidRequest(f"bad metrics port {port}: must be 0..65535")
    return host, port


class ServerCollector(Collector):
    """Reads a pyzlog._seqr.Server's counters at scrape time."""

    def __init__(self, server: Any, max_logs: int = DEFAULT_MAX_LOGS) -> None:
        self.server = server
        self.max_logs = max_logs
        self._labelled: set[tuple[str, str]] = set()  # sticky: a log keeps its series
        self._lock = threading.Lock()

    def _label(self, pool: str, log: str) -> tuple[str, str]:
        key = (pool, log)
        with self._lock:
            if key in self._labelled:
                return key
            if len(self._labelled) < self.max_logs:
                self._labelled.add(key)
                return key
        return OTHER, OTHER

    def collect(self) -> Iterator[Any]:
        st = self.server.stats()
        logs = self.server.logs() if self.server.running else []
        yield _counter("zlog_seqr_requests", "requests answered (all logs, bad ones included)", st["requests"])
        yield _counter("zlog_seqr_positions", "positions handed out (all logs)", st["positions"])
        yield _counter("zlog_seqr_stale_answers", "STALE_EPOCH answers (all logs)", st["stale"])
        yield _counter("zlog_seqr_retry_answers", "RETRY answers (all logs)", st["retries"])
        yield _counter("zlog_seqr_recovery_failed_answers", "RECOVERY_FAILED answers (all logs)",
                       st["recovery_failed"])
        yield _counter("zlog_seqr_bad_requests", "malformed requests refused", st["bad_requests"])
        yield _counter("zlog_seqr_bad_frames", "connections closed for a bad frame length", st["bad_frames"])
        yield _counter("zlog_seqr_recoveries_queued", "recoveries the server asked for", st["recoveries_queued"])
        yield _counter("zlog_seqr_connections", "connections accepted", st["connections_total"])
        yield _counter("zlog_seqr_connections_rejected", "connections refused at the limit",
                       st["connections_rejected"])
        yield _gauge("zlog_seqr_connections_open", "open client connections", st["connections_open"])
        yield _counter("zlog_seqr_auth_ok", "connections that completed the handshake", st["auth_ok"])
        refused = CounterMetricFamily("zlog_seqr_auth_refused",
                                      "connections refused before any position or epoch, by reason",
                                      labels=["reason"])
        for reason, n in sorted(st["refused"].items()):
            refused.add_metric([reason], n)
        refused.add_metric(["timeout"], st["handshake_timeouts"])
        refused.add_metric(["tls_handshake"], st["tls_failures"])
        yield refused
        yield _counter("zlog_seqr_connections_revoked", "connections closed because their key was revoked",
                       st["revoked"])
        yield _counter("zlog_seqr_connections_tls", "connections that ran TLS", st["connections_tls"])
        yield _counter("zlog_seqr_probes", "liveness probes answered (other daemons asking)", st["probes"])
        yield _gauge("zlog_seqr_stream_history_positions",
                     f"positions kept in the streams' histories, of a budget of {_seqr.STREAM_HISTORY_BUDGET}",
                     st["stream_history_positions"])
        yield _counter("zlog_seqr_not_authorised_answers",
                       "NOT_AUTHORISED answers (a request for a pool other than the connection's)",
                       st["not_authorised"])
        yield _counter("zlog_seqr_rate_limited_answers",
                       "RATE_LIMITED answers (a connection over its position budget)", st["rate_limited"])
        if self.server.running:
            gens = GaugeMetricFamily("zlog_seqr_secret_generation",
                                     "the newest key generation accepted for the pool", labels=["pool"])
            for pool, accepted in sorted(self.server.pools().items()):
                gens.add_metric([pool], accepted[0] if accepted else 0)
            yield gens
        states = GaugeMetricFamily("zlog_seqr_logs", "logs the server knows, by state", labels=["state"])
        by_state = {"ready": 0, "initialising": 0, "failed": 0}
        for info in logs:
            by_state[info["state"]] = by_state.get(info["state"], 0) + 1
        for state, n in sorted(by_state.items()):
            states.add_metric([state], n)
        yield states
        yield from self._per_log(logs)
        yield self._latency()

    def _per_log(self, logs: list[dict[str, Any]]) -> Iterator[Any]:
        families = {k: CounterMetricFamily(f"zlog_seqr_log_{k}", help_, labels=["pool", "log"])
                    for k, help_ in _PER_LOG.items()}
        epoch = GaugeMetricFamily("zlog_seqr_log_epoch", "the epoch the log is served at", labels=["pool", "log"])
        streams = GaugeMetricFamily("zlog_seqr_log_streams", "streams whose backpointers the server keeps for the log",
                                    labels=["pool", "log"])
        sums: dict[tuple[str, str], dict[str, int]] = {}
        for info in sorted(logs, key=lambda i: (i["pool"], i["log"])):
            label = self._label(info["pool"], info["log"])
            acc = sums.setdefault(label, dict.fromkeys(_PER_LOG, 0))
            for k in _PER_LOG:
                acc[k] += int(info[k])
            if label != (OTHER, OTHER):
                epoch.add_metric(list(label), info["epoch"])
                streams.add_metric(list(label), info.get("streams", 0))
        for label, acc in sums.items():
            for k, fam in families.items():
                fam.add_metric(list(label), acc[k])
        yield from families.values()
        yield epoch
        yield streams

    def _latency(self) -> HistogramMetricFamily:
        lat = self.server.latency()
        cumulative, buckets = 0, []
        for bound, n in zip([*lat["bounds_s"], float("inf")], lat["buckets"]):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        return HistogramMetricFamily("zlog_seqr_request_seconds",
                                     "time in the server from a request's bytes arriving to its answer queued",
                                     buckets=buckets, sum_value=lat["sum_s"])


def _counter(name: str, help_: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_, value=value)


def _gauge(name: str, help_: str, value: int) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=value)


class RecoveryMetrics:
    """Recoveries (a log's epoch sealed and its tail found) and take-overs
    (the same, of a log another daemon served), with their durations."""

    def __init__(self, registry: CollectorRegistry) -> None:
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.recovery = Histogram("zlog_seqr_recovery_seconds", "recoveries of a log, by outcome and kind",
                                  ["outcome", "kind"], buckets=buckets, registry=registry)

    def observe(self, seconds: float, outcome: str, takeover: bool) -> None:
        self.recovery.labels(outcome, "takeover" if takeover else "recovery").observe(seconds)


class Exporter:
    """The /metrics HTTP endpoint of one daemon."""

    def __init__(self, server: Any, max_logs: int = DEFAULT_MAX_LOGS) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ServerCollector(server, max_logs))
        self.recoveries = RecoveryMetrics(self.registry)
        self._http: Any = None
        self._thread: threading.Thread | None = None

    def serve(self, host: str, port: int) -> int:
        """Start serving; returns the bound port (port 0 picks one)."""
        from prometheus_client import start_http_server

        self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http.server_port)

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
