"""FindCoordinator (v0-2): which broker coordinates a consumer group.

As in Kafka, the coordinator of group G is the leader of partition ``abs(javaHash(G)) % 50`` of the
internal topic ``__consumer_offsets`` (partition count ``offsets.topic.num.partitions``), created on
first use; until it has a leader the answer is COORDINATOR_NOT_AVAILABLE and clients retry.

The group APIs themselves (JoinGroup, OffsetCommit, ...) are not implemented yet and are therefore
not advertised. FindCoordinator is advertised anyway because librdkafka < 2.1 (Debian's kcat) only
turns its LZ4 compression on when a broker advertises FindCoordinator: that was its probe for
"broker >= 0.8.2".
"""
from __future__ import annotations

from ...protocol import api
from ...protocol.errors import Errors

OFFSETS_TOPIC = "__consumer_offsets"
GROUP, TRANSACTION = 0, 1


def java_string_hash(s: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions   # Kafka's Utils.abs


def register(broker, handlers):
    api.advertise(10, 0, 2)
    handlers[10] = lambda conn, header, body: find_coordinator(broker, body)


def _answer(code, node=None, message=None):
    return {"throttle_time_ms": 0, "error_code": int(code), "error_message": message,
            "node_id": node.broker_id if node else -1, "host": node.host if node else "",
            "port": node.port if node else -1}


async def find_coordinator(broker, body):
    if body.get("key_type", GROUP) != GROUP:
        return _answer(Errors.COORDINATOR_NOT_AVAILABLE, message="transactions are not implemented")
    md = broker.metadata
    if OFFSETS_TOPIC not in md.topics:
        from .admin import auto_create_topics
        await auto_create_topics(broker, [OFFSETS_TOPIC])
    topic = md.topics.get(OFFSETS_TOPIC)
    if topic is None or not topic.partitions:
        return _answer(Errors.COORDINATOR_NOT_AVAILABLE, message=f"{OFFSETS_TOPIC} is not available yet")
    leader = topic.partitions[partition_for(body["key"], len(topic.partitions))].leader
    node = md.brokers.get(leader)
    if node is None:
        return _answer(Errors.COORDINATOR_NOT_AVAILABLE, message="the coordinator's broker is not live")
    return _answer(Errors.NONE, node)
