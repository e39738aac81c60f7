"""A SparkSession for txnstream: local by default, any cluster by ``master``.

The settings are the ones this project measured as right for small local
jobs: the UI and console progress bars off, 2 shuffle partitions, the
loopback address, and the Python workers running this interpreter (whose
environment has txnstream installed, which every worker imports).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

__all__ = ["DEFAULT_CONF", "DEFAULT_MASTER", "register", "session"]

DEFAULT_MASTER = "local[2]"

#: Settings applied unless ``conf`` overrides them.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
}


def register(spark: SparkSession) -> SparkSession:
    """Register txnstream's data sources and SQL functions with ``spark`` (per session)."""
    from txnstream.spark.log_source import TxnLogDataSource
    from txnstream.spark.topic_source import TopicDataSource
    from txnstream.spark.udfs import register_udfs

    spark.dataSource.register(TxnLogDataSource)
    spark.dataSource.register(TopicDataSource)
    register_udfs(spark)
    return spark


def session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "txnstream",
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """Return a SparkSession (an existing one is reused) with txnstream registered.

    ``master`` is any Spark master URL (``local[2]`` by default, ``spark://…``,
    ``yarn``…); on a cluster every worker needs txnstream installed. ``conf``
    entries override :data:`DEFAULT_CONF`.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return register(spark)
