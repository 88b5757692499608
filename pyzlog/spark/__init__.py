"""PySpark connector: spark.read/readStream/write/writeStream .format("zlog").

    from pyzlog.spark import ZlogDataSource
    spark.dataSource.register(ZlogDataSource)
    df = spark.read.format("zlog").option("log", "events").load()

Needs the `spark` extra (pyspark, pyarrow); the rest of pyzlog never imports it.
"""
from __future__ import annotations

from typing import Any

from .options import ZlogOptions, parse_options
from .read import ARROW_SCHEMA, SCHEMA_DDL, ZlogDataLoss
from .sink import ZlogCommitMessage, ZlogWriteFailed
from .source import ZlogBatchReader, ZlogDataSource, ZlogStreamReader


def register(spark: Any) -> None:
    """spark.dataSource.register(ZlogDataSource)."""
    spark.dataSource.register(ZlogDataSource)


__all__ = ["ZlogDataSource", "ZlogBatchReader", "ZlogStreamReader", "ZlogOptions", "parse_options",
           "ZlogDataLoss", "ZlogCommitMessage", "ZlogWriteFailed", "SCHEMA_DDL", "ARROW_SCHEMA",
           "register"]
