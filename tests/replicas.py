"""Runtimes of the replicated-object layer on one log, each with a Log of
its own, as several processes would have (shared by the objects tests)."""
from __future__ import annotations

from typing import Any

from pyzlog import Log
from pyzlog.objects import RadosCheckpoints, Runtime

#: the runtimes' hole wait: short, so tests that meet a hole do not wait long
HOLE_WAIT = 0.3


class Replicas:
    """Runtimes on one log, each with a Log of its own; all closed at the end."""

    def __init__(self, cluster: Any, pool: str, name: str, seqr: str | None, **create: Any) -> None:
        self.cluster, self.pool, self.name, self.seqr = cluster, pool, name, seqr
        self.log = Log.create(cluster, pool, name, width=3, sequencer=seqr, **create)  # create: e.g. compression
        self.runtimes: list[Runtime] = []
        self.logs: list[Log] = [self.log]

    def new(self, checkpoints: bool = False, **kw: Any) -> Runtime:
        lg = Log.open(self.cluster, self.pool, self.name, sequencer=self.seqr)
        self.logs.append(lg)
        kw.setdefault("hole_wait", HOLE_WAIT)
        rt = Runtime(lg, checkpoints=RadosCheckpoints.for_log(lg) if checkpoints else None, **kw)
        self.runtimes.append(rt)
        return rt

    def close(self) -> None:
        for rt in self.runtimes:
            rt.close()
        for lg in self.logs:
            lg.close()
