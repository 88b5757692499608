"""zlog-seqr --metrics: /metrics scraped from a running daemon under load
shows exactly the requests, positions and answers the test caused."""
from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from seqr_proc import SeqrProcess, free_port

from pyzlog import Credentials, Log, _seqr  # type: ignore[attr-defined]
from pyzlog.core.errors import InvalidRequest
from pyzlog.daemon.metrics import parse_listen


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def per_log(m: dict[Any, float], name: str, pool: str, log: str) -> float:
    return m.get((name, (("log", log), ("pool", pool))), -1.0)


class Counted:
    """A raw sequencer client that counts every answer it gets."""

    def __init__(self, port: int, auth: dict[str, Any]) -> None:
        self.c = _seqr.Client("127.0.0.1", port, 5.0, auth)
        self.requests = self.positions = self.retries = self.stale = 0
        self.by_log: dict[str, int] = {}  # requests per log

    def next_ok(self, pool: str, log: str, epoch: int) -> int:
        """Ask until OK, following STALE_EPOCH; returns the epoch served."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, e, _, n = self.c.next(pool, log, epoch, 1)
            self.requests += 1
            self.by_log[log] = self.by_log.get(log, 0) + 1
            if status == _seqr.OK:
                self.positions += n
                return int(e)
            if status == _seqr.RETRY:
                self.retries += 1
                time.sleep(0.01)
            elif status == _seqr.STALE_EPOCH:
                self.stale += 1
                epoch = e
            else:
                raise AssertionError(f"status {status}")
        raise AssertionError("no OK answer")


@pytest.fixture
def seqr(ceph, tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    p = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log",
                    # the load below is over one connection's default position budget
                    args=("--metrics", str(port), "--metrics-max-logs", "2", "--max-rate", "0")).start()
    p.metrics_port = port  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while True:
        try:
            scrape(port)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield p
    p.kill()


def test_metrics_match_the_load(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    pool, port = ceph.pool, seqr.metrics_port
    names = [f"{log_name}-a", f"{log_name}-b", f"{log_name}-c"]
    for n in names:
        Log.create(rados_cluster, pool, n, width=2)
    auth = Credentials(rados_cluster).native(pool)  # the pool's secret, read with this client's caps
    client = Counted(seqr.port, auth)
    epoch = client.next_ok(pool, names[0], 1)
    scrape(port)  # the exporter sees log a first: it keeps a series of its own

    # load: pipelined requests of 3 positions each, scraped meanwhile
    seen: list[float] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            seen.append(per_log(scrape(port), "zlog_seqr_log_positions_total", pool, names[0]))
            time.sleep(0.02)

    t = threading.Thread(target=scraper)
    t.start()
    loader = _seqr.Client("127.0.0.1", seqr.port, 10.0, auth)
    total, rounds, deadline = 0, 0, time.monotonic() + 20
    while (rounds < 5 or len(seen) < 3) and time.monotonic() < deadline:  # bounded in count and time
        res = loader.pipeline_next(pool, names[0], epoch, 3, 20000, 64)
        assert res["ok"] == 20000 and res["positions"] == 60000
        total += 20000
        rounds += 1
    stop.set()
    t.join()
    assert len(seen) >= 2 and seen == sorted(seen), "counters went backwards under load"

    for n in names[1:]:
        client.next_ok(pool, n, 1)
    m = scrape(port)
    requests = client.requests + total
    assert per_log(m, "zlog_seqr_log_requests_total", pool, names[0]) == client.by_log[names[0]] + total
    assert per_log(m, "zlog_seqr_log_requests_total", pool, names[1]) == client.by_log[names[1]]
    assert per_log(m, "zlog_seqr_log_requests_total", "other", "other") == client.by_log[names[2]]
    assert per_log(m, "zlog_seqr_log_positions_total", pool, names[0]) == 1 + 3 * total
    assert per_log(m, "zlog_seqr_log_epoch", pool, names[0]) == epoch
    # log b got the second series; log c is over the bound and counted as "other"
    assert per_log(m, "zlog_seqr_log_positions_total", pool, names[1]) == 1
    assert per_log(m, "zlog_seqr_log_positions_total", pool, names[2]) == -1
    assert per_log(m, "zlog_seqr_log_positions_total", "other", "other") == 1
    assert m[("zlog_seqr_positions_total", ())] == client.positions + 3 * total
    assert m[("zlog_seqr_requests_total", ())] == requests
    assert m[("zlog_seqr_retry_answers_total", ())] == client.retries
    assert m[("zlog_seqr_stale_answers_total", ())] == client.stale
    assert m[("zlog_seqr_request_seconds_count", ())] == requests  # every request is timed
    assert m[("zlog_seqr_request_seconds_bucket", (("le", "+Inf"),))] == requests
    assert m[("zlog_seqr_connections_open", ())] >= 1
    assert m[("zlog_seqr_stream_history_positions", ())] == 0  # plain appends name no stream
    assert m[("zlog_seqr_logs", (("state", "ready"),))] == 3
    assert m[("zlog_seqr_recovery_seconds_count", (("kind", "recovery"), ("outcome", "ok")))] == 3
    assert m[("zlog_seqr_auth_ok_total", ())] == 2  # two connections, each authenticated once
    assert m[("zlog_seqr_auth_refused_total", (("reason", "wrong_key"),))] == 0
    assert m[("zlog_seqr_secret_generation", (("pool", pool),))] >= 1


def test_metrics_address_parsing_and_refusal(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert parse_listen("9400") == ("127.0.0.1", 9400)
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    for bad in ("x", "host:", "1:99999"):
        with pytest.raises(InvalidRequest):
            parse_listen(bad)
    with pytest.raises(RuntimeError):
        SeqrProcess(ceph.conf, log_path=tmp_path / "bad.log", args=("--metrics", "nope")).start()
    assert "--metrics" in (tmp_path / "bad.log").read_text()
    with socket.socket() as busy:  # a metrics port already taken: a clear error, and no daemon
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError):
            SeqrProcess(ceph.conf, log_path=tmp_path / "busy.log", args=("--metrics", str(port))).start()
    assert f"cannot serve metrics on {port}: Address already in use" in (tmp_path / "busy.log").read_text()
