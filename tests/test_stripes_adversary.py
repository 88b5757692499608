"""Adversarial tests of bounded objects and stripes (core/stripes.py,
core/tailfind.py, cls_zlog's data format) under reconfiguration. Written by
an adversary helper; each docstring says what went wrong when the test was
written."""
from __future__ import annotations

import threading
from typing import Any

from pyzlog import Log, RecordKind


def test_a_reader_between_a_reconfigurations_close_and_its_new_view_sees_no_fill(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    """A data-format reconfiguration installs the new epoch, closes the
    old objects at the tail, then installs the new view. A reader that
    refreshes in between reads the old objects at the new epoch with the
    old view as the newest. A full object (byte_bound reached) listed every
    unwritten position as FILLED, those at or past its view's end too: the
    reader handed out position 2 as FILLED, and the append then stored 2 in
    the new view (found by a stress run: followers reported acknowledged
    appends at a new view's first positions as FILLED)."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=1, slots=8, byte_bound=32)
    assert lg.append_many([b"a" * 16, b"b" * 16]) == [0, 1]  # the one object is now full
    store = lg.state.meta_store
    real = store.propose_view
    closed, go = threading.Event(), threading.Event()

    def held(*a: Any, **kw: Any) -> Any:
        closed.set()  # the old view is closed at 2; the new view is not installed yet
        assert go.wait(60)
        return real(*a, **kw)

    store.propose_view = held  # type: ignore[method-assign]
    t = threading.Thread(target=lg.reconfigure, args=(2,))
    t.start()
    try:
        assert closed.wait(60)
        reader = Log.open(rados_cluster, ceph.pool, log_name)
        assert len(reader.views) == 1  # the old view is still the newest
        in_window = [(r.position, r.kind) for r in reader.stream(0, hole_wait=0.2)]
    finally:
        go.set()
        t.join(60)
    assert reader.refresh().views[-1].start == 2
    assert lg.append(b"c" * 16) == 2
    assert in_window == [(0, RecordKind.DATA), (1, RecordKind.DATA)]
    assert [(r.position, r.kind) for r in reader.stream(0)] == [
        (0, RecordKind.DATA), (1, RecordKind.DATA), (2, RecordKind.DATA)]
