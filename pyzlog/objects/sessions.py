"""Exactly-once application of proposals, decided by replay alone.

Each runtime proposes as a client (a random 64-bit id) with increasing seqs.
An entry carries (client, seq) and the client's low-water mark `lwm`: the
client will never append again any seq below it. A replica applies the
first copy of (client, seq) whose seq is not below the highest lwm seen from
that client, and no other copy, so a retried append that stored its bytes
twice is applied once; because the rule reads only the log, every replica
skips the same copies. RETIRE entries mark seqs as settled without applying
them: a proposer that gave up on an append learns from its own RETIRE that
the seq never was, and never will be, applied.

The state is small: per client its lwm and the seqs at or above it that were
seen. It goes into checkpoints (the same entries must be skipped after a
restart from one).
"""
from __future__ import annotations

from typing import Any

from .errors import BadEntry


class Session:
    __slots__ = ("lwm", "seen", "_prune_at")

    def __init__(self, lwm: int = 0, seen: set[int] | None = None) -> None:
        self.lwm = lwm
        self.seen: set[int] = seen if seen is not None else set()
        self._prune_at = 64

    def admit(self, seq: int, lwm: int) -> bool:
        """True the first time (seq) may be applied; False for a copy."""
        if lwm > self.lwm:
            self.lwm = lwm
            if len(self.seen) >= self._prune_at:  # drop what the lwm now answers for
                self.seen = {s for s in self.seen if s >= lwm}
                self._prune_at = max(64, 2 * len(self.seen))
        if seq < self.lwm or seq in self.seen:
            return False
        self.seen.add(seq)
        return True

    def applied(self, seq: int) -> bool | None:
        """True if seq was admitted, None if the lwm has passed it (admitted
        or retired: this state cannot tell), False if not yet."""
        if seq in self.seen:
            return True
        return None if seq < self.lwm else False


class Sessions:
    def __init__(self) -> None:
        self.by_client: dict[int, Session] = {}

    def admit(self, client: int, seq: int, lwm: int) -> bool:
        s = self.by_client.get(client)
        if s is None:
            s = self.by_client[client] = Session(lwm)
        return s.admit(seq, lwm)

    def retire(self, client: int, seqs: list[int], lwm: int) -> list[int]:
        """Mark `seqs` settled; returns those that had been applied before."""
        s = self.by_client.get(client)
        if s is None:
            s = self.by_client[client] = Session(lwm)
        was = [q for q in seqs if q in s.seen]
        for q in seqs:
            s.admit(q, lwm)
        return was

    def get(self, client: int) -> Session | None:
        return self.by_client.get(client)

    def max_seq(self, client: int) -> int:
        s = self.by_client.get(client)
        if s is None:
            return 0
        return max(max(s.seen, default=0), s.lwm)

    # ------------------------------------------------------- checkpoints
    def snapshot(self) -> list[Any]:
        """A canonical form: sorted, with nothing below each lwm."""
        return [[c, s.lwm, sorted(q for q in s.seen if q >= s.lwm)] for c, s in sorted(self.by_client.items())]

    @classmethod
    def restore(cls, state: Any) -> Sessions:
        out = cls()
        try:
            for client, lwm, seen in state:
                out.by_client[int(client)] = Session(int(lwm), {int(q) for q in seen})
        except (TypeError, ValueError) as e:
            raise BadEntry(f"a checkpoint's sessions do not parse: {e}") from None
        return out
