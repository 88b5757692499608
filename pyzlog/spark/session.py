"""A local SparkSession for tests, examples and benchmarks, with "zlog" registered."""
from __future__ import annotations

import os
import sys
from typing import Any


def local_session(master: str = "local[2]", app: str = "pyzlog", **conf: str) -> Any:
    """Python workers run this interpreter (a pyzlog checkout in their working
    directory is fine: its compiled parts come from the installed copy)."""
    from pyspark.sql import SparkSession

    from . import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode talks over loopback only
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.ui.showConsoleProgress", "false"))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
