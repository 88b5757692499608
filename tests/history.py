"""Operation histories of a shared log and a checker for them (in the manner of
Jepsen's queue and Kafka checkers).

Clients record every operation they try into a `History`: its kind, which
process ran it, when it started and ended (time.monotonic), its outcome
(``ok``; ``fail``: it certainly did not happen; ``unknown``: it may or may not
have happened, e.g. a timeout) and what it carried or saw. Appended payloads
come from `payload(writer, seq)` so any bytes read back can be checked byte for
byte and attributed to the append that produced them.

`check(history, final_scan)` compares the history with a final scan of the log
(position -> pyzlog Record, taken after the faults stopped) and names every
anomaly it finds:

==================  =====================================================
duplicate_position  one position with two different values (seen or acked,
                    or acknowledged both as data and as filled)
duplicate_value     one value at two positions
lost_write          an acknowledged append whose data is not at its
                    position in the final scan
reader_skip         a streaming reader (or the final scan) skipped a position
reader_backwards    a streaming reader went back (or repeated a position)
phantom_read        data read whose append failed (definitely), or that no
                    append ever tried
filled_then_data    a position seen filled/lost later returns data, or seen
                    trimmed later returns data appended after that
data_then_gap       a position seen with data later reads as filled/lost
wrong_data          bytes read differ from what was acknowledged at that
                    position, or are not a well-formed payload
==================  =====================================================

The module needs nothing but the standard library (and duck-typed Records:
anything with .position, .kind and .data), so it is usable without a cluster.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

APPEND = "append"
READ = "read"
STREAM_READ = "stream_read"
FILL = "fill"
TRIM = "trim"
KINDS = (APPEND, READ, STREAM_READ, FILL, TRIM)

OK = "ok"
FAIL = "fail"
UNKNOWN = "unknown"
PENDING = "pending"  # invoked, never completed: treated as unknown
OUTCOMES = (OK, FAIL, UNKNOWN, PENDING)

#: what a read saw at a position
DATA = "data"
FILLED = "filled"
LOST = "lost"
TRIMMED = "trimmed"
UNWRITTEN = "unwritten"
GAPS = (FILLED, LOST, TRIMMED)

ANOMALIES = ("duplicate_position", "duplicate_value", "lost_write", "reader_skip",
             "reader_backwards", "phantom_read", "filled_then_data", "data_then_gap",
             "wrong_data")

#: examples kept per anomaly in a Report
MAX_EXAMPLES = 5


# ------------------------------------------------------------------ payloads
def payload(writer: str, seq: int, size: int | None = None) -> bytes:
    """The deterministic entry `writer` appends as its `seq`-th operation:
    ``b"<writer>:<seq>:"`` then filler derived from that prefix. The size
    varies with seq (16..~300 bytes) unless given."""
    if ":" in writer:
        raise ValueError("writer names may not contain ':'")
    head = b"%s:%d:" % (writer.encode(), seq)
    if size is None:
        size = len(head) + 16 + (seq * 37) % 280
    size = max(size, len(head))
    return head + _filler(head, size - len(head))


def _filler(head: bytes, n: int) -> bytes:
    out = bytearray()
    block = head
    while len(out) < n:
        block = hashlib.blake2b(block, digest_size=32).digest()
        out += block
    return bytes(out[:n])


def parse_payload(data: bytes) -> tuple[str, int] | None:
    """(writer, seq) of a well-formed payload; None for anything else
    (including a payload whose filler was corrupted)."""
    try:
        writer, seq_s, _ = data.split(b":", 2)
        seq = int(seq_s)
    except (ValueError, TypeError):
        return None
    head = b"%s:%d:" % (writer, seq)
    if not data.startswith(head) or data[len(head):] != _filler(head, len(data) - len(head)):
        return None
    return writer.decode(errors="replace"), seq


def describe(data: bytes | None) -> str:
    """Short printable name of a value for reports."""
    if data is None:
        return "None"
    p = parse_payload(data)
    if p is not None:
        return f"{p[0]}:{p[1]}"
    return repr(data[:40]) + ("..." if len(data) > 40 else "")


# ------------------------------------------------------------------- history
@dataclass
class Op:
    id: int
    kind: str
    process: str
    start: float
    end: float | None = None
    outcome: str = PENDING
    position: int | None = None  # append: the acknowledged position; others: the position asked
    data: bytes | None = None    # append: what was appended; reads: the bytes seen
    seen: str | None = None      # reads: DATA or a gap kind or UNWRITTEN
    stream: str | None = None    # stream_read: which stream (one reader may run several)
    upto: bool = False           # trim: trim_to (every position <= position)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["data"] = describe(self.data) if self.data is not None else None
        return d


class History:
    """A thread-safe record of operations. Use invoke()/complete(), or the
    one-shot helpers for operations that are instantaneous to the caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._ids = itertools.count()
        self._stream_starts: dict[str, int] = {}

    def invoke(self, kind: str, process: str, *, position: int | None = None,
               data: bytes | None = None, stream: str | None = None, upto: bool = False) -> Op:
        if kind not in KINDS:
            raise ValueError(f"unknown operation kind {kind!r}")
        op = Op(next(self._ids), kind, str(process), time.monotonic(), position=position,
                data=data, stream=stream, upto=upto)
        with self._lock:
            self._ops.append(op)
        return op

    def complete(self, op: Op, outcome: str, *, position: int | None = None,
                 data: bytes | None = None, seen: str | None = None,
                 error: BaseException | str | None = None) -> Op:
        if outcome not in (OK, FAIL, UNKNOWN):
            raise ValueError(f"bad outcome {outcome!r}")
        with self._lock:
            op.end = time.monotonic()
            op.outcome = outcome
            if position is not None:
                op.position = position
            if data is not None:
                op.data = bytes(data)
            if seen is not None:
                op.seen = seen
            if error is not None:
                op.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return op

    # ---- one-shot helpers
    def append_ok(self, process: str, data: bytes, position: int) -> Op:
        return self.complete(self.invoke(APPEND, process, data=data), OK, position=position)

    def append_failed(self, process: str, data: bytes, error: str = "", unknown: bool = False) -> Op:
        return self.complete(self.invoke(APPEND, process, data=data), UNKNOWN if unknown else FAIL,
                             error=error or None)

    def read_seen(self, process: str, position: int, seen: str, data: bytes | None = None,
                  kind: str = READ, stream: str | None = None) -> Op:
        op = self.invoke(kind, process, position=position, stream=stream)
        return self.complete(op, OK, seen=seen, data=data)

    def begin_stream(self, stream: str, start: int) -> None:
        """Declare that `stream` starts at `start` (so a skip of its very
        first position is found too)."""
        with self._lock:
            self._stream_starts[stream] = start

    def stream_record(self, process: str, stream: str, record: Any, start: float | None = None) -> Op:
        """Record one pyzlog Record a streaming reader returned."""
        op = self.invoke(STREAM_READ, process, position=record.position, stream=stream)
        if start is not None:
            op.start = start
        return self.complete(op, OK, seen=record_seen(record), data=record.data)

    def extend(self, ops: Iterable[Op], stream_starts: Mapping[str, int] | None = None) -> None:
        """Add operations another process recorded (its streams keep their names)."""
        with self._lock:
            self._ops.extend(ops)
            self._stream_starts.update(stream_starts or {})

    # ---- reading back
    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    @property
    def stream_starts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stream_starts)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for op in self.ops:
            out[f"{op.kind}:{op.outcome}"] += 1
        return dict(out)


def record_seen(record: Any) -> str:
    """DATA/FILLED/LOST/TRIMMED for a pyzlog Record (or anything with .kind)."""
    kind = getattr(record.kind, "value", record.kind)
    return str(kind).lower()


# -------------------------------------------------------------------- report
@dataclass
class Report:
    ops: int = 0
    acknowledged: int = 0
    failed_appends: int = 0
    unknown_appends: int = 0
    reads: int = 0
    final_positions: int = 0
    final_data: int = 0
    final_gaps: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {a: 0 for a in ANOMALIES})
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, anomaly: str, example: str) -> None:
        assert anomaly in ANOMALIES, anomaly
        self.counts[anomaly] = self.counts.get(anomaly, 0) + 1
        ex = self.examples.setdefault(anomaly, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(example)

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())

    @property
    def found(self) -> dict[str, int]:
        """Only the anomalies that occurred."""
        return {k: v for k, v in self.counts.items() if v}

    @property
    def ok(self) -> bool:
        return self.anomalies == 0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["anomalies"] = self.anomalies
        return d

    def summary(self) -> str:
        lines = [f"{self.ops} ops, {self.acknowledged} acknowledged appends "
                 f"({self.failed_appends} failed, {self.unknown_appends} unknown), {self.reads} reads; "
                 f"final scan {self.final_positions} positions ({self.final_data} data, "
                 f"{self.final_gaps} gaps); anomalies: {self.anomalies}"]
        for name, n in self.found.items():
            lines.append(f"  {name}: {n}")
            lines.extend(f"    - {e}" for e in self.examples.get(name, []))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ------------------------------------------------------------------- checker
@dataclass
class _Obs:
    """One observation of a position: when, by what, what."""
    start: float
    end: float
    seen: str
    data: bytes | None
    source: str


def check(history: History | Iterable[Op], final_scan: Mapping[int, Any],
          stream_starts: Mapping[str, int] | None = None) -> Report:
    """Check `history` against `final_scan` (position -> Record with .kind and
    .data, e.g. from Log.stream(0) after the faults stopped)."""
    if isinstance(history, History):
        ops = history.ops
        starts = dict(history.stream_starts)
    else:
        ops = list(history)
        starts = {}
    starts.update(stream_starts or {})
    rep = Report(ops=len(ops))
    inf = float("inf")

    appends = [o for o in ops if o.kind == APPEND]
    # every value an append tried, with the ops that tried it
    tried: dict[bytes, list[Op]] = defaultdict(list)
    for o in appends:
        if o.data is not None:
            tried[o.data].append(o)
    acked: dict[int, list[Op]] = defaultdict(list)  # position -> ok appends
    for o in appends:
        if o.outcome == OK:
            rep.acknowledged += 1
            if o.position is not None:
                acked[o.position].append(o)
        elif o.outcome == FAIL:
            rep.failed_appends += 1
        else:
            rep.unknown_appends += 1

    # observations per position: reads by clients, then the final scan (last)
    obs: dict[int, list[_Obs]] = defaultdict(list)
    for o in ops:
        if o.kind in (READ, STREAM_READ) and o.outcome == OK and o.position is not None:
            rep.reads += 1
            seen = o.seen or (DATA if o.data is not None else UNWRITTEN)
            obs[o.position].append(_Obs(o.start, o.end if o.end is not None else inf, seen,
                                        o.data if seen == DATA else None, f"{o.kind} #{o.id} by {o.process}"))
        elif o.kind == FILL and o.outcome == OK and o.position is not None:
            # a successful fill is an observation of "filled" made during the op
            obs[o.position].append(_Obs(o.start, o.end if o.end is not None else inf, FILLED, None,
                                        f"fill #{o.id} by {o.process}"))
    rep.final_positions = len(final_scan)
    for pos, rec in final_scan.items():
        seen = record_seen(rec)
        if seen == DATA:
            rep.final_data += 1
        else:
            rep.final_gaps += 1
        obs[pos].append(_Obs(inf, inf, seen, rec.data if seen == DATA else None, "final scan"))

    trims = [o for o in ops if o.kind == TRIM and o.outcome != FAIL and o.position is not None]

    def trimmed(pos: int) -> bool:
        return any(t.position == pos or (t.upto and pos <= t.position) for t in trims)  # type: ignore[operator]

    # -- duplicate_position: two values at one position
    for pos in sorted(set(acked) | set(obs)):
        values: dict[bytes, str] = {}
        for o in acked.get(pos, []):
            if o.data is not None:
                values.setdefault(o.data, f"ack of {o.process} #{o.id}")
        for ob in obs.get(pos, []):
            if ob.seen == DATA and ob.data is not None:
                values.setdefault(ob.data, ob.source)
        if len(values) > 1:
            rep.add("duplicate_position",
                    f"position {pos}: " + ", ".join(f"{describe(v)} ({src})" for v, src in values.items()))
        fills = [ob for ob in obs.get(pos, []) if ob.seen == FILLED and ob.source.startswith("fill")]
        if fills and acked.get(pos):
            rep.add("duplicate_position",
                    f"position {pos}: acknowledged append {describe(acked[pos][0].data)} and {fills[0].source} "
                    "both succeeded")

    # -- duplicate_value: one value at two positions
    where: dict[bytes, dict[int, str]] = defaultdict(dict)
    for pos, lst in acked.items():
        for o in lst:
            if o.data is not None:
                where[o.data].setdefault(pos, f"ack #{o.id}")
    for pos, lst in obs.items():
        for ob in lst:
            if ob.seen == DATA and ob.data is not None:
                where[ob.data].setdefault(pos, ob.source)
    for value, at in where.items():
        if len(at) > 1:
            rep.add("duplicate_value", f"{describe(value)} at positions "
                    + ", ".join(f"{p} ({src})" for p, src in sorted(at.items())))

    # -- lost_write: acknowledged but not in the final scan at its position
    for pos, lst in sorted(acked.items()):
        for o in lst:
            rec = final_scan.get(pos)
            if rec is not None and record_seen(rec) == TRIMMED and trimmed(pos):
                continue
            if rec is None:
                why = "position missing from the final scan"
            elif record_seen(rec) != DATA:
                why = f"final scan has {record_seen(rec)}"
            elif rec.data != o.data:
                why = f"final scan has {describe(rec.data)}"
            else:
                continue
            rep.add("lost_write", f"{describe(o.data)} acknowledged at {pos} to {o.process} (#{o.id}): {why}")

    # -- phantom_read and wrong_data: every data observation is checked
    for pos, lst in sorted(obs.items()):
        for ob in lst:
            if ob.seen != DATA:
                continue
            data = ob.data if ob.data is not None else b""
            attempts = tried.get(data, [])
            if not attempts:
                parsed = parse_payload(data)
                if parsed is None:
                    rep.add("wrong_data", f"position {pos}: {ob.source} read {describe(data)}, "
                            "not a well-formed payload")
                else:
                    rep.add("phantom_read", f"position {pos}: {ob.source} read {describe(data)}, "
                            "which no append tried")
                continue
            if all(a.outcome == FAIL for a in attempts):
                a = attempts[0]
                rep.add("phantom_read", f"position {pos}: {ob.source} read {describe(data)}, whose append "
                        f"by {a.process} (#{a.id}) failed ({a.error})")
            for a in acked.get(pos, []):
                if a.data is not None and a.data != data and ob.source != "final scan":
                    rep.add("wrong_data", f"position {pos}: {ob.source} read {describe(data)}, "
                            f"{describe(a.data)} was acknowledged there")

    # -- filled_then_data / data_then_gap: order of observations in real time
    for pos, lst in sorted(obs.items()):
        gaps = [ob for ob in lst if ob.seen in GAPS]
        datas = [ob for ob in lst if ob.seen == DATA]
        for g in gaps:
            later = [d for d in datas if d.start > g.end]
            if g.seen == TRIMMED:
                # a reader may return an entry it fetched (read ahead) before a
                # trim it finishes after: data that existed before the trim
                # was seen is a stale read, not a resurrection. Only data whose
                # every append began after the trim was seen came back.
                later = [d for d in later
                         if d.data is not None and tried.get(d.data)
                         and min(a.start for a in tried[d.data]) > g.end]
            if later:
                rep.add("filled_then_data", f"position {pos}: {g.seen} ({g.source}) then data "
                        f"{describe(later[0].data)} ({later[0].source})")
                break
        for d in datas:
            later = [g for g in gaps if g.start > d.end and g.seen in (FILLED, LOST)]
            if later:
                rep.add("data_then_gap", f"position {pos}: data {describe(d.data)} ({d.source}) then "
                        f"{later[0].seen} ({later[0].source})")
                break

    # -- reader_skip / reader_backwards: each stream in the order it returned records
    streams: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind == STREAM_READ and o.outcome == OK and o.position is not None:
            streams[o.stream or o.process].append(o)
    for name, lst in streams.items():
        prev = starts.get(name)
        expect = prev
        for i, o in enumerate(lst):
            pos = o.position
            assert pos is not None
            if expect is None:
                expect = pos
            if pos < expect:
                rep.add("reader_backwards", f"stream {name}: position {pos} after {expect - 1} (#{o.id})")
            elif pos > expect:
                rep.add("reader_skip", f"stream {name}: jumped from {expect} to {pos}, skipping "
                        f"{pos - expect} position(s) (#{o.id})")
            expect = max(expect, pos + 1) if pos >= expect else expect
    # the final scan must cover 0..max without a gap
    if final_scan:
        top = max(final_scan)
        missing = [p for p in range(top + 1) if p not in final_scan]
        if missing:
            rep.add("reader_skip", f"final scan: {len(missing)} position(s) missing below {top}, "
                    f"first {missing[:5]}")
    return rep


def dump(history: History, path: str) -> None:
    """Write the history as JSON lines (for looking into a failure)."""
    with open(path, "w") as f:
        for op in history.ops:
            f.write(json.dumps(op.as_json()) + "\n")
