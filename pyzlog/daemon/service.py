"""zlog-seqr: the sequencer daemon.

The C++ server (pyzlog._seqr) answers position requests from memory. When it
meets a log it does not serve yet, or a client shows an epoch newer than its
own (a reconfiguration or another sequencer), it queues a recovery request;
the threads here take a new epoch from the log's metadata object, seal every
data object of the newest view, run slow tail finding and install the counter
at max + 1, recording this daemon (its advertised address) as the log's
sequencer. Until then that log's clients get RETRY; other logs are served.

A log whose metadata names another sequencer that is alive is not taken:
its clients get RECOVERY_FAILED and follow the metadata to the owner.

The daemon serves only the pools given with --pool, and only to clients that
prove they hold the pool's secret (seqr_auth.py; docs/seqr-protocol.md): a
connection for any other pool is refused before it learns anything, so the
daemon never does recovery work for a pool it does not serve. It re-reads
the secrets every --secret-refresh seconds and on SIGHUP. It also stands by
for its pools' logs (failover.py; not with --no-standby): it takes over the
logs of a daemon that died, and steps down from logs taken from it.
--insecure drops the proof (and without --pool serves every pool).

A rotated cephx key (issue 24): librados reads the keyring only when it
connects, so on SIGHUP the daemon also looks at its keyring file. If the file
changed, it connects once with the new keyring to check it (a bad one is
logged and the daemon goes on with the key it has), then stops cleanly (its
port closes and its registry record goes, so a standby takes its logs at
once) and executes itself again with the same arguments and pid, which
connects with the new key and serves again. Nothing stored is touched: a log
it served is taken by a standby or recovered (a new epoch sealed, the tail
found) by the restarted daemon when a client asks.
"""
from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import click
import rados

from .. import _seqr  # type: ignore[attr-defined]  # the C++ extension
from ..core.cluster import connect
from ..core.cluster import open_ioctx
from ..core.errors import InvalidRequest, ZlogError, is_blocklisted
from .failover import Watch, check_address_free
from ..core.registry import DEFAULT_GROUP, DEFAULT_LEASE_SECONDS, answers
from .metrics import DEFAULT_MAX_LOGS, Exporter, parse_listen
from ..core.seqr_auth import Credentials, PoolSecret, TLSSettings, read_secret
from ..core.sequencer import parse_address
from ..core.state import LogState
from ..core.tailfind import find_tail

log = logging.getLogger("zlog-seqr")

#: per connection: positions a second on average, and at most at once. The
#: rate is ten times what one client appends (about 160,000 a second at
#: depth 128 on a 2-core machine): a bound on a buggy or hostile client
#: that never slows a working one
DEFAULT_MAX_RATE = 1_000_000
DEFAULT_MAX_OUTSTANDING = 131_072
#: re-read the pools' secrets this often (and on SIGHUP)
DEFAULT_SECRET_REFRESH = 10.0


class MetricsListenError(OSError):
    """--metrics names an address that cannot be listened on."""


class SequencerDaemon:
    """`pools`: the pools served (and stood by for, with `standby`). `auth`
    off (--insecure): no proof asked, and with no pools every pool served."""

    def __init__(self, cluster: rados.Rados, host: str = "127.0.0.1", port: int = 5678,
                 recovery_threads: int = 4, advertise: str | None = None, pools: tuple[str, ...] = (),
                 lease: float = DEFAULT_LEASE_SECONDS, group: str = DEFAULT_GROUP,
                 metrics: tuple[str, int] | None = None, metrics_max_logs: int = DEFAULT_MAX_LOGS,
                 auth: bool = True, standby: bool = True, tls_cert: str | None = None,
                 tls_key: str | None = None, tls_ca: str | None = None,
                 max_rate: int = DEFAULT_MAX_RATE, max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
                 secret_refresh: float = DEFAULT_SECRET_REFRESH) -> None:
        if auth and not pools:
            raise InvalidRequest("a daemon with authentication serves the pools it is given (--pool)")
        self.cluster = cluster
        self.server = _seqr.Server(host, port, require_auth=auth, tls_cert=tls_cert or "",
                                   tls_key=tls_key or "", max_rate=max_rate, max_outstanding=max_outstanding)
        self._auth = auth
        self._pools = tuple(dict.fromkeys(pools))
        #: how this daemon probes its peers (the handshake's first answer; TLS like its own port)
        self.credentials = Credentials(cluster, TLSSettings(bool(tls_cert), tls_ca), insecure=False)
        self._secrets: dict[str, PoolSecret] = {}
        self._secret_refresh = secret_refresh
        self._reload = threading.Event()
        self._secret_thread: threading.Thread | None = None
        self._metrics_at = metrics
        self.exporter = Exporter(self.server, metrics_max_logs) if metrics is not None else None
        self.metrics_port: int | None = None
        self._advertise = advertise
        self._standby_pools = self._pools if standby else ()
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
        #: set when the cluster refused this daemon as blocklisted (zlog revoke): it serves no more
        self.cut_off: ZlogError | rados.Error | None = None
        #: called once then (the command line's main loop wakes and exits)
        self.on_cut_off: Callable[[], None] = lambda: None

    @property
    def port(self) -> int:
        return int(self.server.port)

    @property
    def address(self) -> str:
        """The address recorded as a log's sequencer: where clients reach this daemon."""
        return self._advertise or f"{self.server.host}:{self.port}"

    def load_secrets(self) -> None:
        """Read every served pool's secret (made if missing) and give the
        server any that changed. Raises if a pool's cannot be read."""
        for pool in self._pools:
            if not self._auth:
                if pool not in self._secrets:
                    self.server.set_pool(pool, [])
                    self._secrets[pool] = PoolSecret(())
                continue
            secret = read_secret(self.cluster, pool)
            if self._secrets.get(pool) == secret:
                continue
            closed = self.server.set_pool(pool, secret.pairs())
            old = self._secrets.get(pool)
            self._secrets[pool] = secret
            gens = ", ".join(str(k.generation) for k in secret.keys)
            if old is None:
                log.info("pool %s: sequencer secret generation %d (accepting %s)", pool,
                         secret.current.generation, gens)
            else:
                log.warning("pool %s: sequencer secret rotated to generation %d (accepting %s)%s", pool,
                            secret.current.generation, gens,
                            f"; closed {closed} connection(s) of a revoked key" if closed else "")

    def reload_secrets(self) -> None:
        """Re-read the secrets now (SIGHUP), on the secrets thread."""
        self._reload.set()

    def _refresh_secrets(self) -> None:
        """Every --secret-refresh seconds (and on SIGHUP): re-read the secrets,
        or without authentication look at an object of each pool; either way
        a daemon the cluster blocklisted finds out within that period, even
        with no client asking it for a recovery."""
        while not self._stop.is_set():
            self._reload.wait(self._secret_refresh)
            self._reload.clear()
            if self._stop.is_set():
                return
            try:
                if self._auth:
                    self.load_secrets()
                else:
                    for pool in self._pools:
                        _probe(self.cluster, pool)
            except (ZlogError, rados.Error) as e:  # keep serving with the secrets it has
                if is_blocklisted(e):
                    self._cut_off(e)
                    return
                log.warning("cannot re-read the sequencer secrets: %s", e)

    def _cut_off(self, e: ZlogError | rados.Error) -> None:
        """The cluster blocklisted this daemon (its key revoked: zlog revoke).
        It can seal nothing and record nothing, so it must not hand out
        positions either: its port closes at once, and the daemon exits."""
        with self._lock:
            if self.cut_off is not None:
                return
            self.cut_off = e
        log.error("cut off from the cluster (%s): this daemon's key was revoked or it was blocklisted; "
                  "it stops serving, as it cannot back the positions it hands out", e)
        self.server.stop()
        self.on_cut_off()

    def start(self) -> None:
        # before listening: a client must never meet a server without its pools' keys
        self.load_secrets()
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
                                       self._lease, self.request_recovery, self._group, self.credentials)
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
        self._secret_thread = threading.Thread(target=self._refresh_secrets, name="secrets", daemon=True)
        self._secret_thread.start()
        served = (f"pools {', '.join(self._pools)}" if self._pools else "every pool")
        log.info("serving on %s:%d as %s: %s, %s%s%s", self.server.host, self.port, self.address, served,
                 "clients authenticated" if self._auth else "NO AUTHENTICATION (--insecure)",
                 ", TLS" if self.server.tls else "",
                 f"; standing by for pools {', '.join(self._standby_pools)} (lease {self._lease:g}s)"
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
            if self._pools and pool not in self._pools:  # the server refuses such clients; never work for them
                self.server.fail(pool, name, "pool not served here")
                outcome = "refused"
                return
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
            if is_blocklisted(e):
                self._cut_off(e)
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
        return answers(owner, timeout=1.0, credentials=self.credentials)

    def stop(self) -> None:
        self._stop.set()
        self._reload.set()
        self.server.stop()  # the port closes first: a standby that sees the record go finds it closed
        if self.watch is not None:
            self.watch.stop()
        if self._thread:
            self._thread.join(5)
        if self._secret_thread:
            self._secret_thread.join(5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.exporter is not None:
            self.exporter.stop()
        log.info("stopped: %s", self.server.stats())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to bind; loopback unless you mean to expose it (docs/deploy.md: what to firewall)")
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
              help="serve this pool's logs to clients holding its secret, and stand by for them: take "
                   "over those of a daemon that dies (repeatable; required unless --insecure)")
@click.option("--no-standby", is_flag=True,
              help="serve the --pool pools without standing by (no registry record, no take-overs)")
@click.option("--insecure", is_flag=True,
              help="no authentication: any client that reaches the port takes positions (with no --pool, "
                   "of every pool). For a closed test bed only")
@click.option("--tls-cert", default=None, metavar="FILE",
              help="TLS certificate chain (PEM): connections run TLS, plaintext ones are refused")
@click.option("--tls-key", default=None, metavar="FILE", help="TLS private key (PEM), with --tls-cert")
@click.option("--tls-ca", default=None, metavar="FILE",
              help="CA (PEM) to verify other daemons' certificates when probing them [default: not verified]")
@click.option("--max-rate", default=DEFAULT_MAX_RATE, show_default=True, type=click.IntRange(0, 2**32 - 1),
              help="positions a connection may take per second on average (0: no limit)")
@click.option("--max-outstanding", default=DEFAULT_MAX_OUTSTANDING, show_default=True,
              type=click.IntRange(1, 2**32 - 1),
              help="positions a connection may take at once before the rate applies (a request for more is refused)")
@click.option("--secret-refresh", default=DEFAULT_SECRET_REFRESH, show_default=True,
              type=click.FloatRange(0.1, 3600), help="seconds between re-reads of the pools' secrets (also on SIGHUP)")
@click.option("--lease", default=DEFAULT_LEASE_SECONDS, show_default=True, type=click.FloatRange(0.2, 600),
              help="seconds without a beat after which a daemon counts as dead")
@click.option("--group", default=DEFAULT_GROUP, show_default=True,
              help="stand by only with daemons of this group (clients find daemons of the default group)")
@click.option("--metrics", default=None, metavar="[HOST:]PORT",
              help="serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT listens on 127.0.0.1)")
@click.option("--metrics-max-logs", default=DEFAULT_MAX_LOGS, show_default=True, type=click.IntRange(0, 100000),
              help="logs with series of their own; the rest are added up under log=\"other\"")
def main(host: str, port: int, conf: str | None, keyring: str | None, client: str, log_level: str,
         advertise: str | None, pools: tuple[str, ...], no_standby: bool, insecure: bool, tls_cert: str | None,
         tls_key: str | None, tls_ca: str | None, max_rate: int, max_outstanding: int, secret_refresh: float,
         lease: float, group: str, metrics: str | None, metrics_max_logs: int) -> None:
    """Run the zlog sequencer: hands out log positions from memory."""
    metrics_at = None
    if metrics is not None:
        try:
            metrics_at = parse_listen(metrics)
        except InvalidRequest as e:
            raise click.BadParameter(str(e), param_hint="--metrics") from None
    if not pools and not insecure:
        raise click.UsageError("say which pools this daemon serves (--pool POOL, repeatable); their clients "
                               "authenticate with the pool's secret. --insecure serves every pool to anyone")
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
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
    if insecure:
        log.warning("--insecure: anyone who reaches %s:%d can take positions%s", host, port,
                    "" if pools else " of every pool")
    try:
        cluster = connect(conf, keyring=keyring, client=client)
    except ZlogError as e:
        raise click.ClickException(str(e)) from None
    if not group or not group.replace("-", "").replace("_", "").isalnum():
        raise click.BadParameter("letters, digits, - and _ only", param_hint="--group")
    try:
        daemon = SequencerDaemon(cluster, host, port, advertise=advertise, pools=pools, lease=lease, group=group,
                                 metrics=metrics_at, metrics_max_logs=metrics_max_logs, auth=not insecure,
                                 standby=not no_standby, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                                 max_rate=max_rate, max_outstanding=max_outstanding, secret_refresh=secret_refresh)
    except ValueError as e:  # a certificate or key that does not load
        cluster.shutdown()
        raise click.ClickException(str(e)) from None
    # before the port opens: a SIGTERM as soon as it accepts still shuts down cleanly
    done = threading.Event()
    hup, term = threading.Event(), threading.Event()

    def on_term(*_: object) -> None:
        term.set()
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_term)

    def on_hup(*_: object) -> None:
        daemon.reload_secrets()
        hup.set()
        done.set()

    signal.signal(signal.SIGHUP, on_hup)
    daemon.on_cut_off = done.set
    key_file = keyring_path(cluster, keyring)
    key_seen = file_digest(key_file)
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
        raise click.ClickException(f"cannot serve pools {', '.join(pools)}: {e}") from None
    restart = False
    while True:
        done.wait()
        done.clear()
        if term.is_set() or daemon.cut_off is not None or not hup.is_set():
            break
        hup.clear()
        now = file_digest(key_file)
        if now == key_seen:
            continue
        key_seen = now
        if keyring_works(conf, key_file, client):
            log.warning("keyring %s changed: restarting to connect with the new key", key_file)
            restart = True
            break
    log.info("shutting down")
    daemon.stop()
    cluster.shutdown()
    if daemon.cut_off is not None:
        raise click.ClickException(f"cut off from the cluster: {daemon.cut_off}")
    if restart:
        sys.stderr.flush()
        # the same pid and arguments: a supervisor sees no exit
        os.execv(sys.executable, [sys.executable, "-m", "pyzlog.daemon.service", *sys.argv[1:]])


def _probe(cluster: rados.Rados, pool: str) -> None:
    """One request to an OSD of `pool` (a stat of an object that need not exist)."""
    io = open_ioctx(cluster, pool)
    try:
        io.stat("zlog.seqr.probe")
    except rados.ObjectNotFound:
        pass
    finally:
        io.close()


def keyring_path(cluster: rados.Rados, given: str | None) -> str | None:
    """The keyring file the connection read: --keyring, or the first of
    ceph.conf's `keyring` list that exists."""
    if given:
        return given
    try:
        value = cluster.conf_get("keyring") or ""
    except rados.Error:
        return None
    for path in (p.strip() for p in value.split(",")):
        if path and os.path.isfile(path):
            return path
    return None


def file_digest(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def keyring_works(conf: str | None, path: str | None, client: str) -> bool:
    """Does `path` hold a key the monitors accept for `client`? Logged if not."""
    if not path:
        return False
    try:
        connect(conf, keyring=path, client=client, connect_timeout=10).shutdown()
        return True
    except ZlogError as e:
        log.error("keyring %s changed but does not work (%s): going on with the key in use", path, e)
        return False


if __name__ == "__main__":
    main()
