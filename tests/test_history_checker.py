"""The history checker (tests/history.py) on hand-made histories: each anomaly
is found by name, and a clean history finds nothing. No cluster needed."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from history import (ANOMALIES, APPEND, FILL, FILLED, LOST, TRIM, TRIMMED, History, check,
                     parse_payload, payload)


@dataclass(frozen=True)
class Rec:
    """Stands in for pyzlog.Record (the checker only reads these fields)."""
    position: int
    kind: str
    data: bytes | None


def d(pos: int, data: bytes) -> Rec:
    return Rec(pos, "data", data)


def gap(pos: int, kind: str = "filled") -> Rec:
    return Rec(pos, kind, None)


def scan(*recs: Rec) -> dict[int, Rec]:
    return {r.position: r for r in recs}


def clean() -> tuple[History, dict[int, Rec]]:
    """Two writers, a stream reader, one failed and one unknown append, a hole
    the reader filled: everything consistent."""
    h = History()
    a0, a1, b0, b1 = payload("a", 0), payload("a", 1), payload("b", 0), payload("b", 1)
    h.append_ok("a", a0, 0)
    h.append_ok("b", b0, 1)
    h.append_failed("a", a1, "refused")              # never stored
    h.append_failed("b", b1, "timeout", unknown=True)  # stored after all, at 3
    h.begin_stream("r", 0)
    for rec in (d(0, a0), d(1, b0), gap(2, "lost"), d(3, b1)):
        h.stream_record("r", "r", rec)
    h.read_seen("c", 0, "data", a0)
    return h, scan(d(0, a0), d(1, b0), gap(2, "lost"), d(3, b1))


def found(h: History, final: dict[int, Rec]) -> dict[str, int]:
    return check(h, final).found


def test_payloads_round_trip_and_detect_corruption() -> None:
    p = payload("w1", 42)
    assert parse_payload(p) == ("w1", 42)
    assert payload("w1", 42) == p and payload("w1", 43) != p
    assert parse_payload(p[:-1] + bytes([p[-1] ^ 1])) is None
    assert parse_payload(b"junk") is None
    assert len(payload("x", 1, size=4096)) == 4096


def test_clean_history_finds_nothing() -> None:
    h, final = clean()
    rep = check(h, final)
    assert rep.ok, rep.summary()
    assert rep.anomalies == 0 and set(rep.counts) == set(ANOMALIES)
    assert rep.acknowledged == 2 and rep.failed_appends == 1 and rep.unknown_appends == 1
    assert rep.ops == len(h) and rep.final_positions == 4


def test_duplicate_position_two_acks() -> None:
    h, final = clean()
    h.append_ok("b", payload("b", 7), 0)  # a second writer acknowledged at 0
    assert "duplicate_position" in found(h, final)


def test_duplicate_position_two_reads() -> None:
    h, final = clean()
    h.read_seen("c", 3, "data", payload("a", 1))  # the failed one... and a different value at 3
    assert "duplicate_position" in found(h, final)


def test_duplicate_position_ack_and_fill() -> None:
    h, final = clean()
    op = h.invoke(FILL, "r", position=1)
    h.complete(op, "ok")
    assert "duplicate_position" in found(h, final)


def test_duplicate_value() -> None:
    h, final = clean()
    a0 = payload("a", 0)
    final[4] = d(4, a0)  # the same entry stored twice (a retried append)
    rep = check(h, final)
    assert rep.found.get("duplicate_value") == 1, rep.summary()


def test_lost_write_missing_and_filled() -> None:
    h, final = clean()
    del final[1]
    final[1] = gap(1, "filled")
    assert "lost_write" in found(h, final)
    h2, final2 = clean()
    h2.append_ok("a", payload("a", 9), 10)  # acknowledged far past the end of the scan
    assert "lost_write" in found(h2, final2)


def test_trimmed_acknowledged_entry_is_not_lost() -> None:
    h, final = clean()
    op = h.invoke(TRIM, "t", position=1, upto=True)
    h.complete(op, "ok")
    final[0], final[1] = gap(0, TRIMMED), gap(1, TRIMMED)
    rep = check(h, final)
    assert "lost_write" not in rep.found, rep.summary()
    # ...but a trim of something else does not excuse it
    h2, final2 = clean()
    h2.complete(h2.invoke(TRIM, "t", position=0), "ok")
    final2[1] = gap(1, TRIMMED)
    assert "lost_write" in found(h2, final2)


def test_reader_skip() -> None:
    h, final = clean()
    h.begin_stream("r2", 0)
    h.stream_record("r2", "r2", d(0, payload("a", 0)))
    h.stream_record("r2", "r2", d(3, payload("b", 1)))  # 1 and 2 never returned
    assert found(h, final).get("reader_skip") == 1


def test_reader_skip_of_first_position_and_in_final_scan() -> None:
    h, final = clean()
    h.begin_stream("r2", 0)
    h.stream_record("r2", "r2", d(1, payload("b", 0)))
    assert "reader_skip" in found(h, final)
    h2, final2 = clean()
    del final2[2]
    assert "reader_skip" in found(h2, final2)


def test_reader_backwards() -> None:
    h, final = clean()
    h.stream_record("r", "r", d(1, payload("b", 0)))  # stream r already returned 0..3
    assert found(h, final).get("reader_backwards") == 1


def test_phantom_read_of_failed_append() -> None:
    h = History()
    a0, a1 = payload("a", 0), payload("a", 1)
    h.append_ok("a", a0, 0)
    h.append_failed("a", a1, "refused")  # definitely failed ...
    h.read_seen("c", 1, "data", a1)      # ... yet read
    assert "phantom_read" in found(h, scan(d(0, a0), d(1, a1)))


def test_phantom_read_of_unattempted_append() -> None:
    h, final = clean()
    final[4] = d(4, payload("zz", 5))  # nobody appended this
    assert found(h, final).get("phantom_read") == 1


def test_unknown_append_read_is_no_phantom() -> None:
    h, final = clean()
    assert "phantom_read" not in found(h, final)  # b:1 was unknown and read at 3


def test_filled_then_data() -> None:
    h, final = clean()
    h.read_seen("c", 2, FILLED)
    h.read_seen("c", 2, "data", payload("b", 1))  # after reading it filled
    assert "filled_then_data" in found(h, final)


def test_lost_then_data_in_final_scan() -> None:
    h = History()
    p = payload("a", 0)
    h.append_failed("a", p, "timeout", unknown=True)
    h.begin_stream("r", 0)
    h.stream_record("r", "r", gap(0, LOST))  # the reader filled 0 ...
    assert "filled_then_data" in found(h, scan(d(0, p)))  # ... and data showed up there later


def test_trimmed_then_newly_appended_data() -> None:
    """A trimmed position that takes a new append (issue 16's resurrection)."""
    h = History()
    h.read_seen("c", 0, TRIMMED)
    p = payload("a", 0)
    h.append_ok("a", p, 0)  # begun after the trim was seen
    h.read_seen("c", 0, "data", p)
    assert "filled_then_data" in found(h, scan(gap(0, TRIMMED)))


def test_trimmed_then_data_appended_before_is_a_stale_read() -> None:
    """A reader returning an entry it fetched before the trim: no anomaly."""
    h = History()
    p = payload("a", 0)
    h.append_ok("a", p, 0)
    h.complete(h.invoke(TRIM, "t", position=0, upto=True), "ok")
    h.read_seen("c", 0, TRIMMED)
    h.read_seen("r", 0, "data", p)  # from its read-ahead window
    assert "filled_then_data" not in found(h, scan(gap(0, TRIMMED)))


def test_data_then_gap() -> None:
    h = History()
    p = payload("a", 0)
    h.append_failed("a", p, "timeout", unknown=True)
    h.read_seen("c", 0, "data", p)
    assert "data_then_gap" in found(h, scan(gap(0, FILLED)))


def test_wrong_data_differs_from_ack() -> None:
    h, final = clean()
    h.read_seen("c", 1, "data", payload("b", 1))  # b:1 (unknown) read where b:0 was acked
    assert "wrong_data" in found(h, final)


def test_wrong_data_corrupted_bytes() -> None:
    h, final = clean()
    bad = bytearray(payload("a", 0))
    bad[-1] ^= 0xFF
    h.read_seen("c", 0, "data", bytes(bad))
    assert "wrong_data" in found(h, final)


def test_report_examples_and_summary() -> None:
    h, final = clean()
    for k in range(20):
        h.append_ok("x", payload("x", k), 100 + k)  # all lost
    rep = check(h, final)
    assert rep.counts["lost_write"] == 20 and len(rep.examples["lost_write"]) == 5
    assert "lost_write: 20" in rep.summary() and not rep.ok
    assert rep.as_dict()["anomalies"] == rep.anomalies


def test_history_is_thread_safe() -> None:
    import threading

    h = History()

    def work(w: int) -> None:
        for k in range(500):
            op = h.invoke(APPEND, f"w{w}", data=payload(f"w{w}", k))
            h.complete(op, "ok", position=w * 1000 + k)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(h) == 2000 and len({o.id for o in h.ops}) == 2000
    final = {o.position: d(o.position, o.data) for o in h.ops}  # type: ignore[arg-type,misc]
    rep = check(h, final)
    assert rep.acknowledged == 2000
    # positions 0..3499 are not contiguous: only the final-scan skip is found
    assert rep.found == {"reader_skip": 1}


@pytest.mark.parametrize("outcome", ["bogus"])
def test_bad_outcome_refused(outcome: str) -> None:
    h = History()
    with pytest.raises(ValueError):
        h.complete(h.invoke(APPEND, "a"), outcome)
