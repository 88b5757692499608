"""`zlog bench storage`: a big width-1 log stays in bounded objects, and
trimming its first half gives the space back to Ceph (issue 23's targets).

Fills a new data-format log with append_many, then reads every object's
header (entries and bytes) and size against the log's bounds and Ceph's
large-object thresholds, and the pool's stored bytes as `ceph df` counts them
before the fill, after it, and after `trim_to` of the first half. The drop is
taken over the log's own share of the pool (after-fill minus before-fill), so
other data in the pool does not blur it.
"""
from __future__ import annotations

import os
import time
from typing import Any

from .bench import _Bench, _progress, console, machine_info, write_json

#: Ceph's deep-scrub large-omap thresholds (osd_deep_scrub_large_omap_object_*)
#: and a size recovery is happy to move: what "bounded" is measured against
CEPH_KEY_THRESHOLD = 200_000
OBJECT_SIZE_LIMIT = 64 << 20
#: the issue's target: trimming the first half frees at least this share
TRIM_DROP_TARGET = 0.40


def _pool_stored(b: _Bench) -> int | None:
    from ..admin.status import pool_usage

    v = pool_usage(b.cluster, b.pool)["stored_bytes"]
    return None if v is None else int(v)


def _settled_stored(b: _Bench, previous: int | None, timeout: float = 90.0) -> int | None:
    """The pool's stored bytes once the mgr's figure moved off `previous` and
    held for two readings in a row (the mgr reports every second or so)."""
    deadline = time.monotonic() + timeout
    last = _pool_stored(b)
    while time.monotonic() < deadline:
        time.sleep(2.0)
        now = _pool_stored(b)
        if now is not None and now == last and now != previous:
            return now
        last = now
    return last


def _objects(b: _Bench, log: Any) -> list[dict[str, Any]]:
    """Every data-format object of the log: entries and bytes from its header,
    its size from RADOS."""
    from ..core.layout import view_places
    from ..core.tailfind import stat_places

    import rados

    out = []
    for view in log.state.refresh().views:  # the stripes opened so far
        sizes = {}
        for place in view_places(log.name, view):
            try:
                sizes[place] = b.ioctx.stat(place.oid)[0]
            except rados.ObjectNotFound:  # trimmed away, or never made
                pass
        places = list(sizes)
        for place, st in zip(places, stat_places(log.state, places)):
            out.append({"oid": place.oid, "entries": st.entries, "bytes": st.bytes, "size": sizes[place]})
    return out


def bench_storage(env: Any, *, entries: int = 2_000_000, size: int = 128, batch: int = 256,
                  slots: int | None = None, out: str = "results/bench-storage.json") -> dict[str, Any]:
    data = os.urandom(size)
    b = _Bench(env)
    try:
        name = b.new_log(1, slots=slots)
        log = b.open(name)
        view = log.views[-1]
        before = _pool_stored(b)
        t0 = time.monotonic()
        with _progress() as progress:
            task = progress.add_task(f"appending {entries:,} entries", total=entries, info="")
            first = last = None
            written = 0
            while written < entries:
                got = log.append_many([data] * min(batch, entries - written))
                first = got[0] if first is None else first
                last = got[-1]
                written += len(got)
                progress.update(task, completed=written)
        fill_s = time.monotonic() - t0
        assert first is not None and last is not None
        filled = _settled_stored(b, before)
        objects = _objects(b, log)
        half = first + (last - first + 1) // 2 - 1
        console.print(f"trimming to position {half:,}, then waiting for ceph df")
        log.trim_to(half)
        trimmed = _settled_stored(b, filled)
        left = _objects(b, log)
        share = None if filled is None or before is None else filled - before
        drop = None if share is None or trimmed is None or share <= 0 else (filled - trimmed) / share  # type: ignore[operator]
        max_entries = max(o["entries"] for o in objects)
        max_size = max(o["size"] for o in objects)
        result: dict[str, Any] = {
            "kind": "storage", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"entries": entries, "size": size, "batch": batch, "width": 1, "slots": slots,
                       "pool": b.pool},
            "machine": machine_info(b.cluster),
            "log": {"name": name, "first": first, "last": last, "format": "data" if view.bounded else "omap", "slots": view.slots,
                    "byte_bound": view.byte_bound, "fill_s": fill_s, "entries_per_s": entries / fill_s},
            "objects": {"count": len(objects), "max_entries": max_entries, "max_size": max_size,
                        # a wholly trimmed object keeps its header only (it is truncated)
                        "after_trim": len(left), "after_trim_holding": sum(1 for o in left if o["bytes"] > 0)},
            "bounds_met": {"slots": max_entries <= view.slots, "ceph_keys": max_entries < CEPH_KEY_THRESHOLD,
                           "size": max_size < OBJECT_SIZE_LIMIT},
            "pool_stored": {"before": before, "filled": filled, "trimmed": trimmed, "log_share": share},
            "trim": {"to": half, "drop": drop, "target": TRIM_DROP_TARGET,
                     "target_met": None if drop is None else drop >= TRIM_DROP_TARGET},
        }
        result["markdown"] = markdown_storage(result)
        write_json(out, result)
        console.print(result["markdown"])
        console.print(f"results: {out}")
        return result
    finally:
        b.close()


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / (1 << 20):,.1f} MiB"


def markdown_storage(r: dict[str, Any]) -> str:
    lg, ob, ps, tr = r["log"], r["objects"], r["pool_stored"], r["trim"]
    drop = "-" if tr["drop"] is None else f"{tr['drop']:.0%}"
    return "\n".join([
        f"# bench storage ({r['params']['entries']:,} entries of {r['params']['size']} B, width 1, "
        f"{lg['format']} format, {lg['slots']:,} positions / {_mib(lg['byte_bound'])} per object)",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| appended (append_many of {r['params']['batch']}) | {lg['entries_per_s']:,.0f} entries/s |",
        f"| objects | {ob['count']} |",
        f"| most entries in one object | {ob['max_entries']:,} (Ceph warns at {CEPH_KEY_THRESHOLD:,} keys) |",
        f"| largest object | {_mib(ob['max_size'])} |",
        f"| pool stored: before / filled / after trim | {_mib(ps['before'])} / {_mib(ps['filled'])} / "
        f"{_mib(ps['trimmed'])} |",
        f"| trim_to first half: stored bytes freed | {drop} of the log's (target >= {tr['target']:.0%}); "
        f"{ob['after_trim_holding']} of {ob['after_trim']} objects still hold entries |",
    ])
