"""ApiVersions and Metadata (with topic auto-creation)."""
from __future__ import annotations

import asyncio
import logging

from ...network.connection import EncodeOffLoop
from ...protocol import api
from ...protocol.errors import Errors
from ..metadata import topic_name_error
from . import authz
from ...topics import INTERNAL_TOPICS

log = logging.getLogger(__name__)

# A Metadata answer is built this many topics per event-loop turn: a request naming 100,000 topics
# must not hold the loop (and every other client) for the whole answer.
TOPICS_PER_TURN = 2000
AUTO_CREATE_WAIT_S = 5.0
# A Metadata request that arrives before the controller's first UpdateMetadata waits for it this long.
# Answered at once, it would name no controller and only this broker, and clients that need the
# controller (librdkafka's admin) would wait out their whole operation timeout instead of asking again.
# Kafka avoids the window by not processing client requests until its startup completes.
STARTUP_METADATA_WAIT_S = 5.0


def _log_failed_creation(task):
    if not task.cancelled() and task.exception() is not None:
        log.error("auto-creating topics failed: %r", task.exception())


def api_versions(broker, conn, header, body):
    return {
        "error_code": 0,
        "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                     for k, (lo, hi) in sorted(api.SUPPORTED.items())],
        "throttle_time_ms": 0,
    }


def metadata(broker, conn, header, body):
    if broker.metadata.updates == 0:
        answer = _after_first_update(broker, conn, header, body)
    else:
        answer = _answer(broker, conn, header, body)
    if body.get("include_cluster_authorized_operations") or body.get("include_topic_authorized_operations"):
        return authz.with_metadata_operations(broker, conn, body, answer)
    return answer


def _answer(broker, conn, header, body):
    listener = conn.listener_name       # the brokers' addresses on the listener the request came in on
    requested = body["topics"]
    version = header.api_version
    md = broker.metadata
    if requested is None or (version == 0 and not requested):
        # null (v1+) or empty (v0): all topics, those the client may not Describe left out (Kafka)
        hidden = authz.refused(broker, conn, authz.DESCRIBE, authz.TOPIC, md.topics)
        return _metadata_response(broker, sorted(n for n in md.topics if n not in hidden), listener)
    if version >= 10:
        # Names may be null and ids set only from v12 (Kafka refuses the request before); a request
        # naming any topic id looks topics up by id, unknown ids answered UNKNOWN_TOPIC_ID.
        if any(t["name"] is None or t["topic_id"] != _ZERO_ID for t in requested) and version < 12:
            return _invalid(broker, requested, listener)
        if any(t["topic_id"] != _ZERO_ID for t in requested):
            return _by_id(broker, conn, requested, listener)
    names = [t["name"] for t in requested]
    # A named topic the client may not Describe, or may not create when it is missing and would be
    # auto-created, is answered TOPIC_AUTHORIZATION_FAILED (Kafka).
    refused = authz.refused(broker, conn, authz.DESCRIBE, authz.TOPIC, names)
    missing = [n for n in names if n not in md.topics and n not in refused and topic_name_error(n) is None]
    allow = body.get("allow_auto_topic_creation", True) and broker.config.get("auto.create.topics.enable")
    if missing and allow:
        refused |= {n for n in missing if not authz.may_create_topic(broker, conn, n)}
        missing = [n for n in missing if n not in refused]
    if missing and allow:
        return _auto_create_then_answer(broker, names, missing, refused, listener)
    return _metadata_response(broker, names, listener, refused=refused)


_ZERO_ID = bytes(16)


def _invalid(broker, requested, listener):
    # (an answer's name is nullable only from v12: a null asked for is answered "")
    return _response(broker, [{"error_code": int(Errors.INVALID_REQUEST), "name": t["name"] or "",
                               "topic_id": t["topic_id"], "partitions": []} for t in requested], listener)


def _by_id(broker, conn, requested, listener):
    """Metadata v12 by topic id: known ids answered under their names (no auto-creation: an id names an
    existing topic); ids the client may not Describe TOPIC_AUTHORIZATION_FAILED with a null name (ids
    are not secret, names are); unknown ids UNKNOWN_TOPIC_ID."""
    md = broker.metadata
    ids = list(dict.fromkeys(bytes(t["topic_id"]) for t in requested if t["topic_id"] != _ZERO_ID))
    known = [md.topic_ids[i] for i in ids if i in md.topic_ids]
    refused = authz.refused(broker, conn, authz.DESCRIBE, authz.TOPIC, known)
    topics = [{"error_code": int(Errors.UNKNOWN_TOPIC_ID), "name": None, "topic_id": i, "partitions": []}
              for i in ids if i not in md.topic_ids]
    topics += [_topic(broker, n, ()) for n in known if n not in refused]
    topics += [{"error_code": int(Errors.TOPIC_AUTHORIZATION_FAILED), "name": None,
                "topic_id": md.topics[n].topic_id, "partitions": []} for n in known if n in refused]
    return _response(broker, topics, listener)


async def _after_first_update(broker, conn, header, body):
    # Past the wait (no controller reachable) the client gets what this broker knows: itself.
    await broker.metadata.wait_for(lambda: broker.metadata.updates > 0, STARTUP_METADATA_WAIT_S)
    r = _answer(broker, conn, header, body)
    return (await r) if asyncio.iscoroutine(r) else r


async def _auto_create_then_answer(broker, names, missing, refused, listener):
    from .admin import auto_create_topics
    task = asyncio.ensure_future(auto_create_topics(broker, missing))
    task.add_done_callback(_log_failed_creation)
    try:
        # Creation normally takes milliseconds; when it cannot finish (e.g. the topic is still being
        # deleted) the client gets LEADER_NOT_AVAILABLE and retries, as from Kafka, instead of no answer.
        created = await asyncio.wait_for(asyncio.shield(task), AUTO_CREATE_WAIT_S)
    except asyncio.TimeoutError:
        created = []
    # Kafka answers LEADER_NOT_AVAILABLE for topics it just created; the client retries. We created
    # them synchronously with a leader already in place, so we can answer with the real metadata.
    return await _metadata_response_sliced(broker, names, listener, pending=set(missing) - set(created),
                                           refused=refused)


def _metadata_response(broker, names, listener, pending=(), refused=()):
    if len(names) > TOPICS_PER_TURN:
        return _metadata_response_sliced(broker, names, listener, pending, refused)
    return _response(broker, [_topic(broker, name, pending, refused) for name in names], listener)


async def _metadata_response_sliced(broker, names, listener, pending=(), refused=()):
    topics = []
    for start in range(0, len(names), TOPICS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        topics.extend(_topic(broker, name, pending, refused) for name in names[start:start + TOPICS_PER_TURN])
    body = _response(broker, topics, listener)
    # Built in slices, a huge answer is encoded on the server's heavy thread too, not on the loop.
    return EncodeOffLoop(body) if len(names) > TOPICS_PER_TURN else body


def _topic(broker, name, pending, refused=()):
    if name in refused:
        return {"error_code": Errors.TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []}
    md = broker.metadata
    info = md.topics.get(name)
    if info is None:
        bad = topic_name_error(name)
        code = Errors.INVALID_TOPIC_EXCEPTION if bad else (
            Errors.LEADER_NOT_AVAILABLE if name in pending else Errors.UNKNOWN_TOPIC_OR_PARTITION)
        return {"error_code": code, "name": name, "partitions": []}
    parts = []
    for p in sorted(info.partitions):
        pi = info.partitions[p]
        live = pi.leader in md.brokers
        parts.append({
            "error_code": 0 if live else Errors.LEADER_NOT_AVAILABLE,
            "partition_index": p,
            "leader_id": pi.leader if live else -1,
            "leader_epoch": pi.leader_epoch,
            "replica_nodes": pi.replicas,
            "isr_nodes": pi.isr,
            "offline_replicas": [r for r in pi.replicas if r not in md.brokers],
        })
    return {"error_code": 0, "name": name, "topic_id": info.topic_id, "is_internal": name in INTERNAL_TOPICS,
            "partitions": parts}


def _response(broker, topics, listener=None):
    md = broker.metadata
    brokers = [{"node_id": b.broker_id, "host": host, "port": port, "rack": b.rack}
               for b, host, port in md.listener_brokers(listener)]
    return {
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": broker.cluster_id,
        "controller_id": md.controller_id,
        "topics": topics,
    }
