"""Sequencer micro-benchmark (no Ceph needed).

``run_seqr_bench()`` starts a ``pyzlog._seqr.Server`` in this process, installs
one log directly (as the recovery daemon would) and measures, against it:

* ``depth1``       one NEXT at a time on one connection (round-trip latency bound)
* ``pipelined``    NEXT count=1, ``depth`` requests in flight on one connection
* ``batched_16``   NEXT count=16, pipelined
* ``batched_64``   NEXT count=64, pipelined
* ``processes``    ``processes`` client processes, one connection each, pipelined
* ``echo_depth1`` / ``echo_pipelined`` / ``echo_processes``: the same load
  against ``EchoServer`` with the same request frame size, i.e. the network /
  syscall floor; ``vs_echo`` is the sequencer's request rate divided by it.
* ``pipelined_auth`` / ``processes_auth``: ``pipelined`` / ``processes``
  against a server that requires the handshake's proof and enforces a
  position budget per connection (set high enough never to refuse), measured
  in alternating rounds with the unauthenticated ones (a machine whose speed
  drifts moves both alike); ``auth_vs_noauth`` is the ratio. The plain cases
  run against a server started --insecure (the handshake without a proof).
* ``pipelined_tls``: ``pipelined_auth`` over TLS.
* ``handshake``: connections a second, each authenticated (and over TLS).

Only the standard library, ``openssl`` (for a throwaway TLS certificate) and
``pyzlog._seqr`` are used.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

from pyzlog import _seqr  # type: ignore[attr-defined]  # the C++ extension

HOST = "127.0.0.1"
POOL = "bench"
LOG = "seqr-bench"
EPOCH = 1
# u8 op + u64 id + u64 epoch + u32 count + u16 + pool + u16 + log
FRAME_SIZE = 25 + len(POOL) + len(LOG)
TARGET_PIPELINED_RPS = 250_000
TARGET_BATCHED_PPS = 2_000_000
#: issue 27: pipelined requests/s with authentication >= this share of without
TARGET_AUTH_RATIO = 0.9
#: the key the authenticated server serves POOL with
KEY = os.urandom(32)
AUTH = {"pool": POOL, "keys": [(1, KEY)]}
NOAUTH = {"pool": POOL, "insecure": True}
#: a budget per connection the benchmark never reaches, so the check runs but never refuses
BUDGET = 2**32 - 1
ROUNDS = 6


def _drive(client: Any, kind: str, count: int, depth: int, duration_s: float) -> dict[str, float]:
    """Runs pipeline_next / pipeline_echo in chunks for about duration_s."""
    requests = positions = 0
    elapsed = 0.0
    chunk = 2000 if depth > 1 else 200
    deadline = time.perf_counter() + duration_s
    while True:
        if kind == "echo":
            r = client.pipeline_echo(FRAME_SIZE, chunk, depth)
            pos = 0
        else:
            r = client.pipeline_next(POOL, LOG, EPOCH, count, chunk, depth)
            if r["ok"] != chunk:
                raise RuntimeError(f"sequencer answered non-OK during the benchmark: {r}")
            pos = r["positions"]
        requests += r["requests"]
        positions += pos
        elapsed += r["elapsed_s"]
        now = time.perf_counter()
        if now >= deadline:
            break
        # aim for ~0.1 s per chunk
        rate = r["requests"] / max(r["elapsed_s"], 1e-6)
        chunk = max(100, min(int(rate * 0.1), 5_000_000))
    return {"requests": requests, "positions": positions, "elapsed_s": elapsed}


def _proc_main(port: int, kind: str, count: int, depth: int, duration_s: float,
               barrier: Any, out: Any, auth: dict[str, Any] | None) -> None:
    try:
        c = _seqr.Client(HOST, port, 10.0, auth)
        # warm up the connection before the synchronised start
        if kind == "echo":
            c.pipeline_echo(FRAME_SIZE, 100, depth)
        else:
            c.pipeline_next(POOL, LOG, EPOCH, count, 100, depth)
        barrier.wait(30)
        t0 = time.perf_counter()
        r = _drive(c, kind, count, depth, duration_s)
        r["wall_s"] = time.perf_counter() - t0
        c.close()
        out.put(("ok", r))
    except BaseException as e:  # report instead of hanging the parent
        out.put(("error", repr(e)))


def _multi(port: int, kind: str, count: int, depth: int, duration_s: float,
           processes: int, auth: dict[str, Any] | None = None) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = [ctx.Process(target=_proc_main,
                         args=(port, kind, count, depth, duration_s, barrier, out, auth),
                         daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            status, r = out.get(timeout=duration_s + 60)
            if status != "ok":
                raise RuntimeError(f"benchmark client process failed: {r}")
            results.append(r)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
    wall = max(r["wall_s"] for r in results)
    return {
        "requests": sum(r["requests"] for r in results),
        "positions": sum(r["positions"] for r in results),
        "elapsed_s": wall,
    }


def _case(name: str, r: dict[str, float], count: int, depth: int, connections: int) -> dict[str, Any]:
    el = max(r["elapsed_s"], 1e-9)
    rps = r["requests"] / el
    return {
        "name": name,
        "count": count,
        "depth": depth,
        "connections": connections,
        "requests": int(r["requests"]),
        "positions": int(r["positions"]),
        "elapsed_s": r["elapsed_s"],
        "requests_per_s": rps,
        "positions_per_s": r["positions"] / el,
        "latency_us": (1e6 * depth / rps) if rps else None,
    }


def _add(a: dict[str, float] | None, b: dict[str, float]) -> dict[str, float]:
    return dict(b) if a is None else {k: a[k] + b[k] for k in ("requests", "positions", "elapsed_s")}


def _alternate(runs: dict[str, Any], duration_s: float) -> dict[str, dict[str, float]]:
    """Each of `runs` (name -> fn(seconds)) for duration_s in all, in ROUNDS
    interleaved rounds: a drift of the machine's speed touches them alike."""
    total: dict[str, Any] = dict.fromkeys(runs)
    order = list(runs.items())
    for i in range(ROUNDS):
        for name, fn in order if i % 2 == 0 else order[::-1]:  # ABBA: a steady drift cancels out
            total[name] = _add(total[name], fn(duration_s / ROUNDS))
    return total


def _tls_files(directory: str) -> tuple[str, str] | None:
    """A throwaway self-signed certificate, or None without the openssl command."""
    exe = shutil.which("openssl")
    if exe is None:
        return None
    cert, key = os.path.join(directory, "seqr.crt"), os.path.join(directory, "seqr.key")
    subprocess.run([exe, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=bench", "-addext", f"subjectAltName=IP:{HOST}",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    return cert, key


def _handshakes(port: int, auth: dict[str, Any], seconds: float) -> dict[str, float]:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _seqr.Client(HOST, port, 10.0, auth).close()
        n += 1
    el = time.perf_counter() - t0
    return {"connections": n, "elapsed_s": el, "per_s": n / el, "ms": 1e3 * el / n}


def run_seqr_bench(duration_s: float = 3.0, processes: int = 2, depth: int = 128) -> dict[str, Any]:
    """Benchmarks the sequencer against the echo floor, and with
    authentication (and TLS) against without.

    ``duration_s`` is the measuring time of *each* case (there are 11 cases,
    so the whole run takes about 11 x duration_s plus process start-up).
    Returns a dict: ``cases`` (name -> figures: requests_per_s, positions_per_s,
    latency_us, ...), ``ratios`` (sequencer rate / echo rate for the same load;
    authenticated / not), ``handshake``, ``targets`` and the parameters used.
    """
    if duration_s <= 0:
        raise ValueError("duration_s must be > 0")
    if processes < 1:
        raise ValueError("processes must be >= 1")
    tmp = tempfile.mkdtemp(prefix="seqr-bench-")
    tls = _tls_files(tmp)
    srv = _seqr.Server(HOST, 0, require_auth=False)  # "without": no proof asked
    sec = _seqr.Server(HOST, 0, max_rate=BUDGET, max_outstanding=BUDGET)
    sec_tls = _seqr.Server(HOST, 0, tls_cert=tls[0], tls_key=tls[1]) if tls else None
    echo = _seqr.EchoServer(HOST, 0)
    cases: dict[str, dict[str, Any]] = {}
    handshake: dict[str, Any] = {}
    try:
        for s in (srv, sec, sec_tls):
            if s is None:
                continue
            if s is not srv:
                s.set_pool(POOL, [(1, KEY)])
            s.start()
            s.install(POOL, LOG, EPOCH, 0)
        echo.start()
        c = _seqr.Client(HOST, srv.port, 10.0, NOAUTH)
        a = _seqr.Client(HOST, sec.port, 10.0, AUTH)
        e = _seqr.Client(HOST, echo.port, timeout_s=10.0)
        t = _seqr.Client(HOST, sec_tls.port, 10.0, {**AUTH, "tls": True}) if sec_tls else None
        # warm-up
        for client in (c, a, t):
            if client is not None:
                client.pipeline_next(POOL, LOG, EPOCH, 1, 20_000, depth)
        e.pipeline_echo(FRAME_SIZE, 20_000, depth)

        cases["depth1"] = _case("depth1", _drive(c, "next", 1, 1, duration_s), 1, 1, 1)
        cases["echo_depth1"] = _case("echo_depth1", _drive(e, "echo", 0, 1, duration_s), 0, 1, 1)
        paired = _alternate({"pipelined": lambda d: _drive(c, "next", 1, depth, d),
                             "pipelined_auth": lambda d: _drive(a, "next", 1, depth, d)}, 2 * duration_s)
        for name, r in paired.items():
            cases[name] = _case(name, {k: v / 2 for k, v in r.items()}, 1, depth, 1)
        cases["echo_pipelined"] = _case("echo_pipelined", _drive(e, "echo", 0, depth, duration_s),
                                        0, depth, 1)
        cases["batched_16"] = _case("batched_16", _drive(c, "next", 16, depth, duration_s),
                                    16, depth, 1)
        cases["batched_64"] = _case("batched_64", _drive(c, "next", 64, depth, duration_s),
                                    64, depth, 1)
        if t is not None:
            cases["pipelined_tls"] = _case("pipelined_tls", _drive(t, "next", 1, depth, duration_s), 1, depth, 1)
            t.close()
        c.close()
        a.close()
        e.close()
        paired = _alternate({"processes": lambda d: _multi(srv.port, "next", 1, depth, d, processes, NOAUTH),
                             "processes_auth": lambda d: _multi(sec.port, "next", 1, depth, d, processes, AUTH)},
                            2 * duration_s)
        for name, r in paired.items():
            cases[name] = _case(name, {k: v / 2 for k, v in r.items()}, 1, depth, processes)
        cases["echo_processes"] = _case("echo_processes",
                                        _multi(echo.port, "echo", 0, depth, duration_s, processes),
                                        0, depth, processes)
        handshake["auth"] = _handshakes(sec.port, AUTH, min(duration_s, 1.0))
        if sec_tls is not None:
            handshake["auth_tls"] = _handshakes(sec_tls.port, {**AUTH, "tls": True}, min(duration_s, 1.0))
        stats = {"noauth": srv.stats(), "auth": sec.stats()}
        if sec_tls is not None:
            stats["auth_tls"] = sec_tls.stats()
        logs = {"noauth": srv.logs(), "auth": sec.logs(), "auth_tls": sec_tls.logs() if sec_tls else []}
    finally:
        for s in (srv, sec, sec_tls, echo):
            if s is not None:
                s.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    # every position handed out exactly once: the counters equal the totals
    def handed(names: tuple[str, ...]) -> int:
        return sum(int(cases[n]["positions"]) for n in names if n in cases)

    def next_of(key: str) -> int:
        return int(logs[key][0]["next"]) if logs[key] else 0

    consistent = (next_of("noauth") >= handed(("depth1", "pipelined", "batched_16", "batched_64", "processes"))
                  and next_of("auth") >= handed(("pipelined_auth", "processes_auth"))
                  and next_of("auth_tls") >= handed(("pipelined_tls",)))

    def ratio(a: str, b: str) -> float:
        return float(cases[a]["requests_per_s"] / max(cases[b]["requests_per_s"], 1e-9))

    ratios = {
        "depth1_vs_echo": ratio("depth1", "echo_depth1"),
        "pipelined_vs_echo": ratio("pipelined", "echo_pipelined"),
        "batched_16_vs_echo": ratio("batched_16", "echo_pipelined"),
        "batched_64_vs_echo": ratio("batched_64", "echo_pipelined"),
        "processes_vs_echo": ratio("processes", "echo_processes"),
        "pipelined_auth_vs_noauth": ratio("pipelined_auth", "pipelined"),
        "processes_auth_vs_noauth": ratio("processes_auth", "processes"),
    }
    if "pipelined_tls" in cases:
        ratios["pipelined_tls_vs_noauth"] = ratio("pipelined_tls", "pipelined")
    for name, base in [("depth1", "echo_depth1"), ("pipelined", "echo_pipelined"),
                       ("batched_16", "echo_pipelined"), ("batched_64", "echo_pipelined"),
                       ("processes", "echo_processes"), ("pipelined_auth", "echo_pipelined"),
                       ("processes_auth", "echo_processes"), ("pipelined_tls", "echo_pipelined")]:
        if name in cases:
            cases[name]["vs_echo"] = ratio(name, base)
    for name, base in [("pipelined_auth", "pipelined"), ("processes_auth", "processes"),
                       ("pipelined_tls", "pipelined")]:
        if name in cases:
            cases[name]["vs_noauth"] = ratio(name, base)
    best_pipelined = max(cases["pipelined"]["requests_per_s"], cases["processes"]["requests_per_s"])
    return {
        "duration_s": duration_s,
        "processes": processes,
        "depth": depth,
        "frame_size": FRAME_SIZE,
        "cases": cases,
        "ratios": ratios,
        "handshake": handshake,
        "server_stats": stats,
        # the benchmark's own consistency check (positions from warm-up included)
        "positions_consistent": consistent,
        "targets": {
            "pipelined_requests_per_s": TARGET_PIPELINED_RPS,
            "batched_positions_per_s": TARGET_BATCHED_PPS,
            "auth_vs_noauth": TARGET_AUTH_RATIO,
            "pipelined_met": cases["pipelined"]["requests_per_s"] >= TARGET_PIPELINED_RPS,
            "batched_met": cases["batched_64"]["positions_per_s"] >= TARGET_BATCHED_PPS,
            "auth_met": ratios["pipelined_auth_vs_noauth"] >= TARGET_AUTH_RATIO,
            "best_pipelined_requests_per_s": best_pipelined,
        },
    }


def format_seqr_bench(result: dict[str, Any]) -> str:
    """Plain-text table of a run_seqr_bench() result."""
    lines = [f"{'case':<16}{'conns':>6}{'depth':>7}{'count':>7}{'req/s':>14}{'pos/s':>16}"
             f"{'lat us':>9}{'vs echo':>9}"]
    for cs in result["cases"].values():
        vs = cs.get("vs_echo")
        lat = cs.get("latency_us")
        lines.append(
            f"{cs['name']:<16}{cs['connections']:>6}{cs['depth']:>7}{cs['count']:>7}"
            f"{cs['requests_per_s']:>14,.0f}{cs['positions_per_s']:>16,.0f}"
            f"{(f'{lat:.1f}' if lat else '-'):>9}{(f'{vs:.2f}' if vs else '-'):>9}")
    t = result["targets"]
    lines.append(f"targets: pipelined >= {t['pipelined_requests_per_s']:,} req/s: "
                 f"{'met' if t['pipelined_met'] else 'NOT met'}; batched >= "
                 f"{t['batched_positions_per_s']:,} pos/s: {'met' if t['batched_met'] else 'NOT met'}; "
                 f"authenticated >= {t['auth_vs_noauth']:g} x not: "
                 f"{result['ratios']['pipelined_auth_vs_noauth']:.2f} ({'met' if t['auth_met'] else 'NOT met'})")
    for kind, h in result.get("handshake", {}).items():
        lines.append(f"handshake ({kind}): {h['per_s']:,.0f} connections/s, {h['ms']:.2f} ms each")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    res = run_seqr_bench(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
    print(format_seqr_bench(res))
    print(json.dumps(res["ratios"], indent=2))
