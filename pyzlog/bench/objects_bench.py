"""`zlog bench objects`: the replicated-object layer (pyzlog.objects) against
the raw log it is built on, in one run on one cluster.

Write cases (each timed for a slice of `duration` in every round; the
rounds alternate the cases, so a change in the shared machine's speed hits
both sides of a ratio alike; each figure is the median of the rounds):

- raw `append_async` of entries as large as a map put's stored entry, with
  `depth` in flight, against `map.put_async` with `depth` in flight (the
  put's Future settles only once the put is applied here);
- raw `append`, one at a time, against `map.put` one at a time, and against
  transactions one at a time (each reads two keys and writes two: one commit
  record, decided by replay).

Replay cases (whole passes over a prepared log of `entries` map puts spread
over ten maps, checkpointed half way):

- a new runtime starting from the checkpoint and playing the rest, against
  `stream_batches()` reading the same positions (the raw read floor);
- a full replay of all ten maps from position 0;
- a replay of one map of the ten by its stream (Runtime(streams=True): the
  sequencer's backpointers, followed through the entries), and the same
  replay reading the whole log and skipping nine tenths;
- the raw floor of that stream replay: opening the log, one STREAM_HISTORY
  request and one read_positions of the map's positions, with nothing
  checked or applied and no runtime (what any replay of it must do at the
  least: a full replay that is not 5x this cannot be beaten 5x), when the
  sequencer's history lists the whole stream (up to 8,192 positions).

A replay pass takes tens of milliseconds, so each round runs every replay
case `replay_passes` times (alternately) and a case's rate is the median of
all its passes.

The replay log is written with streams on, and so are the put cases marked
"streams" (each put's position comes with its stream's backpointers, which
the entry carries).

CPU per entry comes from /proc (bench/cpu.py): this process, the local OSDs
and the sequencer the bench started. Targets (issue 25): a put costs at most
1.3x an append; replay from a checkpoint runs at least 0.5x stream_batches;
a stream-only replay of one object of ten is at least 5x faster than a full
replay.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import ZlogError
from ..objects import RadosCheckpoints, Runtime
from ..objects import codec as ocodec
from ..objects import entry as oentry
from ..objects.objects import MAP_PUT, _OP
from .bench import (Run, _Bench, _case_runner, _future_done, _progress, machine_info, run_async, run_sync,
                    summarize_runs, write_json)
from .cpu import CpuMeter

PUT_TARGET = 1.3
REPLAY_TARGET = 0.5
STREAM_TARGET = 5.0
OBJECTS = 10
KEYS = 1000


@dataclass
class _Case:
    key: str
    label: str
    per: str  # what one counted unit is: entry, put, transaction
    run: Callable[[float, Any], Run]


def _median(vals: list[float | None]) -> float | None:
    vals2 = [v for v in vals if v is not None]
    return statistics.median(vals2) if vals2 and len(vals2) == len(vals) else None


def _cpu_median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: (_median([r.get(k) for r in rounds]) if k != "local_osds" else rounds[0][k]) for k in rounds[0]}


class _NoFloor(Exception):
    """The sequencer's history does not list the whole stream (a log of
    more than MAX_STREAM_HISTORY entries a map): its floor is not one read."""


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def bench_objects(env: Any, *, duration: float = 12.0, rounds: int = 3, size: int = 100, depth: int = 128,
                  entries: int = 40000, width: int = 4, replay_passes: int = 5,
                  out: str = "results/bench-objects.json") -> dict[str, Any]:
    if entries < 2 * OBJECTS:
        raise ZlogError(f"--entries must be at least {2 * OBJECTS}")
    value = os.urandom(size)
    b = _Bench(env)
    runtimes: list[Runtime] = []
    try:
        seqr_pid = b.seqr_proc.proc.pid if b.seqr_proc is not None and b.seqr_proc.proc else None
        meter = CpuMeter(b.conf, {"seqr": [seqr_pid]} if seqr_pid else None)
        # the raw entries are as large as a put's stored entry: header, op, key and value
        put_entry = len(oentry.header(oentry.CMD, 1, 1, 1, 1) + _OP[MAP_PUT] + ocodec.dumps("k999")
                        + ocodec.dumps(value))
        raw = os.urandom(put_entry)
        raw_log = b.open(b.new_log(width), max_in_flight=depth)
        b.warm_up(raw_log)
        put_log = b.open(b.new_log(width), max_in_flight=depth)
        b.warm_up(put_log)
        rt = Runtime(put_log)
        runtimes.append(rt)
        m, acct = rt.map("m"), rt.map("acct")
        rt.start()
        for k in range(KEYS):  # warm: the keys exist, the player and senders run
            m.put_async(f"k{k}", value)
        acct.put("a", 10**9)
        acct.put("b", 0)
        rt.sync()
        stream_log = b.open(b.new_log(width), max_in_flight=depth)
        b.warm_up(stream_log)
        rts = Runtime(stream_log, streams=True)
        runtimes.append(rts)
        ms = rts.map("m")
        for k in range(KEYS):
            ms.put_async(f"k{k}", value)
        rts.sync()

        def put_async_streams(i: int, done: Any) -> None:
            _future_done(ms.put_async(f"k{i % KEYS}", value), done)

        def put_async(i: int, done: Any) -> None:
            _future_done(m.put_async(f"k{i % KEYS}", value), done)

        def append_async(i: int, done: Any) -> None:
            _future_done(raw_log.append_async(raw), done)

        def txn(i: int) -> None:
            with rt.transaction(sync=False) as tx:
                x = acct["a"]
                acct["a"] = x - 1
                acct["b"] = acct["b"] + 1
            if not tx.committed:
                raise ZlogError("a transaction with no rival aborted")

        write_cases = [
            _Case("append_async", f"raw append_async, depth {depth}", "entry",
                  lambda d, t: run_async(append_async, depth, d, t)),
            _Case("map_put_async", f"map put_async, depth {depth}", "put",
                  lambda d, t: run_async(put_async, depth, d, t)),
            _Case("map_put_async_streams", f"map put_async with streams, depth {depth}", "put",
                  lambda d, t: run_async(put_async_streams, depth, d, t)),
            _Case("append", "raw append, one at a time", "entry",
                  lambda d, t: run_sync(lambda i: raw_log.append(raw), d, t)),
            _Case("map_put", "map put, one at a time", "put",
                  lambda d, t: run_sync(lambda i: m.put(f"k{i % KEYS}", value), d, t)),
            _Case("map_put_streams", "map put with streams, one at a time", "put",
                  lambda d, t: run_sync(lambda i: ms.put(f"k{i % KEYS}", value), d, t)),
            _Case("txn", "transaction (2 reads, 2 writes), one at a time", "transaction",
                  lambda d, t: run_sync(txn, d, t)),
        ]
        replay_name = b.new_log(width)
        with _progress() as progress:
            mid, tail, ckpt = _prepare_replay(b, replay_name, value, entries, progress)
            runs: dict[str, list[Run]] = {c.key: [] for c in write_cases}
            cpu: dict[str, list[dict[str, Any]]] = {c.key: [] for c in write_cases}
            replay: dict[str, list[dict[str, Any]]] = {}
            slice_s = duration / rounds
            new = _case_runner(progress, slice_s)
            for r in range(rounds):
                for c in write_cases:
                    tick = new(f"{c.label} ({r + 1}/{rounds})")
                    started = meter.start()
                    run = c.run(slice_s, tick)
                    meter.stop(f"{c.key}#{r}", started)
                    runs[c.key].append(run)
                    cpu[c.key].append(meter.figures(f"{c.key}#{r}", run[0]))
                    progress.update(tick.task, info=f"{run[0] / max(run[1], 1e-9):>10,.0f} /s")
                for p in range(replay_passes):  # passes of tens of ms each: the median of many
                    for key, one in _replay_cases(b, replay_name, mid, tail, meter, r * replay_passes + p).items():
                        replay.setdefault(key, []).append(one)
                for key in replay:
                    task = progress.add_task(f"{key} ({r + 1}/{rounds})", total=1, completed=1,
                                             info=f"{replay[key][-1]['entries_per_s']:>10,.0f} entries/s")
                    progress.update(task)
        cases: dict[str, Any] = {}
        for c in write_cases:
            cases[c.key] = summarize_runs(c.key, "objects" if c.per != "entry" else "zlog", depth, runs[c.key],
                                          put_entry, label=c.label, counted=c.per)
            cases[c.key]["rate_per_s"] = statistics.median(n / e for n, e, _ in runs[c.key])
            cases[c.key]["cpu"] = _cpu_median(cpu[c.key])
        for key, rs in replay.items():
            cases[key] = {"name": key, "label": rs[0]["label"], "entries": rs[0]["entries"],
                          "rate_per_s": statistics.median(x["entries_per_s"] for x in rs),
                          "passes_per_s": [x["entries_per_s"] for x in rs],
                          "seconds": statistics.median(x["seconds"] for x in rs),
                          "cpu": _cpu_median([x["cpu"] for x in rs]),
                          **{k: v for k, v in rs[-1].items() if k not in ("entries_per_s", "seconds", "cpu", "label",
                                                                          "entries")}}

        def cost_ratio(a: str, b_: str) -> dict[str, float | None]:
            """How much more one `a` costs than one `b_`: by rate, and by client CPU."""
            ca, cb = cases[a], cases[b_]
            return {"time": _ratio(cb["rate_per_s"], ca["rate_per_s"]),
                    "client_cpu": _ratio(ca["cpu"]["client_us_per_entry"], cb["cpu"]["client_us_per_entry"])}

        floor_s = cases["replay_one_of_ten_floor"]["seconds"] if "replay_one_of_ten_floor" in cases else None
        ratios = {
            "put_async_vs_append_async": cost_ratio("map_put_async", "append_async"),
            "put_vs_append": cost_ratio("map_put", "append"),
            "put_async_streams_vs_append_async": cost_ratio("map_put_async_streams", "append_async"),
            "put_streams_vs_append": cost_ratio("map_put_streams", "append"),
            "txn_vs_append": cost_ratio("txn", "append"),
            "replay_from_checkpoint_vs_stream_batches": _ratio(cases["replay_from_checkpoint"]["rate_per_s"],
                                                               cases["stream_batches"]["rate_per_s"]),
            "one_object_replay_speedup_vs_full": _ratio(cases["full_replay_ten"]["seconds"],
                                                        cases["replay_one_of_ten"]["seconds"]),
            "one_object_whole_log_replay_speedup_vs_full": _ratio(cases["full_replay_ten"]["seconds"],
                                                                  cases["replay_one_of_ten_scan"]["seconds"]),
            # the most any stream replay of the map could reach here, and how far above its floor it is
            "one_object_floor_speedup_vs_full": _ratio(cases["full_replay_ten"]["seconds"], floor_s),
            "one_object_replay_vs_floor": _ratio(cases["replay_one_of_ten"]["seconds"], floor_s),
        }
        load = os.getloadavg()
        result: dict[str, Any] = {
            "kind": "objects",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"duration_s": duration, "rounds": rounds, "replay_passes": replay_passes, "value_bytes": size,
                       "put_entry_bytes": put_entry,
                       "depth": depth, "entries": entries, "width": width, "objects": OBJECTS, "keys": KEYS,
                       "pool": b.pool},
            "machine": {**machine_info(b.cluster), "loadavg_after": [round(x, 2) for x in load]},
            "sequencer": {"address": b.seqr, "started_by_bench": b.seqr_proc is not None, "pid": seqr_pid},
            "replay_log": {"name": replay_name, "checkpoint_position": mid, "tail": tail, "checkpoint": ckpt},
            "cases": cases,
            "ratios": ratios,
            "targets": {"put_vs_append_max": PUT_TARGET, "replay_vs_stream_batches_min": REPLAY_TARGET,
                        "stream_only_speedup_min": STREAM_TARGET},
            "rates": "rate_per_s: the median of the rounds' rates",
        }
        result["markdown"] = markdown_objects(result)
        write_json(out, result)
        print(result["markdown"])
        print(f"\nresults: {out}")
        return result
    finally:
        for x in runtimes:
            x.close()
        b.close()


def _prepare_replay(b: _Bench, name: str, value: bytes, entries: int, progress: Any) -> tuple[int, int, Any]:
    """`entries` puts spread over OBJECTS maps, a checkpoint half way; returns
    (checkpoint position, tail, checkpoint info)."""
    lg = b.open(name)
    rt = Runtime(lg, checkpoints=RadosCheckpoints.for_log(lg), streams=True)
    maps = [rt.map(f"map-{i}") for i in range(OBJECTS)]
    rt.start()
    task = progress.add_task(f"replay log: {entries} puts", total=entries, info="")
    info = None
    try:
        pending = []
        for i in range(entries):
            pending.append(maps[i % OBJECTS].put_async(f"k{i % KEYS}", value))
            if i % 4096 == 4095 or i == entries // 2:
                for f in pending:  # every put is in the log (not only queued) before going on
                    f.result(600)
                pending.clear()
                rt.sync()
                progress.update(task, completed=i + 1)
            if i == entries // 2:
                info = rt.checkpoint()
        for f in pending:
            f.result(600)
        rt.sync()
        progress.update(task, completed=entries)
        assert info is not None
        return info.position, rt.applied, {"id": info.id, "bytes": info.size, "complete": info.complete}
    finally:
        rt.close()


def _replay_cases(b: _Bench, name: str, mid: int, tail: int, meter: CpuMeter, r: int) -> dict[str, dict[str, Any]]:
    """One pass of each replay case."""
    out: dict[str, dict[str, Any]] = {}

    def timed(key: str, label: str, count: int, fn: Callable[[], dict[str, Any]]) -> None:
        started = meter.start()
        t0 = time.perf_counter()
        extra = fn()
        secs = time.perf_counter() - t0
        meter.stop(f"{key}#{r}", started)
        out[key] = {"label": label, "entries": count, "seconds": secs, "entries_per_s": count / secs,
                    "cpu": meter.figures(f"{key}#{r}", count), **extra}

    def from_checkpoint() -> dict[str, Any]:
        lg = b.open(name)
        rt = Runtime(lg, checkpoints=RadosCheckpoints.for_log(lg))
        for i in range(OBJECTS):
            rt.map(f"map-{i}")
        t0 = time.perf_counter()
        rt.start()
        loaded = time.perf_counter() - t0
        rt.wait_applied(tail, 600)
        st = rt.stats
        rt.close()
        if st.reloads != 1:
            raise ZlogError("the replay did not start from the checkpoint")
        return {"checkpoint_load_s": loaded, "read": st.read}

    def scan() -> dict[str, Any]:
        lg = b.open(name)
        n = 0
        for batch in lg.stream_batches(mid, tail):
            n += batch.num_rows
        return {"rows": n}

    def floor() -> dict[str, Any]:
        lg = b.open(name)
        answer = lg.stream_tail([oentry.stream_id("map-0")], history=tail)
        listed = sorted(answer[2][0][2]) if answer is not None else []
        if len(listed) < out["replay_one_of_ten"]["positions_read"]:  # (the stream replay, just before)
            raise _NoFloor  # a stream longer than the sequencer's history of it: no one request lists it
        return {"positions_read": len(lg.read_positions(listed))}

    def replay(hosted: list[int], streams: bool = False) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            lg = b.open(name)
            rt = Runtime(lg, streams=streams)
            for i in hosted:
                rt.map(f"map-{i}")
            rt.wait_applied(tail, 600)
            st, ws = rt.stats, rt.walk_stats
            rt.close()
            out = {"read": st.read, "applied": st.applied}
            if streams:
                if ws.scans:
                    raise ZlogError(f"the stream replay scanned {ws.ranges}: backpointers did not cover the log")
                out.update(rounds=ws.rounds, positions_read=ws.read)
            return out
        return go

    timed("replay_from_checkpoint", "replay: checkpoint load + the rest, ten maps", tail - mid, from_checkpoint)
    timed("stream_batches", "stream_batches() over the same positions", tail - mid, scan)
    timed("full_replay_ten", "full replay from 0, ten maps", tail, replay(list(range(OBJECTS))))
    timed("replay_one_of_ten", "replay of one map of ten, by its stream", tail, replay([0], streams=True))
    timed("replay_one_of_ten_scan", "replay of one map of ten, whole log read", tail, replay([0]))
    try:
        timed("replay_one_of_ten_floor", "floor of that: open, stream history, read_positions", tail, floor)
    except _NoFloor:
        pass  # left out (its ratios None): the replay follows backpointers past the history
    return out


def markdown_objects(r: dict[str, Any]) -> str:
    c, x, p, m = r["cases"], r["ratios"], r["params"], r["machine"]

    def f(v: float | None, spec: str = ",.0f") -> str:
        return "-" if v is None else format(v, spec)

    lines = [f"# bench objects ({m.get('cluster_osds', '?')} OSD(s) {', '.join(m.get('objectstore', ['?']))}, "
             f"{m['nproc']} CPUs, load average after {m['loadavg_after']})", "",
             f"Values of {p['value_bytes']} B (a put's entry is {p['put_entry_bytes']} B; raw appends are that "
             f"size), depth {p['depth']}, {p['rounds']} alternating rounds "
             f"({p.get('replay_passes', 1)} passes of each replay case in each), medians.", "",
             "| case | per second | client µs each | OSD µs each | sequencer µs each |", "|---|---|---|---|---|"]
    for key, v in c.items():
        cpu = v["cpu"]
        lines.append(f"| {v.get('label', key)} | {f(v['rate_per_s'])} | {f(cpu.get('client_us_per_entry'), '.1f')} | "
                     f"{f(cpu.get('osd_us_per_entry'), '.1f')} | {f(cpu.get('seqr_us_per_entry'), '.1f')} |")
    pa = x["put_async_vs_append_async"]
    ps = x.get("put_async_streams_vs_append_async") or {}
    lines += ["", f"- a put_async costs {f(pa['time'], '.2f')}x an append_async in time, "
                  f"{f(pa['client_cpu'], '.2f')}x in client CPU (target <= {PUT_TARGET}); with streams "
                  f"{f(ps.get('time'), '.2f')}x, {f(ps.get('client_cpu'), '.2f')}x",
              f"- a put costs {f(x['put_vs_append']['time'], '.2f')}x an append one at a time (with streams "
              f"{f((x.get('put_streams_vs_append') or {}).get('time'), '.2f')}x); a transaction "
              f"{f(x['txn_vs_append']['time'], '.2f')}x",
              f"- replay from a checkpoint runs at {f(x['replay_from_checkpoint_vs_stream_batches'], '.2f')}x "
              f"stream_batches (target >= {REPLAY_TARGET})",
              f"- replaying one map of ten by its stream is {f(x['one_object_replay_speedup_vs_full'], '.2f')}x "
              f"faster than all ten (target >= {STREAM_TARGET}); reading the whole log for it, "
              f"{f(x.get('one_object_whole_log_replay_speedup_vs_full'), '.2f')}x; its raw floor (open, "
              f"stream history, read_positions, nothing applied) is "
              f"{f(x.get('one_object_floor_speedup_vs_full'), '.2f')}x faster than all ten, and the replay "
              f"takes {f(x.get('one_object_replay_vs_floor'), '.2f')}x its floor"]
    return "\n".join(lines)


__all__ = ["bench_objects", "markdown_objects"]
