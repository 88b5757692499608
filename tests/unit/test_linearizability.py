"""The linearizability checker (tests/linearizability.py) on histories made
by hand, where the answer is known, and on random histories of a simulated
linearizable map (all must pass) with one result falsified (must fail)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from linearizability import CAS, DELETE, GET, PUT, Op, check, check_key, step  # noqa: E402

from pyzlog.objects import MISSING  # noqa: E402


def op(p: str, kind: str, arg: object, result: object, a: float, b: float | None, key: str = "k") -> Op:
    return Op(p, kind, key, arg, result, a, b)


def test_a_sequential_history() -> None:
    h = [op("a", PUT, 1, None, 0, 1), op("a", GET, None, 1, 2, 3), op("b", CAS, (1, 2), True, 4, 5),
         op("b", GET, None, 2, 6, 7), op("a", DELETE, None, True, 8, 9), op("a", GET, None, MISSING, 10, 11)]
    r = check_key(h)
    assert r.ok and [o.invoke for o in r.order] == [0, 2, 4, 6, 8, 10]


def test_a_read_concurrent_with_a_write_may_see_either_value() -> None:
    for seen in (MISSING, 1):
        assert check_key([op("a", PUT, 1, None, 0, 10), op("b", GET, None, seen, 1, 2)]).ok


def test_a_stale_read_is_caught() -> None:
    h = [op("a", PUT, 1, None, 0, 1), op("a", PUT, 2, None, 2, 3), op("b", GET, None, 1, 4, 5)]
    r = check_key(h)
    assert not r.ok and "NOT linearizable" in r.explain()
    assert [o.kind for o in r.stuck] == [GET]


def test_reads_cannot_go_back_in_time() -> None:
    # b sees the new value, then c (starting after b finished) sees the old one
    h = [op("a", PUT, 1, None, 0, 1), op("a", PUT, 2, None, 2, 20), op("b", GET, None, 2, 3, 4),
         op("c", GET, None, 1, 5, 6)]
    assert not check_key(h).ok


def test_two_cas_cannot_both_win() -> None:
    h = [op("a", PUT, 0, None, 0, 1), op("b", CAS, (0, 1), True, 2, 5), op("c", CAS, (0, 2), True, 2, 5)]
    assert not check_key(h).ok
    h[2] = op("c", CAS, (0, 2), False, 2, 5)
    assert check_key(h).ok


def test_a_value_nobody_wrote_is_caught() -> None:
    assert not check_key([op("a", PUT, 1, None, 0, 1), op("b", GET, None, 7, 0, 2)]).ok


def test_unknown_outcomes_may_or_may_not_have_happened() -> None:
    # a timed-out put seen later: it happened (after its invocation)
    assert check_key([op("a", PUT, 5, None, 0, None), op("b", GET, None, 5, 10, 11)]).ok
    # never seen: it did not happen (or later than every read)
    assert check_key([op("a", PUT, 5, None, 0, None), op("b", GET, None, MISSING, 10, 11)]).ok
    # but not before its own invocation
    assert not check_key([op("b", GET, None, 5, 0, 1), op("a", PUT, 5, None, 2, None)]).ok
    # it may take effect between two reads, but not undo itself
    h = [op("a", PUT, 5, None, 0, None), op("b", GET, None, 5, 10, 11), op("b", GET, None, MISSING, 12, 13)]
    assert not check_key(h).ok


def test_keys_are_checked_alone() -> None:
    h = [op("a", PUT, 1, None, 0, 1, key="x"), op("a", PUT, 1, None, 0, 1, key="y"),
         op("b", GET, None, MISSING, 2, 3, key="y")]
    r = check(h)
    assert not r.ok and r.keys["x"].ok and not r.keys["y"].ok and "'y'" in r.explain()


def test_bad_operations_are_refused() -> None:
    with pytest.raises(ValueError):
        op("a", "incr", 1, None, 0, 1)
    with pytest.raises(ValueError):
        op("a", PUT, 1, None, 5, 1)


def test_the_model() -> None:
    assert step(MISSING, op("a", CAS, (MISSING, 1), True, 0, 1)) == (True, 1)
    assert step(1, op("a", CAS, (MISSING, 2), False, 0, 1)) == (True, 1)
    assert step(1, op("a", DELETE, None, True, 0, 1)) == (True, MISSING)
    assert step(MISSING, op("a", GET, None, None, 0, 1))[0] is False  # None is a value, not absence


def simulate(seed: int, procs: int = 4, ops_per: int = 25, keys: int = 2) -> list[Op]:
    """A linearizable map run by `procs` clients: each op takes effect at a
    random instant inside its interval, in the order of those instants."""
    rnd = random.Random(seed)
    events = []
    for p in range(procs):
        t = rnd.random()
        for _ in range(ops_per):
            a = t + rnd.random()
            b = a + rnd.random() * 3
            events.append((a + (b - a) * rnd.random(), p, a, b))
            t = b + rnd.random() * 0.2
    state: dict[str, object] = {}
    out = []
    for at, p, a, b in sorted(events):
        k = f"k{rnd.randrange(keys)}"
        kind = rnd.choice([PUT, GET, GET, CAS, DELETE])
        cur = state.get(k, MISSING)
        if kind == PUT:
            v = rnd.randrange(5)
            state[k] = v
            out.append(Op(f"p{p}", PUT, k, v, None, a, b))
        elif kind == GET:
            out.append(Op(f"p{p}", GET, k, None, cur, a, b))
        elif kind == DELETE:
            state.pop(k, None)
            out.append(Op(f"p{p}", DELETE, k, None, cur is not MISSING, a, b))
        else:
            exp, new = rnd.choice([cur, rnd.randrange(5)]), rnd.randrange(5)
            hit = exp is cur or exp == cur and cur is not MISSING
            if hit:
                state[k] = new
            out.append(Op(f"p{p}", CAS, k, (exp, new), hit, a, b))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_random_linearizable_histories_pass(seed: int) -> None:
    r = check(simulate(seed))
    assert r.ok, r.explain()


@pytest.mark.parametrize("seed", range(8))
def test_a_falsified_read_fails(seed: int) -> None:
    h = simulate(seed, procs=2, ops_per=20, keys=1)
    # make the last read of the key return a value no write ever stored
    i = max(i for i, o in enumerate(h) if o.kind == GET)
    o = h[i]
    h[i] = Op(o.process, GET, o.key, None, 999, o.invoke, o.complete)
    assert not check(h).ok
