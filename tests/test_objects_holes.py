"""A replicated-object runtime playing a log with holes between its own
entries (objects/runtime.py _play, objects/streams.py walk).

Without a sequencer every streams append seals a new epoch (slow tail
finding), so a runtime's two senders keep refusing each other's batches in
flight: each refused batch leaves its positions as holes between the
runtime's own entries. The player reads only the gaps between its own
entries (their bytes are at hand), one walk per gap, and each walk started
a new hole clock: every hole waited its full hole_wait from the moment that
walk met it, one after the other. 20,000 puts stalled for minutes (a
hole_wait of 2 s times some hundred gaps), though every hole had been known
to lie below the tail since the runtime's own later entries landed. The
plain (streams off) player read gap by gap the same way."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pyzlog import Log
from pyzlog.client import reader
from pyzlog.objects import Runtime
from pyzlog.objects.machine import StateMachine

HOLE_WAIT = 1.0
GAPS = 5


class Gate(StateMachine):
    """Holds the player in its first command until opened."""

    type_name = "gate"

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.opened = threading.Event()

    def apply(self, command: Any, position: int) -> Any:
        self.entered.set()
        assert self.opened.wait(300), "the test never opened the gate"
        return command


def wait_until(cond: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"waited {timeout:.0f}s for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("streams", [True, False], ids=["streams", "plain"])
def test_holes_between_own_entries_are_waited_for_once_not_one_after_another(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch, streams: bool) -> None:
    """Holes the runtime has known to lie below the tail since one moment
    (its own later entries landed) are filled hole_wait after that moment:
    their waits all start then, not one per walk as the player reaches each
    gap between its own entries (GAPS gaps took GAPS x hole_wait)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3)  # no sequencer: slow tail finding
    other = Log.open(rados_cluster, ceph.pool, log_name)
    starts: list[float] = []
    real_wait_for = reader.HoleClock.wait_for

    def wait_for(self: reader.HoleClock, since: float) -> float:
        starts.append(since)  # when this hole's wait began
        return real_wait_for(self, since)

    monkeypatch.setattr(reader.HoleClock, "wait_for", wait_for)
    rt = Runtime(log, hole_wait=HOLE_WAIT, streams=streams)
    gate = rt.host("gate", Gate())
    m = rt.map("m")
    try:
        rt.start()
        first = rt.propose(gate, gate.encode_command("first"))
        assert gate.entered.wait(120), "the player never applied the first entry"
        # the player is held at position 0; meanwhile own entries land with holes between them
        futures = []
        holes = []
        for i in range(GAPS):
            other.refresh()  # a handle whose metadata shows no open stripe yet hints 0
            p = other.next_position_hint()
            other.write(p + 1, b"not an objects entry")  # p: taken by a writer that never writes it
            holes.append(p)
            futures.append(m.put_async(f"k{i}", i))
            wait_until(lambda: other.next_position_hint() > p + 2, f"own entry {i} to land")
        gate.opened.set()
        assert first.result(300) == "first"
        for f in futures:
            f.result(300)
        assert rt.applied >= holes[-1] + 3
        assert rt.stats.gaps == GAPS
        assert m["k0"] == 0 and m[f"k{GAPS - 1}"] == GAPS - 1
        for p in holes:
            assert other.read_positions([p])[p] < 0  # filled
    finally:
        gate.opened.set()
        rt.close()
        other.close()
        log.close()
    # every hole lay below the tail (all own entries above it had landed)
    # when the player first met one: one wait, begun then, for all of them
    assert len(set(starts)) == 1, f"{len(set(starts))} hole waits for {GAPS} gaps known at once"
