"""Admin APIs over a broker's own logs: DeleteRecords (21).

DeleteRecords is served by each partition's leader, as Kafka's ReplicaManager.deleteRecords: the
leader moves its log start offset (the whole segments below it go at the next retention pass), the
followers learn it from their fetch answers' ``log_start_offset`` and move theirs. The new log start
offsets are in ``log-start-offset-checkpoint`` before the answer leaves, so a restart keeps them.
"""
from __future__ import annotations

from ...log.errors import OffsetOutOfRange
from ...protocol.errors import Errors
from ...topics import INTERNAL_TOPICS

# DeleteRecords' offset -1: up to the high watermark.
HIGH_WATERMARK = -1


def _delete_on_leader(broker, name: str, index: int, offset: int) -> tuple[int, int]:
    """(error code, low watermark) of one partition, in Kafka's order of checks."""
    if broker.metadata.partition(name, index) is None:
        return Errors.UNKNOWN_TOPIC_OR_PARTITION, -1
    if name in INTERNAL_TOPICS:
        return Errors.INVALID_TOPIC_EXCEPTION, -1
    p, err = broker.replica_manager.fetch_partition((name, index))
    if err:
        return err, -1
    lg = p.log
    if "delete" not in lg.config.cleanup_policy:
        return Errors.POLICY_VIOLATION, -1
    if offset == HIGH_WATERMARK:
        offset = lg.high_watermark
    if offset < 0:
        return Errors.OFFSET_OUT_OF_RANGE, -1
    try:
        return Errors.NONE, lg.delete_records(offset)
    except OffsetOutOfRange:
        return Errors.OFFSET_OUT_OF_RANGE, -1


async def delete_records(broker, conn, header, body):
    topics = []
    moved = False
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            code, low = _delete_on_leader(broker, t["name"], p["partition_index"], p["offset"])
            moved = moved or code == Errors.NONE
            parts.append({"partition_index": p["partition_index"], "low_watermark": low, "error_code": int(code)})
        topics.append({"name": t["name"], "partitions": parts})
    if moved:
        # Durable before the client hears of it (the periodic checkpoint alone could lose it to a crash).
        await broker._checkpoint()
    return {"throttle_time_ms": 0, "topics": topics}
