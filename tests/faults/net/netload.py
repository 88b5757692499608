"""The network fault suite's workload, for the host and for client containers.

`NetWorkload` is faultlib's Workload (sync appenders, an async appender, a
following reader) plus a batch appender (`append_many`), with a sentinel of
its own so that several workloads can share one log. Histories are saved as
JSON lines with the exact bytes, so the host can merge what a client in a
container recorded with its own history before checking it (containers share
the host's kernel, so their time.monotonic() clocks are the same clock).

Run as a script (in a client container of the Docker test bed), it is one
client host's workload:

    python3 -P netload.py --conf C --pool P --log L --sequencer HOST:PORT --prefix c0 --out DIR

It starts the workload, writes DIR/progress.json about twice a second, and
when DIR/stop appears it stops the workload (its sentinel appended, its
reader at the sentinel) and writes DIR/history.jsonl and DIR/summary.json.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (HERE.parent, HERE.parent.parent):  # faultlib and history, also inside a container
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import pyzlog  # noqa: E402
from pyzlog import Log  # noqa: E402

from faultlib import Workload  # noqa: E402
from history import APPEND, OK, UNKNOWN, History, Op, payload  # noqa: E402


class NetWorkload(Workload):
    """Workload with `batch` > 0 adding one appender of `append_many` calls
    of that many entries. A batch that raises may be stored in part, so its
    entries are all recorded unknown."""

    def __init__(self, *args: Any, batch: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch = batch
        # one sentinel per workload: several share a log
        self._sentinel = payload(f"{self.prefix}.sentinel", 0)

    def _batch_loop(self, writer: str) -> None:
        lg = Log.open(self.cluster, self.pool, self.name, sequencer=self.sequencer)
        seq = 0
        try:
            while not self._stop.is_set():
                entries = [payload(writer, seq + k) for k in range(self.batch)]
                ops = [self.h.invoke(APPEND, writer, data=d) for d in entries]
                try:
                    positions = lg.append_many(entries)
                except Exception as e:  # noqa: BLE001 - recorded, never lost
                    for op in ops:
                        self.h.complete(op, UNKNOWN, error=e)
                    self.appender_errors[writer] = self.appender_errors.get(writer, 0) + 1
                    time.sleep(0.05)
                else:
                    for op, pos in zip(ops, positions, strict=True):
                        self.h.complete(op, OK, position=pos)
                seq += self.batch
                if self.pause:
                    time.sleep(self.pause * 4)
        finally:
            lg.close()

    def start(self) -> "NetWorkload":
        super().start()
        if self.batch:
            t = threading.Thread(target=self._batch_loop, args=(f"{self.prefix}-batch",),
                                 name="batch-appender", daemon=True)
            t.start()
            self._threads.append(t)
        return self


# ------------------------------------------------------------------ history files
def save_history(h: History, path: Path) -> None:
    with open(path, "w") as f:
        f.write(json.dumps({"stream_starts": h.stream_starts}) + "\n")
        for op in h.ops:
            d = asdict(op)
            d["data"] = None if op.data is None else base64.b64encode(op.data).decode()
            f.write(json.dumps(d) + "\n")


def load_history(path: Path) -> tuple[list[Op], dict[str, int]]:
    lines = path.read_text().splitlines()
    starts = json.loads(lines[0])["stream_starts"]
    ops = []
    for line in lines[1:]:
        d = json.loads(line)
        if d["data"] is not None:
            d["data"] = base64.b64decode(d["data"])
        ops.append(Op(**d))
    return ops, starts


# ------------------------------------------------------------------ the runner
def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one client host's workload for the network fault suite")
    ap.add_argument("--conf", required=True)
    ap.add_argument("--pool", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--sequencer", default=None)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--appenders", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--async-window", type=int, default=32)
    ap.add_argument("--hole-wait", type=float, default=1.0)
    ap.add_argument("--op-timeout", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=600.0, help="stop by itself after this long")
    args = ap.parse_args(argv)

    h = History()
    summary: dict[str, Any] = {"prefix": args.prefix, "error": None}
    cluster = pyzlog.connect(args.conf, op_timeout=args.op_timeout)
    w = NetWorkload(h, cluster, args.pool, args.log, sequencer=args.sequencer, appenders=args.appenders,
                    batch=args.batch, async_window=args.async_window, hole_wait=args.hole_wait,
                    prefix=args.prefix).start()
    stop_file = args.out / "stop"
    deadline = time.monotonic() + args.max_seconds
    try:
        while not stop_file.exists() and time.monotonic() < deadline:
            _write_json(args.out / "progress.json", {**w.counts(), "t": time.monotonic()})
            time.sleep(0.5)
        w.stop()
    except BaseException as e:  # noqa: BLE001 - the history is written whatever happens
        summary["error"] = f"{type(e).__name__}: {e}"
    finally:
        save_history(h, args.out / "history.jsonl")
        summary.update(w.counts(), async_acked=w.async_acked(), reader_errors=w.reader_errors[:20],
                       appender_errors=w.appender_errors, reader_done=w.reader_done.is_set())
        _write_json(args.out / "summary.json", summary)
    return 0 if summary["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
