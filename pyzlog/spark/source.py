"""The "zlog" data source: batch and streaming readers (writers in sink.py)."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter, InputPartition)
from pyspark.sql.types import StructType

from ..core.layout import per_object_counts, view_end
from ..core.wire import View
from .connection import opened_log
from .options import EARLIEST, LATEST, ZlogOptions, parse_options
from .plan import plan_partitions, resolve_range
from .read import SCHEMA, SCHEMA_DDL, read_partition

logger = logging.getLogger("pyzlog.spark")

try:  # Spark 4.2+: read limits, Trigger.AvailableNow and the real tail for Python sources
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
    READ_LIMITS = True
except ImportError:  # 4.0 / 4.1: latestOffset() gets no arguments and the 4.2 methods are never called
    READ_LIMITS = False
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]


def _differs(schema: StructType) -> bool:
    """Not the connector's schema (names and types; nullability is not checked)."""
    return [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in SCHEMA.fields]


def _fixed_schema_error(schema: StructType, where: str) -> ValueError:
    return ValueError(f"zlog {where}: the schema given with .schema(...) is {schema.simpleString()}, "
                      f"but a zlog source has the fixed schema {SCHEMA.simpleString()} "
                      f"({SCHEMA_DDL}); drop .schema(...) and select or cast columns after load()")


def check_read_schema(schema: StructType, where: str) -> None:
    """Spark does not call a Python source at load() when .schema(...) is
    given, so the first action (or a stream's start) is where it is refused."""
    if _differs(schema):
        raise _fixed_schema_error(schema, where)


class ZlogDataSource(DataSource):
    """spark.read / readStream / write / writeStream .format("zlog")."""

    #: driver-side write reports (a Spark accumulator), set by pyzlog.spark.register()
    _reports: Any = None

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = parse_options(options)  # bad options fail here, at load()/save()/start()

    @classmethod
    def name(cls) -> str:
        return "zlog"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        check_read_schema(schema, "read")
        return ZlogBatchReader(self.opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_read_schema(schema, "readStream")
        return ZlogStreamReader(self.opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import ZlogWriter
        return ZlogWriter(self.opts, schema, overwrite, self._reports)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import ZlogStreamWriter
        return ZlogStreamWriter(self.opts, schema, overwrite, self._reports)


class ZlogBatchReader(DataSourceReader):
    """Holds only the parsed options; partitions() plans on the driver, read()
    opens its own connection on the executor."""

    def __init__(self, opts: ZlogOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with opened_log(self.opts) as log:
            start, end, tail = resolve_range(log, self.opts.starting, self.opts.ending)
            parts = plan_partitions(log.views, start, end, tail, self.opts.min_partitions)
        logger.info("zlog read of %r: [%d, %d) in %d partitions", self.opts.log, start, end, len(parts))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)


class ZlogBadOffset(ValueError):
    """An offset Spark handed back (from the query's checkpoint) that is not a zlog offset."""


def _offset(position: int) -> dict[str, int]:
    return {"position": int(position)}


def _position(offset: Any, what: str, log: str) -> int:
    """N of {"position": N}. Spark replays offsets from the checkpoint's
    offsets/ and commits/ logs; anything else there fails naming it."""
    raw = offset
    try:
        if isinstance(offset, str):
            offset = json.loads(offset)
        value = offset["position"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError
        return value
    except (KeyError, TypeError, ValueError):  # JSONDecodeError is a ValueError
        raise ZlogBadOffset(
            f"zlog stream of log {log!r}: bad {what} offset {raw!r} in the query's checkpoint "
            "(checkpointLocation, offsets/ and commits/): expected {\"position\": N} with N a "
            "non-negative integer. Was the checkpoint written for another source, or edited? "
            "Restart the query with a new checkpointLocation and startingPosition") from None


def behind_latest(views: tuple[View, ...], end: int, tail: int) -> dict[str, float | int]:
    """How far a stream that has read up to `end` is behind `tail`: the whole
    log, and min/avg/max over the data objects (of the views that hold
    [end, tail), or the newest view's when caught up), like Kafka's
    min/avg/maxOffsetsBehindLatest over a topic's partitions."""
    per_object: list[int] = []
    for v in views:
        ve = view_end(views, v)
        s, e = max(end, v.start), tail if ve is None else min(tail, ve)
        if s < e:
            per_object += per_object_counts(v, s, e)
    if not per_object:
        per_object = [0] * views[-1].width
    return {"entriesBehindLatest": max(tail - end, 0),
            "minEntriesBehindLatest": min(per_object),
            "avgEntriesBehindLatest": round(sum(per_object) / len(per_object), 2),
            "maxEntriesBehindLatest": max(per_object)}


class ZlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of [start, end) position ranges. Offsets are {"position": N}:
    the next position to read.

    On Spark 4.2+ Spark passes the start and a read limit to latestOffset()
    (maxEntriesPerTrigger is the default limit), asks for the real tail with
    reportLatestOffset(), and runs Trigger.AvailableNow through
    prepareForTriggerAvailableNow(). On 4.0/4.1 latestOffset() gets no
    arguments: the reader, which lives in one driver process for the whole
    query, learns where the next batch starts from partitions() and commit()
    (Spark replays the last checkpointed offset into partitions() on restart)."""

    def __init__(self, opts: ZlogOptions) -> None:
        self.opts = opts
        self._next_start: int | None = None
        self._available_now_end: int | None = None  # Trigger.AvailableNow: the tail at its start
        self._reported: dict[str, Any] | None = None

    def _bounded_tail(self) -> tuple[int, int, tuple[View, ...]]:
        """(tail now, the end a batch may reach, views): endingPosition and an
        AvailableNow target bound what the stream reads."""
        with opened_log(self.opts) as log:
            tail = log.tail()
            views = log.views
        end = tail
        if self.opts.ending != LATEST:
            end = min(end, int(self.opts.ending))
        if self._available_now_end is not None:
            end = min(end, self._available_now_end)
        return tail, end, views

    def initialOffset(self) -> dict[str, int]:
        s = self.opts.starting
        if s == EARLIEST or s == LATEST:
            with opened_log(self.opts) as log:
                pos = log.first_position() if s == EARLIEST else log.tail()
        else:
            pos = int(s)
        if self.opts.ending != LATEST:
            pos = min(pos, int(self.opts.ending))
        if self._next_start is None:
            self._next_start = pos
        return _offset(pos)

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_entries_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_entries_per_trigger)

    def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
        # A signature with parameters is how Spark 4.2+ sees that this source
        # takes read limits; 4.0/4.1 call it with none.
        tail, bound, views = self._bounded_tail()
        if start is None:
            if self._next_start is None:
                self.initialOffset()
            first = self._next_start if self._next_start is not None else 0
            cap = self.opts.max_entries_per_trigger
        else:
            first = _position(start, "start", self.opts.log)
            cap = self._cap(limit)
        end = max(bound, first)
        if cap is not None:
            end = min(end, first + cap)
        self._reported = {"position": tail, **behind_latest(views, end, tail)}
        return _offset(end)

    def _cap(self, limit: Any) -> int | None:
        if limit is None or isinstance(limit, ReadAllAvailable):
            return None
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows)
        raise ValueError(f"zlog stream of log {self.opts.log!r}: read limit {limit!r} is not "
                         "supported (only a maximum of entries per trigger: maxEntriesPerTrigger)")

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The real tail, with how far the batch just planned leaves the stream
        behind it. Spark shows this as the source's latestOffset in progress."""
        return self._reported

    def prepareForTriggerAvailableNow(self) -> None:
        with opened_log(self.opts) as log:
            self._available_now_end = log.tail()
        logger.info("zlog stream of %r: Trigger.AvailableNow reads up to position %d",
                    self.opts.log, self._available_now_end)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        s, e = _position(start, "start", self.opts.log), _position(end, "end", self.opts.log)
        self._next_start = max(self._next_start or 0, e)
        if s >= e:
            return []
        with opened_log(self.opts) as log:
            parts = plan_partitions(log.views, s, e, e, self.opts.min_partitions)
        logger.info("zlog stream of %r: batch [%d, %d) in %d partitions", self.opts.log, s, e, len(parts))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        # Nothing to release: a log keeps its entries until someone trims it.
        self._next_start = max(self._next_start or 0, _position(end, "commit", self.opts.log))

