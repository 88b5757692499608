"""Adversarial tests of replicated-object streams (objects/streams.py:
walk(), the sequencer's STREAM_TAIL answer) around sequencer restarts.
Written by an adversary helper; each docstring says what went wrong when
the test was written."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from seqr_proc import SeqrProcess

from pyzlog import Log
from pyzlog.objects import Runtime, entry
from pyzlog.objects.entry import MAGIC
from pyzlog.objects.streams import walk

HOLE_WAIT = 0.3


def positions_of(log: Log, sid: int, end: int) -> list[int]:
    """Every position below `end` whose entry names stream `sid` (the whole log read)."""
    out = []
    for batch in log.stream_batches(0, end, hole_wait=HOLE_WAIT):
        for pos, data in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            if data is None or data[:2] != MAGIC or not data[4] & entry.FLAG_BACKPOINTERS:
                continue
            _k, sections, _off = entry.parse_backpointers(data, pos)
            if sid in sections:
                out.append(pos)
    return out


def test_a_sequencer_restart_mid_walk_never_hides_a_position_handed_out_again(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, seqr: SeqrProcess, tmp_path: Path) -> None:
    """walk() believes the sequencer's STREAM_TAIL answer for the whole of
    [back[-1], tail): no position of the stream there but those it names.
    A position the sequencer had handed out to a writer that never wrote
    it lies below that tail; a new sequencer (restart) recovers its counter
    from what is stored and hands that position out again, here to the
    stream walked. The walk, still on the old answer, never reads it and
    returns `end` past it: the reader believes the stream has no entry
    there, and its next walk starts above it (the entry is lost to it)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    opened: list[Any] = [log]
    writer_log = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    w = Runtime(writer_log, hole_wait=HOLE_WAIT, streams=True)
    opened += [w, writer_log]
    again: list[SeqrProcess] = []
    try:
        a = w.map("a")
        for i in range(10):
            a[f"k{i}"] = i
        w.sync()
        sid = entry.stream_id("a")
        reader = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
        opened.append(reader)
        taken = reader.take_positions(1)  # its writer dies before writing it
        real = reader.read_positions

        def restart_mid_walk(positions: list[int]) -> Any:
            if not again:  # after the sequencer's answer, before the first read
                seqr.kill()
                again.append(SeqrProcess(ceph.conf, port=seqr.port, log_path=seqr.log_path).start())
                a["late"] = 1
            return real(positions)

        reader.read_positions = restart_mid_walk  # type: ignore[method-assign]
        got, _datas, _kinds, end = walk(reader, [sid], 0, taken + 1, hole_wait=HOLE_WAIT)
        assert again
        mine = [p for p in positions_of(log, sid, end)]
        assert got == mine, f"stream positions below {end}: walk {got}, log {mine} (taken {taken})"
    finally:
        for x in reversed(opened):
            x.close()
        for p in again:
            p.kill()
