"""kbroker: a Kafka-compatible broker (ZooKeeper mode) with a Python control plane and a Cython data path."""

__version__ = "0.1.0"
