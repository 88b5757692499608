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

from .connection import opened_log
from .options import EARLIEST, LATEST, ZlogOptions, parse_options
from .plan import plan_partitions, resolve_range
from .read import SCHEMA_DDL, read_partition

logger = logging.getLogger("pyzlog.spark")


class ZlogDataSource(DataSource):
    """spark.read / readStream / write / writeStream .format("zlog")."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = parse_options(options)  # bad options fail here, at load()/save()

    @classmethod
    def name(cls) -> str:
        return "zlog"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return ZlogBatchReader(self.opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ZlogStreamReader(self.opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import ZlogWriter
        return ZlogWriter(self.opts, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import ZlogStreamWriter
        return ZlogStreamWriter(self.opts, schema, overwrite)


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
        return read_partition(self.opts, partition)  # type: ignore[arg-type]


def _offset(position: int) -> dict[str, int]:
    return {"position": int(position)}


def _position(offset: Any, what: str) -> int:
    if isinstance(offset, str):
        offset = json.loads(offset)
    try:
        return int(offset["position"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"zlog: bad {what} offset {offset!r} (expected {{\"position\": N}})") from None


class ZlogStreamReader(DataSourceStreamReader):
    """Micro-batches of [start, end) position ranges. Offsets are {"position": N}:
    the next position to read. The reader lives in one driver process for the
    whole query; it learns where the next batch starts from partitions() and
    commit() (Spark replays the last checkpointed offset into partitions() on
    restart), so maxEntriesPerTrigger can cap latestOffset()."""

    def __init__(self, opts: ZlogOptions) -> None:
        self.opts = opts
        self._next_start: int | None = None

    def initialOffset(self) -> dict[str, int]:
        s = self.opts.starting
        if s == EARLIEST or s == LATEST:
            with opened_log(self.opts) as log:
                pos = log.first_position() if s == EARLIEST else log.tail()
        else:
            pos = int(s)
        if self._next_start is None:
            self._next_start = pos
        return _offset(pos)

    def latestOffset(self) -> dict[str, int]:
        with opened_log(self.opts) as log:
            tail = log.tail()
        if self._next_start is None:
            self.initialOffset()
        start = self._next_start if self._next_start is not None else 0
        end = max(tail, start)
        if self.opts.max_entries_per_trigger is not None:
            end = min(end, start + self.opts.max_entries_per_trigger)
        return _offset(end)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        s, e = _position(start, "start"), _position(end, "end")
        self._next_start = max(self._next_start or 0, e)
        if s >= e:
            return []
        with opened_log(self.opts) as log:
            parts = plan_partitions(log.views, s, e, e, self.opts.min_partitions)
        logger.info("zlog stream of %r: batch [%d, %d) in %d partitions", self.opts.log, s, e, len(parts))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)  # type: ignore[arg-type]

    def commit(self, end: dict[str, int]) -> None:
        # Nothing to release: a log keeps its entries until someone trims it.
        self._next_start = max(self._next_start or 0, _position(end, "commit"))
