"""The broker: wiring of network, protocol handlers, storage and ZooKeeper (see broker.py)."""
