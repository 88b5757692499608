"""What a write stored, reported in the driver process.

A write's commit runs in a Python worker that Spark starts, not in the
user's driver process. pyzlog.spark.register() gives the registered source a
Spark accumulator; each commit (and abort) adds a WriteReport to it, and Spark
merges accumulator updates into the driver before save() returns, or before a
micro-batch counts as done. register() returns a ZlogWrites that reads them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pyspark.accumulators import AccumulatorParam

logger = logging.getLogger("pyzlog.spark")

#: reports a driver keeps (the newest ones); a long stream adds one per micro-batch
KEEP_REPORTS = 1000


@dataclass(frozen=True)
class WriteReport:
    """One batch write, or one micro-batch of a streaming write, to `log`."""
    log: str
    batch_id: int | None  # the micro-batch of a streaming write; None for a batch write
    count: int  # entries appended
    first: int | None  # lowest position appended (None if nothing was)
    last: int | None  # highest position appended
    ranges: tuple[tuple[int, int], ...]  # exactly the positions appended, as inclusive runs
    tasks: int  # tasks that committed
    committed: bool = True  # False: the write was aborted, and these entries stay in the log

    def __str__(self) -> str:
        what = "stream write" if self.batch_id is not None else "write"
        batch = f" batch {self.batch_id}" if self.batch_id is not None else ""
        state = "" if self.committed else " (aborted; they stay in the log)"
        where = f"positions {self.first}..{self.last}" if self.count else "nothing"
        return f"zlog {what} to {self.log!r}{batch}: {self.count} entries at {where}{state}"


class ReportsParam(AccumulatorParam):  # type: ignore[type-arg]
    """Accumulates WriteReports in commit order, keeping the newest."""

    def __init__(self) -> None:
        self.in_driver = False

    def __getstate__(self) -> dict[str, Any]:
        return {"in_driver": False}  # only the driver's copy logs arrivals

    def zero(self, value: list[WriteReport]) -> list[WriteReport]:
        return []

    def addInPlace(self, value1: list[WriteReport], value2: list[WriteReport]) -> list[WriteReport]:
        if self.in_driver:
            for report in value2:
                (logger.info if report.committed else logger.warning)("%s", report)
        return (value1 + value2)[-KEEP_REPORTS:]


class ZlogWrites:
    """The driver's view of what zlog writes stored (from pyzlog.spark.register)."""

    def __init__(self, accumulator: Any) -> None:
        self._accumulator = accumulator

    @property
    def reports(self) -> list[WriteReport]:
        """Every write's report in commit order (the newest KEEP_REPORTS)."""
        return list(self._accumulator.value)

    @property
    def last(self) -> WriteReport | None:
        reports = self.reports
        return reports[-1] if reports else None

    def for_log(self, log: str) -> list[WriteReport]:
        return [r for r in self.reports if r.log == log]


def new_reports(spark: Any) -> tuple[Any, ZlogWrites] | None:
    """An accumulator of WriteReports in this driver, or None where Spark has
    no accumulators (Spark Connect)."""
    try:
        sc = spark.sparkContext
    except Exception:
        return None
    param = ReportsParam()
    param.in_driver = True
    acc = sc.accumulator([], param)
    return acc, ZlogWrites(acc)
