"""kbroker's own Kafka client (asyncio): used by the CLI, replication, Spark and perf tools.

    cluster = Cluster("127.0.0.1:9092")              # bootstrap, metadata, version negotiation
    async with Producer("127.0.0.1:9092", acks=-1, enable_idempotence=True) as p:
        md = await p.send_and_wait("t", b"value", key=b"key")
    async with Consumer("127.0.0.1:9092") as c:
        result = await c.fetch("t", 0, offset=0)
    async with Admin("127.0.0.1:9092") as a:
        await a.create_topics([NewTopic("t", 3, 1)])
"""
from .admin import Admin, ConfigResource, NewTopic, TopicDescription
from .cluster import Cluster
from .connection import BrokerConnection, KafkaConnectionError, KafkaError, RequestTimedOut, UnsupportedVersion
from .consumer import AbortedFilter, Consumer, FetchResult, Record
from .partitioner import StickyPartitioner, murmur2, partition_for_key
from .producer import Producer, RecordMetadata

__all__ = [
    "AbortedFilter", "Admin", "BrokerConnection", "Cluster", "ConfigResource", "Consumer", "FetchResult", "KafkaConnectionError",
    "KafkaError", "NewTopic", "Producer", "Record", "RecordMetadata", "RequestTimedOut", "StickyPartitioner",
    "TopicDescription", "UnsupportedVersion", "murmur2", "partition_for_key",
]
