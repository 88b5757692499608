"""A linearizability checker for a map's single-key operations (Wing & Gong's
search, with Lowe's memoization of (linearized set, state) pairs and
P-compositionality: each key is checked alone, as its own register).

A history is a list of Op: each with the interval from its invocation to
its completion (times from one clock; time.monotonic() is one clock for
every process of a Linux machine) and its result. An operation whose
outcome is unknown (a timeout: it may or may not have taken effect) has
`complete=None`: it may be linearized at any point after its invocation,
or never. An operation known to have failed without effect is left out of
the history by the caller.

The model of one key: a value, MISSING when absent.
    put(v)            -> None; value := v
    get()             -> value
    delete()          -> value was present; value := MISSING
    cas(expected,new) -> value == expected (MISSING: absent); if so value := new
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

MISSING: Any = None  # replaced by pyzlog.objects.MISSING when it can be imported


def _missing() -> Any:
    global MISSING
    if MISSING is None:
        try:
            from pyzlog.objects import MISSING as m
        except ImportError:  # the checker alone, with no pyzlog
            m = _Absent()
        MISSING = m
    return MISSING


class _Absent:
    def __repr__(self) -> str:
        return "MISSING"


PUT, GET, DELETE, CAS = "put", "get", "delete", "cas"


@dataclass(frozen=True)
class Op:
    process: str
    kind: str          # put, get, delete, cas
    key: Hashable
    arg: Any           # put: the value; cas: (expected, new); else None
    result: Any        # what it returned (ignored when complete is None)
    invoke: float
    complete: float | None  # None: outcome unknown

    def __post_init__(self) -> None:
        if self.kind not in (PUT, GET, DELETE, CAS):
            raise ValueError(f"unknown operation {self.kind!r}")
        if self.complete is not None and self.complete < self.invoke:
            raise ValueError(f"{self}: completes before it is invoked")


@dataclass
class KeyResult:
    key: Hashable
    ok: bool
    ops: int
    explored: int                       # search states visited
    order: list[Op] = field(default_factory=list)     # a linearization, when ok
    stuck: list[Op] = field(default_factory=list)     # when not ok: the ops no extension could place
    prefix: list[Op] = field(default_factory=list)    # ... after this longest prefix found

    def explain(self) -> str:
        if self.ok:
            return f"key {self.key!r}: linearizable ({self.ops} ops)"
        lines = [f"key {self.key!r}: NOT linearizable; longest linearizable prefix ({len(self.prefix)} ops):"]
        lines += [f"  {_fmt(o)}" for o in self.prefix[-8:]]
        lines.append("  none of these can come next:")
        lines += [f"  {_fmt(o)}" for o in self.stuck[:8]]
        return "\n".join(lines)


@dataclass
class Result:
    ok: bool
    keys: dict[Hashable, KeyResult]

    def explain(self) -> str:
        bad = [k for k in self.keys.values() if not k.ok]
        if not bad:
            return f"linearizable: {len(self.keys)} keys, {sum(k.ops for k in self.keys.values())} ops"
        return "\n".join(k.explain() for k in bad)


def _fmt(o: Op) -> str:
    end = "?" if o.complete is None else f"{o.complete:.6f}"
    return f"{o.process} {o.kind}({o.arg!r}) -> {o.result!r} [{o.invoke:.6f}, {end}]"


def step(state: Any, op: Op) -> tuple[bool, Any]:
    """Apply `op` to the model: (does its result match, the state after)."""
    absent = _missing()
    unknown = op.complete is None
    if op.kind == PUT:
        return (unknown or op.result is None), op.arg
    if op.kind == GET:
        return (unknown or _same(op.result, state)), state
    if op.kind == DELETE:
        present = state is not absent
        return (unknown or op.result == present), absent
    expected, new = op.arg
    hit = _same(state, expected)
    if not unknown and op.result != hit:
        return False, state
    return True, (new if hit else state)


def _same(a: Any, b: Any) -> bool:
    absent = _missing()
    if a is absent or b is absent:
        return a is b
    return bool(a == b) and type(a) is type(b)


def check_key(ops: list[Op], key: Hashable = None, initial: Any = None, max_states: int = 5_000_000) -> KeyResult:
    """Is this one key's history linearizable? A depth-first search over
    the orders the intervals allow (Wing & Gong), skipping any (set of
    operations done, state) pair seen before (Lowe)."""
    state0 = _missing() if initial is None else initial
    ops = sorted(ops, key=lambda o: o.invoke)
    n = len(ops)
    inv = [o.invoke for o in ops]
    comp = [math.inf if o.complete is None else o.complete for o in ops]
    required = 0
    for i, o in enumerate(ops):
        if o.complete is not None:
            required |= 1 << i
    seen: set[tuple[int, Any]] = set()
    best: tuple[int, list[int], list[int]] = (-1, [], [])  # (length, prefix, candidates there)
    # iterative DFS: each frame is (done mask, state, path, candidates left to try)
    stack: list[tuple[int, Any, list[int], list[int]]] = []

    def candidates(done: int) -> list[int]:
        out = []
        lowest = math.inf  # earliest completion among ops not done, invoked so far
        for i in range(n):
            if done >> i & 1:
                continue
            if inv[i] > lowest:
                break  # it and every later op were invoked after some pending op completed
            out.append(i)
            if comp[i] < lowest:
                lowest = comp[i]
        return [i for i in out if inv[i] <= lowest]

    stack.append((0, state0, [], candidates(0)))
    explored = 0
    while stack:
        done, state, path, cands = stack[-1]
        if done & required == required:
            return KeyResult(key, True, n, explored, [ops[i] for i in path])
        if len(path) > best[0]:
            best = (len(path), list(path), list(cands))
        if not cands:
            stack.pop()
            continue
        i = cands.pop()
        ok, nxt = step(state, ops[i])
        if not ok:
            continue
        mask = done | 1 << i
        try:
            sig = (mask, nxt)
            hash(sig)
        except TypeError:  # an unhashable value: key on its repr
            sig = (mask, repr(nxt))
        if sig in seen:
            continue
        seen.add(sig)
        explored += 1
        if explored > max_states:
            raise RuntimeError(f"key {key!r}: gave up after {max_states} states ({n} ops)")
        stack.append((mask, nxt, path + [i], candidates(mask)))
        # an unknown op may also never happen: that is covered because it is
        # never required, and later ops are not blocked by it (complete = inf)
    _, prefix, stuck = best
    return KeyResult(key, False, n, explored, prefix=[ops[i] for i in prefix],
                     stuck=[ops[i] for i in stuck] or [o for j, o in enumerate(ops) if j not in prefix])


def check(history: Iterable[Op], initial: dict[Hashable, Any] | None = None) -> Result:
    """Check every key of a map's history on its own (a map of independent
    registers is linearizable iff each key's history is)."""
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    results = {k: check_key(ops, k, (initial or {}).get(k)) for k, ops in by_key.items()}
    return Result(all(r.ok for r in results.values()), results)


__all__ = ["Op", "KeyResult", "Result", "check", "check_key", "step", "PUT", "GET", "DELETE", "CAS"]
