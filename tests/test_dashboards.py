"""deploy/: the Grafana dashboard and the Prometheus alert rules query only
metrics that exist. Every series they name -- with the label values they
match exactly -- is found in a real scrape of a client (its registry served
over HTTP) and of zlog-seqr daemons (--metrics) after the events those
series count: appends, consumers, a sequencer take-over, a recovery that
failed. With promtool on the PATH (or $PROMTOOL), the rules and every
dashboard query are also checked for PromQL syntax."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from seqr_proc import SeqrProcess, free_port

from pyzlog import Log
from pyzlog.client import metrics
from pyzlog.core import sequencer as sq
from pyzlog.core.registry import registry_ioctx

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "pyzlog-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "pyzlog-alerts.yml"

#: a metric name and the label values it must have (only exact '=' matchers)
Selector = tuple[str, tuple[tuple[str, str], ...]]
Samples = set[tuple[str, tuple[tuple[str, str], ...]]]


def selectors(expr: str) -> list[Selector]:
    out = []
    for m in re.finditer(r"\b(zlog_[A-Za-z0-9_]+)\s*(\{([^}]*)\})?", expr):
        exact = tuple(sorted((k, v) for k, op, v in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', m.group(3) or "")
                             if op == "="))
        out.append((m.group(1), exact))
    return out


def dashboard_queries() -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    found.append(v)
                elif k == "query" and isinstance(v, str):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))) for fam in text_string_to_metric_families(text)
            for s in fam.samples}


def wait_until(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_the_files_are_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and len(panels) >= 15
    for p in panels:
        assert p["targets"] and p["title"], p
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        assert all(t["expr"].strip() for t in p["targets"])
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("append rate", "append latency", "retries by cause", "take-overs", "holes filled", "consumer lag"):
        assert topic in titles, topic
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) and len(rules) >= 10
    for r in rules:
        assert r["expr"].strip() and r["labels"]["severity"] in ("info", "warning", "critical")
        assert r["annotations"]["summary"]
    queried = {n for q in dashboard_queries() + [r["expr"] for r in rules] for n, _ in selectors(q)}
    for family in ("zlog_client_appends_total", "zlog_client_append_seconds_bucket",
                   "zlog_client_append_retries_total", "zlog_seqr_recovery_seconds_count",
                   "zlog_client_holes_filled_total", "zlog_client_consumer_lag"):
        assert family in queried, family


def test_the_selector_parser() -> None:
    assert selectors('rate(zlog_a_total{cause="x", pool=~"$pool"}[5m]) / zlog_b') == [
        ("zlog_a_total", (("cause", "x"),)), ("zlog_b", ())]


@pytest.fixture
def daemons(ceph, rados_cluster, tmp_path: Path) -> Iterator[list[SeqrProcess]]:  # type: ignore[no-untyped-def]
    """Two standby daemons with --metrics; stopped (and their registry records removed) at the end."""
    started: list[SeqrProcess] = []
    for i in range(2):
        port = free_port()
        p = SeqrProcess(ceph.conf, log_path=tmp_path / f"seqr{i}.log", pool=ceph.pool,
                        args=("--pool", ceph.pool, "--lease", "1", "--metrics", str(port))).start()
        p.metrics_port = port  # type: ignore[attr-defined]
        started.append(p)
    yield started
    io = registry_ioctx(rados_cluster, ceph.pool)
    for p in started:
        p.kill()
        try:
            io.remove_object(p.address)
        except Exception:  # noqa: BLE001 - not registered, or removed already
            pass


def test_every_queried_series_is_in_a_real_scrape(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    a, b = daemons
    # the client: appends of every path, reads, a consumer
    registry = CollectorRegistry()
    metrics.register(registry)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=a.address)
        log.append(b"x")
        log.append_many([b"y"] * 3)
        for f in [log.append_async(b"z") for _ in range(20)]:
            f.result(60)
        log.read(0)
        consumer = log.consumer("billing")
        consumer.commit(2)
        wait_until(lambda: log.refresh().sequencer == a.address, 10, "a to serve the log")
        time.sleep(2.5)  # b has seen a's beats: it will stand in for it
        # the daemons: a take-over (a killed -9), a recovery, a recovery that fails
        a.kill()
        wait_until(lambda: log.refresh().sequencer == b.address, 30, "b to take the log over")
        other = Log.create(rados_cluster, ceph.pool, log_name + "-2", sequencer=b.address)
        other.append(b"x")
        c = sq.SequencerClient(b.address, cluster=rados_cluster)
        wait_until(lambda: c.next(ceph.pool, log_name + "-missing", 0, 1)[0] == sq.RECOVERY_FAILED, 30,
                   "the recovery of a missing log to fail")
        c.close()
        log.append(b"after")
        seen = scrape(port) | scrape(b.metrics_port)  # type: ignore[attr-defined]
        consumer.close()
        log.close()
        other.close()
    finally:
        server.shutdown()
        server.server_close()

    def present(sel: Selector) -> bool:
        name, labels = sel
        return any(n == name and set(labels) <= set(ls) for n, ls in seen)

    queries = dashboard_queries() + [r["expr"] for r in alert_rules()]
    missing = sorted({sel for q in queries for sel in selectors(q) if not present(sel)})
    assert missing == [], f"queried but not in a real scrape: {missing}"
    assert len({sel for q in queries for sel in selectors(q)}) >= 30


def test_promql_syntax_with_promtool(tmp_path: Path) -> None:
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not installed (Debian's prometheus package has it); set PROMTOOL to run")
    out = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # the dashboard's queries as recording rules, Grafana's variables given values
    exprs = [q for q in dashboard_queries() if not q.startswith("label_values(")]
    rules = [{"record": f"pyzlog:dashboard:{i}", "expr": q.replace("$__rate_interval", "5m").replace("$pool", ".*")
              .replace("$log", ".*")} for i, q in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
