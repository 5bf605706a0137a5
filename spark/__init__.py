"""kbroker for Apache Spark: the ``kbroker`` PySpark data source (Spark's Kafka source and sink,
Arrow-native) and the jobs ``throughput`` and ``bulk_load``. See spark/README.md.

Importing this package does not import pyspark; ``register(spark)`` and the ``source`` module do.
"""
from __future__ import annotations

import os
import sys


def ensure_python_env() -> None:
    """Make Spark's Python workers run this interpreter (PYSPARK_PYTHON), so executors have the
    same packages (pyarrow, kbroker) as the driver, unless the user chose one already."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def register(spark) -> None:
    """Register the ``kbroker`` format on a SparkSession (auto-registration does this when kbroker
    is installed as a regular package)."""
    from .source import KBrokerDataSource
    spark.dataSource.register(KBrokerDataSource)


__all__ = ["ensure_python_env", "register"]
