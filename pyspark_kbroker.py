"""Spark 4 registers the ``DefaultSource`` of every installed top-level module named
``pyspark_<name>``: this makes ``format("kbroker")`` work without a register() call."""
from kbroker.spark.source import KBrokerDataSource as DefaultSource

__all__ = ["DefaultSource"]
