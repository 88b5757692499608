"""zlog bench batching: append_async under AppendBatching settings against
the defaults, each on a connection of its own, in alternating rounds."""
from __future__ import annotations

import os
import time
from typing import Any

from ..core.batching import AppendBatching
from ..core.cluster import connect
from ..core.errors import InvalidRequest
from .bench import (Run, _Bench, _case_runner, _fmt, _progress, machine_info, round_ratios, run_append_async,
                    summarize_runs, write_json)
from .compare import interval_text, judged
from .cpu import CpuMeter

#: what the command compares with the defaults unless told otherwise
DEFAULT_SETTINGS = ("linger_us=200", "max_batches_in_flight=1", "max_batches_in_flight=4", "max_batch=64")


def parse_setting(text: str) -> AppendBatching:
    """"name=value,name=value" -> AppendBatching (InvalidRequest if bad)."""
    kw: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise InvalidRequest(f"batching setting {part!r}: expected name=value")
        try:
            kw[name.strip()] = int(value)
        except ValueError:
            raise InvalidRequest(f"batching setting {part!r}: {value!r} is not an integer") from None
    try:
        return AppendBatching(**kw)
    except TypeError:
        known = ", ".join(AppendBatching().pipeline_options())
        raise InvalidRequest(f"batching setting {text!r}: the settings are {known}") from None


def label(b: AppendBatching) -> str:
    """The settings that differ from the defaults."""
    base = AppendBatching().pipeline_options()
    diff = [f"{k}={v}" for k, v in b.pipeline_options().items() if base[k] != v]
    return ",".join(diff) or "defaults"


def bench_batching(env: Any, *, settings: list[AppendBatching], duration: float = 4.0, rounds: int = 6, size: int = 1024,
                   depth: int = 128, width: int = 4, out: str = "results/bench-batching.json") -> dict[str, Any]:
    """Each setting's append_async rate (bare loop, the log's window of
    `depth`), OSD and client CPU per entry, against the defaults' in the
    same round; the ratio is the median of the per-round ratios."""
    from ..client.log import Log  # python-rados: only once the bench runs

    candidates = [AppendBatching(), *settings]
    data = os.urandom(size)
    b = _Bench(env)
    meter = CpuMeter(b.conf)
    kw: dict[str, Any] = {"keyring": env.keyring, "client": env.client}
    runs: dict[str, list[Run]] = {label(c): [] for c in candidates}
    clusters: list[Any] = []
    try:
        name = b.new_log(width)
        b.warm_up(b.open(name))
        logs = []
        for c in candidates:  # one connection per setting: a connection's pipeline is made once
            cluster = connect(b.conf, append_batching=c, **kw)
            clusters.append(cluster)
            lg = Log.open(cluster, b.pool, name, sequencer=b.seqr, max_in_flight=depth)
            b.logs.append(lg)
            lg.append(b"warm-up")
            logs.append((label(c), lg))
        slice_s = duration / rounds
        with _progress() as progress:
            new = _case_runner(progress, slice_s)
            for r in range(rounds):
                for key, lg in logs:
                    tick = new(f"{key} ({r + 1}/{rounds})")
                    started = meter.start()
                    runs[key].append(run_append_async(lg, data, slice_s, tick))
                    meter.stop(key, started)
        cases: dict[str, Any] = {}
        base = runs["defaults"]
        for key, rs in runs.items():
            case = cases[key] = summarize_runs(key, "zlog", depth, rs, size, api="append_async in a bare loop")
            case["cpu"] = meter.figures(key, case["ops"])
            if key != "defaults":
                case.update(judged(round_ratios(rs, base)))
        result: dict[str, Any] = {
            "kind": "batching",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"duration_s": duration, "rounds": rounds, "entry_bytes": size, "depth": depth,
                       "width": width, "pool": b.pool, "settings": [label(c) for c in candidates]},
            "machine": machine_info(b.cluster),
            "sequencer": b.seqr,
            "cases": cases,
        }
    finally:
        try:
            b.close()
        finally:
            for cluster in clusters:
                cluster.shutdown()
    result["markdown"] = markdown_batching(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}")
    return result


def markdown_batching(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [f"append_async under AppendBatching settings, {p['entry_bytes']} B entries, depth {p['depth']}, "
             f"width {p['width']}, {p['rounds']} alternating rounds (ratio: median of the per-round ratios "
             "against the defaults; interval: where that median lies with 95% confidence)", "",
             "| setting | entries/s | vs defaults | interval | verdict | p50 ms | client µs/entry | OSD µs/entry |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for key, c in r["cases"].items():
        cpu = c["cpu"]
        lines.append(f"| {key} | {c['ops_per_s']:,.0f} | {_fmt(c.get('ratio'), '.2f') if key != 'defaults' else '1'} | "
                     f"{interval_text(c) if key != 'defaults' else '-'} | {c.get('verdict', '-')} | "
                     f"{_fmt(c['latency_ms']['p50'], '.2f')} | {_fmt(cpu['client_us_per_entry'], '.1f')} | "
                     f"{_fmt(cpu['osd_us_per_entry'], '.1f')} |")
    return "\n".join(lines)
