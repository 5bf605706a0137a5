"""Replication data plane (Kafka's ReplicaManager role, ZooKeeper mode).

    partition.py - Partition: leader epoch, ISR, replicas, follower progress, high watermark rules
    delayed.py   - DelayedProduce: acks=all requests waiting for the high watermark
    fetcher.py   - ReplicaFetcher: one task per source broker, follower fetch and epoch truncation
    manager.py   - ReplicaManager: the entry points of Produce/Fetch handlers and the group
                   coordinator, become_leader / become_follower / stop_replica, ISR changes

Storage (kbroker.log) knows nothing of this package; this package reaches ZooKeeper only through
kbroker.zk's fenced writes, on worker threads.
"""
from .manager import LeaderAndIsrState, PartitionResult, ReplicaManager
from .partition import Partition

__all__ = ["LeaderAndIsrState", "Partition", "PartitionResult", "ReplicaManager"]
