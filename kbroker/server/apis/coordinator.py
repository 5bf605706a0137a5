"""FindCoordinator (v0-6): which broker coordinates a consumer group (key_type 0) or a transactional id
(key_type 1); v4+ asks for several keys at once and gets one answer per key.

As in Kafka, the coordinator of group G is the leader of partition ``abs(javaHash(G)) % 50`` of the
internal topic ``__consumer_offsets`` (partition count ``offsets.topic.num.partitions``), and that of
transactional id T the leader of ``abs(javaHash(T)) % 50`` of ``__transaction_state``
(``transaction.state.log.num.partitions``); each topic is created on first use; until it has a leader the
answer is COORDINATOR_NOT_AVAILABLE and clients retry.

The group APIs themselves (JoinGroup, OffsetCommit, ...) live in ``groups.py`` on top of ``kbroker.coordinator``. (FindCoordinator must be advertised in any case:
librdkafka < 2.1, Debian's kcat, only turns LZ4 on when a broker advertises it.)
"""
from __future__ import annotations

from ...coordinator.group_coordinator import java_string_hash, partition_for  # noqa: F401  (re-exported)
from ...protocol.errors import Errors
from . import authz
from ...topics import GROUP_METADATA_TOPIC as OFFSETS_TOPIC
from ...topics import TRANSACTION_STATE_TOPIC

GROUP, TRANSACTION = 0, 1


def _answer(code, node=None, message=None, addr=None):
    """``addr``: the node's (host, port) on the listener the request came in on."""
    return {"error_code": int(code), "error_message": message,
            "node_id": node.broker_id if node else -1, "host": addr[0] if node else "",
            "port": addr[1] if node else -1}


async def find_coordinator(broker, conn, header, body):
    key_type = body.get("key_type", GROUP)
    if header.api_version >= 4:
        coordinators = []
        for key in body["coordinator_keys"]:
            coordinators.append({"key": key, **(_refused(broker, conn, key_type, key) or
                                                await _find(broker, key_type, key, conn.listener_name))})
        return {"throttle_time_ms": 0, "coordinators": coordinators}
    key = body["key"]
    return {"throttle_time_ms": 0, **(_refused(broker, conn, key_type, key) or
                                      await _find(broker, key_type, key, conn.listener_name))}


def _refused(broker, conn, key_type, key) -> dict | None:
    """Describe on the group (GROUP_AUTHORIZATION_FAILED) or transactional id
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) missing: that answer; None when allowed."""
    if key_type == GROUP:
        if not authz.allowed(broker, conn, authz.DESCRIBE, authz.GROUP, key):
            return _answer(Errors.GROUP_AUTHORIZATION_FAILED)
    elif key_type == TRANSACTION:
        if not authz.allowed(broker, conn, authz.DESCRIBE, authz.TRANSACTIONAL_ID, key):
            return _answer(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    return None


async def _find(broker, key_type, key, listener) -> dict:
    if key_type == GROUP:
        internal = OFFSETS_TOPIC
    elif key_type == TRANSACTION:
        if not key:
            return _answer(Errors.INVALID_REQUEST, message="an empty transactional id has no coordinator")
        internal = TRANSACTION_STATE_TOPIC
    else:
        return _answer(Errors.INVALID_REQUEST, message=f"unknown coordinator key type {key_type}")
    md = broker.metadata
    if internal not in md.topics:
        from .admin import auto_create_topics
        await auto_create_topics(broker, [internal])
    topic = md.topics.get(internal)
    if topic is None or not topic.partitions:
        return _answer(Errors.COORDINATOR_NOT_AVAILABLE, message=f"{internal} is not available yet")
    leader = topic.partitions[partition_for(key, len(topic.partitions))].leader
    node = md.brokers.get(leader)
    addr = node.address(listener) if node is not None else None
    if addr is None:
        return _answer(Errors.COORDINATOR_NOT_AVAILABLE, message="the coordinator's broker is not live "
                                                                 f"or has no {listener} listener")
    return _answer(Errors.NONE, node, addr=addr)
