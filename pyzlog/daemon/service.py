"""zlog-seqr: the sequencer daemon.

The C++ server (pyzlog._seqr) answers position requests from memory. When it
meets a log it does not serve yet, or a client shows an epoch newer than its
own (a reconfiguration or another sequencer), it queues a recovery request;
the threads here take a new epoch from the log's metadata object, seal every
data object of the newest view, run slow tail finding and install the counter
at max + 1, recording this daemon (its advertised address) as the log's
sequencer. Until then that log's clients get RETRY; other logs are served.

A log whose metadata names another sequencer that is alive is not taken:
its clients get RECOVERY_FAILED and follow the metadata to the owner. With
--pool, the daemon also stands by for the pool's logs (failover.py): it takes
over the logs of a daemon that died, and steps down from logs taken from it.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import click
import rados

from .. import _seqr  # type: ignore[attr-defined]  # the C++ extension
from ..core.cluster import connect
from ..core.errors import InvalidRequest, ZlogError
from .failover import Watch, check_address_free
from ..core.registry import DEFAULT_GROUP, DEFAULT_LEASE_SECONDS, answers
from .metrics import DEFAULT_MAX_LOGS, Exporter, parse_listen
from ..core.sequencer import parse_address
from ..core.state import LogState
from ..core.tailfind import find_tail

log = logging.getLogger("zlog-seqr")


class MetricsListenError(OSError):
    """--metrics names an address that cannot be listened on."""


class SequencerDaemon:
    def __init__(self, cluster: rados.Rados, host: str = "127.0.0.1", port: int = 5678,
                 recovery_threads: int = 4, advertise: str | None = None, pools: tuple[str, ...] = (),
                 lease: float = DEFAULT_LEASE_SECONDS, group: str = DEFAULT_GROUP,
                 metrics: tuple[str, int] | None = None, metrics_max_logs: int = DEFAULT_MAX_LOGS) -> None:
        self.cluster = cluster
        self.server = _seqr.Server(host, port)
        self._metrics_at = metrics
        self.exporter = Exporter(self.server, metrics_max_logs) if metrics is not None else None
        self.metrics_port: int | None = None
        self._advertise = advertise
        self._standby_pools = pools
        self._lease = lease
        self._group = group
        self.watch: Watch | None = None
        self._pool = ThreadPoolExecutor(recovery_threads, thread_name_prefix="recovery")
        self._running: set[tuple[str, str]] = set()
        # asked for again while running: the running recovery may install an
        # epoch the client has already passed, so run once more after it
        self._again: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.port)

    @property
    def address(self) -> str:
        """The address recorded as a log's sequencer: where clients reach this daemon."""
        return self._advertise or f"{self.server.host}:{self.port}"

    def start(self) -> None:
        if self._standby_pools and self._advertise:
            # before listening, so no client reaches a daemon about to refuse
            check_address_free(self.cluster, list(self._standby_pools), self._advertise, self._lease,
                               self._group)
        if self.exporter is not None and self._metrics_at is not None:
            # before the sequencer port: a daemon that is going to refuse never accepts a client
            try:
                self.metrics_port = self.exporter.serve(*self._metrics_at)
            except OSError as e:
                raise MetricsListenError(e.errno, e.strerror) from None
            log.info("metrics on http://%s:%d/metrics", self._metrics_at[0], self.metrics_port)
        try:
            self.server.start()
            if self._standby_pools:
                try:
                    self.watch = Watch(self.cluster, self.server, self.address, list(self._standby_pools),
                                       self._lease, self.request_recovery, self._group)
                    self.watch.start()
                except (ZlogError, rados.Error):
                    self.server.stop()
                    raise
        except BaseException:
            if self.exporter is not None:  # a daemon that did not start serves no metrics
                self.exporter.stop()
            raise
        self._thread = threading.Thread(target=self._serve_recoveries, name="recovery-queue", daemon=True)
        self._thread.start()
        log.info("serving on %s:%d as %s%s", self.server.host, self.port, self.address,
                 f", standing by for pools {', '.join(self._standby_pools)} (lease {self._lease:g}s)"
                 if self._standby_pools else "")

    def _serve_recoveries(self) -> None:
        while not self._stop.is_set() and self.server.running:
            for pool, name, client_epoch in self.server.wait_recovery(0.5):
                self.request_recovery(pool, name, client_epoch)

    def request_recovery(self, pool: str, name: str, client_epoch: int) -> None:
        """Recover (or take over) a log, once at a time per log."""
        key = (pool, name)
        with self._lock:
            if key in self._running:
                self._again[key] = max(client_epoch, self._again.get(key, 0))
                return
            self._running.add(key)
        self._submit(pool, name, client_epoch)

    def _submit(self, pool: str, name: str, client_epoch: int) -> None:
        try:
            self._pool.submit(self._recover, pool, name, client_epoch)
        except RuntimeError:  # shutting down
            with self._lock:
                self._running.discard((pool, name))

    def _recover(self, pool: str, name: str, client_epoch: int) -> None:
        t0, outcome, takeover = time.monotonic(), "failed", False
        try:
            state = LogState(self.cluster, pool, name)
            owner = state.refresh().sequencer  # LogNotFound if missing
            takeover = bool(owner) and owner != self.address
            if owner and owner != self.address and self._owner_alive(pool, owner):
                log.info("log %s/%s: served by %s, which is alive; not taking it", pool, name, owner)
                self.server.fail(pool, name, f"served by {owner}")
                outcome = "refused"
                return
            epoch, nxt = find_tail(state, sequencer=self.address)
            self.server.install(pool, name, epoch, nxt)
            outcome = "ok"
            log.info("log %s/%s: sealed epoch %d, serving from position %d (client was at epoch %d)",
                     pool, name, epoch, nxt, client_epoch)
        except ZlogError as e:
            log.warning("log %s/%s: recovery failed: %s", pool, name, e)
            self.server.fail(pool, name, str(e))
        except Exception as e:
            log.exception("log %s/%s: recovery crashed", pool, name)
            self.server.fail(pool, name, f"internal error: {e}")
        finally:
            if self.exporter is not None:
                self.exporter.recoveries.observe(time.monotonic() - t0, outcome, takeover)
            with self._lock:
                again = self._again.pop((pool, name), None)
                if again is None:
                    self._running.discard((pool, name))
            if again is not None and not self._stop.is_set():
                self._submit(pool, name, again)  # still marked running: asked again meanwhile
            elif again is not None:
                with self._lock:
                    self._running.discard((pool, name))

    def _owner_alive(self, pool: str, owner: str) -> bool:
        if self.watch is not None:
            return self.watch.owner_alive(pool, owner)
        return answers(owner, timeout=1.0)

    def stop(self) -> None:
        self._stop.set()
        self.server.stop()  # the port closes first: a standby that sees the record go finds it closed
        if self.watch is not None:
            self.watch.stop()
        if self._thread:
            self._thread.join(5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.exporter is not None:
            self.exporter.stop()
        log.info("stopped: %s", self.server.stats())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to bind; loopback unless you mean to expose it (there is no authentication)")
@click.option("--port", default=5678, show_default=True, type=click.IntRange(0, 65535))
@click.option("--conf", envvar="CEPH_CONF", default=None, help="ceph.conf [env: CEPH_CONF]")
@click.option("--keyring", default=None)
@click.option("--client", default="client.admin", show_default=True)
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="the address clients reach this daemon at, recorded in the logs it serves "
                   "[default: --host:--port; required when --host is a wildcard]")
@click.option("--pool", "pools", multiple=True, metavar="POOL",
              help="stand by for this pool's logs: take over those of a daemon that dies (repeatable)")
@click.option("--lease", default=DEFAULT_LEASE_SECONDS, show_default=True, type=click.FloatRange(0.2, 600),
              help="seconds without a beat after which a daemon counts as dead")
@click.option("--group", default=DEFAULT_GROUP, show_default=True,
              help="stand by only with daemons of this group (clients find daemons of the default group)")
@click.option("--metrics", default=None, metavar="[HOST:]PORT",
              help="serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT listens on 127.0.0.1)")
@click.option("--metrics-max-logs", default=DEFAULT_MAX_LOGS, show_default=True, type=click.IntRange(0, 100000),
              help="logs with series of their own; the rest are added up under log=\"other\"")
def main(host: str, port: int, conf: str | None, keyring: str | None, client: str, log_level: str,
         advertise: str | None, pools: tuple[str, ...], lease: float, group: str, metrics: str | None,
         metrics_max_logs: int) -> None:
    """Run the zlog sequencer: hands out log positions from memory."""
    metrics_at = None
    if metrics is not None:
        try:
            metrics_at = parse_listen(metrics)
        except InvalidRequest as e:
            raise click.BadParameter(str(e), param_hint="--metrics") from None
    if advertise is None and host in ("0.0.0.0", "::", ""):
        raise click.UsageError(f"--host {host!r} listens everywhere: say with --advertise HOST:PORT "
                               "where clients reach this daemon")
    if advertise is not None:
        try:
            parse_address(advertise)
        except InvalidRequest as e:
            raise click.BadParameter(str(e), param_hint="--advertise") from None
    logging.basicConfig(stream=sys.stderr, level=log_level.upper(),
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    _seqr.set_log_level("debug" if log_level == "debug" else "warning")
    try:
        cluster = connect(conf, keyring=keyring, client=client)
    except ZlogError as e:
        raise click.ClickException(str(e)) from None
    if not group or not group.replace("-", "").replace("_", "").isalnum():
        raise click.BadParameter("letters, digits, - and _ only", param_hint="--group")
    daemon = SequencerDaemon(cluster, host, port, advertise=advertise, pools=pools, lease=lease, group=group,
                             metrics=metrics_at, metrics_max_logs=metrics_max_logs)
    # before the port opens: a SIGTERM as soon as it accepts still shuts down cleanly
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        daemon.start()
    except MetricsListenError as e:
        cluster.shutdown()
        raise click.ClickException(f"cannot serve metrics on {metrics}: {e.strerror}") from None
    except OSError as e:
        cluster.shutdown()
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None
    except (ZlogError, rados.Error) as e:
        cluster.shutdown()
        raise click.ClickException(f"cannot stand by for pools {', '.join(pools)}: {e}") from None
    done.wait()
    log.info("shutting down")
    daemon.stop()
    cluster.shutdown()


if __name__ == "__main__":
    main()
