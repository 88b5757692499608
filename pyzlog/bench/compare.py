"""`zlog bench compare`: this build of the client against another one, on the
same cluster, in one sitting.

Each case runs in a child process that imports `pyzlog` either from this
install or from `--baseline DIR` (a directory holding another build's
`pyzlog` package, e.g. `pip install --no-deps --target DIR .` of an older
commit) and uses only the public API (Log.create/open, append, append_many,
append_async, flush, read, read_async, stream, stream_batches), so any
round's build runs it. The two builds alternate, case by case and round by
round, so a change in the shared machine's speed hits both alike. Per case:
entries/s, the child's CPU per entry (all its threads, librados' included,
from getrusage) and the local OSDs' (CpuMeter), and the ratio of this build
to the baseline (median of the per-round ratios).

A shared 2-core machine moves a case's rate by 10-20% from one round to the
next, so one median says little. Each case also gets a distribution-free
interval for its median ratio (order statistics of the paired rounds: a
sign test, which assumes nothing of the noise's shape) and a verdict:
"slower" or "faster" only when the whole interval lies on one side of 1,
"no difference shown" when it straddles 1, and "too few rounds" below six
(no interval of five rounds reaches 95%).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .bench import _fmt, machine_info, write_json
from .cpu import CpuMeter

#: the child: one case, timed, printing one JSON line (public API only)
CHILD = r'''
import json, os, random, resource, sys, time
import pyzlog
conf, pool, case, name, size, duration, seqr, osds = sys.argv[1:9]
size, duration = int(size), float(duration)
osd_pids = [int(p) for p in osds.split(",") if p]
tick = os.sysconf("SC_CLK_TCK")

def osd_cpu():
    total = 0
    for pid in osd_pids:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(f[11]) + int(f[12])
    return total / tick
cluster = pyzlog.connect(conf)
data = os.urandom(size)

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def timed(run):
    run(max(0.2, duration / 10))  # warm: connections, the sequencer's recovery
    t0, c0, o0 = time.perf_counter(), cpu(), osd_cpu()
    n = run(duration)
    return n, time.perf_counter() - t0, cpu() - c0, osd_cpu() - o0

kw = {"sequencer": seqr} if seqr else {}
if case == "append_async":
    log = pyzlog.Log.create(cluster, pool, name, width=4, max_in_flight=128, **kw)
    def run(d):
        n, end = 0, time.perf_counter() + d
        while time.perf_counter() < end:
            for _ in range(1000):
                log.append_async(data)
            n += 1000
        log.flush()
        return n
elif case == "append_many":
    log = pyzlog.Log.create(cluster, pool, name, width=4, **kw)
    batch = [data] * 64
    def run(d):
        n, end = 0, time.perf_counter() + d
        while time.perf_counter() < end:
            log.append_many(batch)
            n += 64
        return n
elif case == "append":
    log = pyzlog.Log.create(cluster, pool, name, width=4, **kw)
    def run(d):
        n, end = 0, time.perf_counter() + d
        while time.perf_counter() < end:
            log.append(data)
            n += 1
        return n
else:
    log = pyzlog.Log.open(cluster, pool, name, max_in_flight=16, **kw)
    hi = log.tail()
    rnd = random.Random(1)
    if case == "stream":
        def run(d):
            n, end = 0, time.perf_counter() + d
            while time.perf_counter() < end:
                n += sum(1 for _ in log.stream(0, hi))
            return n
    elif case == "stream_batches":
        def run(d):
            n, end = 0, time.perf_counter() + d
            while time.perf_counter() < end:
                n += sum(b.num_rows for b in log.stream_batches(0, hi))
            return n
    elif case == "read":
        def run(d):
            n, end = 0, time.perf_counter() + d
            while time.perf_counter() < end:
                log.read(rnd.randrange(hi))
                n += 1
            return n
    elif case == "read_async":
        def run(d):
            n, end = 0, time.perf_counter() + d
            while time.perf_counter() < end:
                futs = [log.read_async(rnd.randrange(hi)) for _ in range(1000)]
                for f in futs:
                    f.result()
                n += 1000
            return n
    else:
        sys.exit(f"unknown case {case}")
n, elapsed, cpu_s, osd_s = timed(run)
log.close()
print(json.dumps({"entries": n, "elapsed_s": elapsed, "cpu_s": cpu_s, "osd_s": osd_s if osd_pids else None,
                  "library": pyzlog.__file__}))
'''

#: the least coverage the interval of a case's median ratio must reach
INTERVAL_LEVEL = 0.95


def median_interval(ratios: list[float], level: float = INTERVAL_LEVEL) -> tuple[float, float, float] | None:
    """The narrowest interval [r_(j), r_(n+1-j)] of the sorted ratios that
    holds their true median with probability >= `level`, whatever the
    noise's distribution (the count of rounds below the median is
    Binomial(n, 1/2)): (low, high, coverage), or None if even [min, max]
    falls short (fewer than six rounds at 95%)."""
    n = len(ratios)
    if n == 0:
        return None
    r = sorted(ratios)
    below = 0.0  # P(K < j) for K ~ Binomial(n, 1/2)
    best = None
    for j in range(1, n // 2 + 1):
        below += math.comb(n, j - 1) / 2 ** n
        coverage = 1 - 2 * below
        if coverage < level:
            break
        best = (r[j - 1], r[n - j], coverage)
    return best


def verdict(ratios: list[float], level: float = INTERVAL_LEVEL) -> str:
    """"slower" / "faster" when the interval of the median ratio lies wholly
    below / above 1, "no difference shown" when it holds 1, "too few rounds"
    when there is no such interval."""
    interval = median_interval(ratios, level)
    if interval is None:
        return "too few rounds"
    low, high, _ = interval
    if high < 1:
        return "slower"
    if low > 1:
        return "faster"
    return "no difference shown"


def judged(ratios: list[float]) -> dict[str, Any]:
    """A case's per-round ratios with their median, its interval and the verdict."""
    interval = median_interval(ratios)
    return {"ratio": statistics.median(ratios), "rounds_ratio": ratios,
            "interval": None if interval is None else list(interval[:2]),
            "interval_coverage": None if interval is None else interval[2],
            "verdict": verdict(ratios)}


def interval_text(case: dict[str, Any]) -> str:
    iv = case.get("interval")
    return "–" if iv is None else f"{iv[0]:.2f}–{iv[1]:.2f}"


CASES = ("append_async", "append_many", "append", "stream", "stream_batches", "read", "read_async")
READ_CASES = ("stream", "stream_batches", "read", "read_async")


def _run_case(side: str, baseline: str, conf: str, pool: str, case: str, name: str, size: int, duration: float,
              seqr: str, meter: CpuMeter) -> dict[str, Any]:
    """One case in a child process of `side`'s build: entries, seconds, the
    child's CPU and the local OSDs' over the timed part."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if side == "baseline":
        env["PYTHONPATH"] = baseline
    osds = ",".join(str(pid) for pid in meter.osd_pids)
    p = subprocess.run([sys.executable, "-P", "-c", CHILD, conf, pool, case, name, str(size), str(duration), seqr,
                        osds], env=env, capture_output=True, text=True, timeout=duration * 20 + 120, check=False,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"{side} {case} failed: {p.stderr.strip()[-2000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def bench_compare(conf: str, pool: str, baseline: str, *, seqr: str = "", duration: float = 5.0, rounds: int = 3,
                  size: int = 1024, entries: int = 20000, out: str = "results/bench-before-after.json",
                  cases: tuple[str, ...] = CASES, baseline_reads: str = "data") -> dict[str, Any]:
    base = Path(baseline)
    if not (base / "pyzlog" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {baseline}: no pyzlog package there (build one with "
                         "`pip install --no-deps --no-build-isolation --target DIR <checkout>`)")
    import pyzlog

    cluster = pyzlog.connect(conf)
    # each build reads a log as it writes one by default: this build in the
    # data format in runs; the baseline (`baseline_reads`) in the data format
    # with unit 1 (every build since the data format became the default reads
    # that metadata), or in the omap format (round 2's builds, which cannot
    # parse a data-format log's metadata)
    read_logs = {"current": f"compare-read-{uuid.uuid4().hex[:8]}",
                 "baseline": f"compare-read-{baseline_reads}-{uuid.uuid4().hex[:8]}"}
    shapes: dict[str, dict[str, Any]] = {"current": {"format": "data"},
                                         "baseline": {"format": "data", "unit": 1} if baseline_reads == "data"
                                         else {"format": "omap"}}
    try:
        data = os.urandom(size)
        for side in ("current", "baseline"):
            log = pyzlog.Log.create(cluster, pool, read_logs[side], width=4, **shapes[side])
            for i in range(0, entries, 1000):
                log.append_many([data] * min(1000, entries - i))
            log.close()
        machine = machine_info(cluster)
    finally:
        cluster.shutdown()
    meter = CpuMeter(conf)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"baseline": [], "current": []} for c in cases}
    for r in range(rounds):
        for case in cases:
            order = ("baseline", "current") if r % 2 == 0 else ("current", "baseline")
            for side in order:
                name = read_logs[side] if case in READ_CASES else f"compare-{case}-{side}-{uuid.uuid4().hex[:8]}"
                runs[case][side].append(_run_case(side, baseline, conf, pool, case, name, size, duration, seqr,
                                                  meter))
            b, c = runs[case]["baseline"][-1], runs[case]["current"][-1]
            print(f"round {r + 1}/{rounds} {case}: baseline {b['entries'] / b['elapsed_s']:,.0f}/s, "
                  f"current {c['entries'] / c['elapsed_s']:,.0f}/s", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "kind": "compare", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": {"duration_s": duration, "rounds": rounds, "entry_bytes": size, "read_entries": entries,
                   "pool": pool, "baseline": str(base.resolve()),
                   "read_logs": {"current": "data format",
                                 "baseline": "data format, unit 1" if baseline_reads == "data" else "omap format"}},
        "machine": machine, "cases": {},
    }
    for case in cases:
        sides = {}
        for side in ("baseline", "current"):
            rs = runs[case][side]
            rates = [x["entries"] / x["elapsed_s"] for x in rs]
            osd = [None if x["osd_s"] is None else 1e6 * x["osd_s"] / max(1, x["entries"]) for x in rs]
            osd_known = [o for o in osd if o is not None]
            sides[side] = {
                "entries_per_s": statistics.median(rates),
                "client_us_per_entry": statistics.median(1e6 * x["cpu_s"] / max(1, x["entries"]) for x in rs),
                "osd_us_per_entry": statistics.median(osd_known) if len(osd_known) == len(osd) else None,
                "rounds_entries_per_s": rates,
                "library": rs[0]["library"],
            }
        ratios = [c["entries"] / c["elapsed_s"] / (b["entries"] / b["elapsed_s"])
                  for b, c in zip(runs[case]["baseline"], runs[case]["current"])]
        result["cases"][case] = {**sides, **judged(ratios)}
    slower = [case for case, c in result["cases"].items() if c["verdict"] == "slower"]
    result["slower_cases"] = slower
    result["markdown"] = markdown_compare(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}")
    return result


def markdown_compare(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [f"This build against {p['baseline']}, {p['entry_bytes']} B entries, {p['rounds']} alternating "
             f"rounds of {p['duration_s']:g} s per case (ratio: median of the per-round ratios; interval: "
             f"where the median lies with {INTERVAL_LEVEL:.0%} confidence, from the rounds' order)", "",
             "| case | baseline entries/s | current entries/s | ratio | interval | verdict "
             "| client µs/entry before → after | OSD µs/entry before → after |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for case, c in r["cases"].items():
        b, n = c["baseline"], c["current"]
        lines.append(f"| {case} | {_fmt(b['entries_per_s'])} | {_fmt(n['entries_per_s'])} | {c['ratio']:.2f} | "
                     f"{interval_text(c)} | {c.get('verdict', '')} | "
                     f"{_fmt(b['client_us_per_entry'], '.1f')} → {_fmt(n['client_us_per_entry'], '.1f')} | "
                     f"{_fmt(b['osd_us_per_entry'], '.1f')} → {_fmt(n['osd_us_per_entry'], '.1f')} |")
    if "slower_cases" in r:
        slower = r["slower_cases"]
        lines += ["", "slower beyond the noise: " + (", ".join(slower) if slower else "no case")]
    return "\n".join(lines)
