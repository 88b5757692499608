"""PySpark connector: spark.read/readStream/write/writeStream .format("zlog").

    from pyzlog.spark import register
    writes = register(spark)          # the "zlog" source, and what writes stored
    df = spark.read.format("zlog").option("log", "events").load()

Needs the `spark` extra (pyspark >= 4.0, pyarrow); the rest of pyzlog never imports it.
"""
from __future__ import annotations

from typing import Any

from .options import ZlogOptions, parse_options
from .plan import ZlogPartition
from .read import ARROW_SCHEMA, SCHEMA_DDL, ZlogDataLoss
from .report import WriteReport, ZlogWrites
from .sink import ZlogCommitMessage, ZlogWriteFailed
from .source import READ_LIMITS, ZlogBadOffset, ZlogBatchReader, ZlogDataSource, ZlogStreamReader


def register(spark: Any) -> ZlogWrites | None:
    """Register the "zlog" data source with `spark` and return the driver's
    ZlogWrites: a WriteReport for every write's commit (count and positions),
    readable here in the driver once save() returns or a micro-batch is done.

    The registered class is a subclass carrying a Spark accumulator, which
    Spark pickles with it to the workers that commit writes. Returns None
    (reads and writes still work) where Spark has no accumulators."""
    from .report import new_reports

    made = new_reports(spark)
    if made is None:
        spark.dataSource.register(ZlogDataSource)
        return None
    accumulator, writes = made
    # A class made here is pickled by value, so the accumulator travels with it.
    source = type("ZlogDataSource", (ZlogDataSource,), {"_reports": accumulator,
                                                        "__module__": __name__})
    spark.dataSource.register(source)
    return writes


__all__ = ["ZlogDataSource", "ZlogBatchReader", "ZlogStreamReader", "ZlogOptions", "parse_options",
           "ZlogPartition", "ZlogDataLoss", "ZlogBadOffset", "ZlogCommitMessage", "ZlogWriteFailed",
           "WriteReport", "ZlogWrites", "SCHEMA_DDL", "ARROW_SCHEMA", "READ_LIMITS", "register"]
