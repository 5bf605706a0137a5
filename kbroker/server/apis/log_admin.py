"""Admin APIs over a broker's own logs: DeleteRecords (21), AlterReplicaLogDirs (34), DescribeLogDirs (35).

DeleteRecords is served by each partition's leader, as Kafka's ReplicaManager.deleteRecords: the
leader moves its log start offset (the whole segments below it go at the next retention pass), the
followers learn it from their fetch answers' ``log_start_offset`` and move theirs. The new log start
offsets are in ``log-start-offset-checkpoint`` before the answer leaves, so a restart keeps them. As
Kafka's DelayedDeleteRecords, a partition with in-sync followers is answered once every one of them
reports a log start at the new offset (its low watermark), or REQUEST_TIMED_OUT after ``timeout_ms``.

DescribeLogDirs answers for this broker's own log dirs, as Kafka's ReplicaManager.describeLogDirs:
per dir its partitions (all, or those asked for) with their size in bytes and offset lag
(max(high watermark - log end, 0)), and from v4 the file system's total and usable bytes. An offline
(failed) dir is answered KAFKA_STORAGE_ERROR with no partitions, as Kafka. A replica being moved is
listed twice: in its current dir, and in the target dir with ``is_future_key`` and as offset lag how far
the future is behind the current log's end (Kafka's getLogEndOffsetLag for a future).

AlterReplicaLogDirs moves this broker's replicas between its log dirs (LogManager.alter_dir), in
Kafka's order of checks per partition: ALTER on the cluster, the path one of ``log.dirs``
(LOG_DIR_NOT_FOUND), the dir online (KAFKA_STORAGE_ERROR), the partition known (UNKNOWN_TOPIC_OR_PARTITION),
its replica here (else REPLICA_NOT_AVAILABLE, and the dir is remembered for when the replica is created:
kafka-reassign-partitions sends the request before the new replica exists and retries on that code).
The answer comes when the move has started; DescribeLogDirs shows its progress.
"""
from __future__ import annotations

import asyncio
import os

from ...log.errors import OffsetOutOfRange
from ...protocol.errors import Errors
from . import authz
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
    moved = []                 # (answer row, tp, new log start) of the partitions whose log start moved
    refused = authz.refused(broker, conn, authz.DELETE, authz.TOPIC, [t["name"] for t in body["topics"]])
    for t in body["topics"]:
        parts = []
        for p in t["partitions"]:
            if t["name"] in refused:
                parts.append({"partition_index": p["partition_index"], "low_watermark": -1,
                              "error_code": int(Errors.TOPIC_AUTHORIZATION_FAILED)})
                continue
            code, low = _delete_on_leader(broker, t["name"], p["partition_index"], p["offset"])
            row = {"partition_index": p["partition_index"], "low_watermark": low, "error_code": int(code)}
            if code == Errors.NONE:
                moved.append((row, (t["name"], p["partition_index"]), low))
            parts.append(row)
        topics.append({"name": t["name"], "partitions": parts})
    if moved:
        # Durable before the client hears of it (the periodic checkpoint alone could lose it to a crash).
        await broker._checkpoint()
        rm = broker.replica_manager
        waits = []
        for row, tp, low in moved:
            p = rm.partitions.get(tp)
            if p is not None and len(p.isr) > 1:
                waits.append((row, rm.wait_deleted(p, low, body["timeout_ms"])))
        for row, (code, low) in zip([r for r, _ in waits], await asyncio.gather(*(w for _, w in waits))):
            row["error_code"], row["low_watermark"] = int(code), low if code == Errors.NONE else -1
    return {"throttle_time_ms": 0, "topics": topics}


def _alter_dir(broker, tp, path: str) -> int:
    logs = broker.logs
    d = os.path.abspath(path)
    if d not in logs.log_dirs:
        return Errors.LOG_DIR_NOT_FOUND
    if d in logs.offline_dirs:
        return Errors.KAFKA_STORAGE_ERROR
    if broker.metadata.partition(*tp) is None and logs.get(tp) is None:
        return Errors.UNKNOWN_TOPIC_OR_PARTITION
    if logs.in_offline_dir(tp):
        return Errors.KAFKA_STORAGE_ERROR
    try:
        logs.alter_dir(tp, d)
    except KeyError:
        return Errors.REPLICA_NOT_AVAILABLE
    except OSError:
        return Errors.KAFKA_STORAGE_ERROR
    return Errors.NONE


def alter_replica_log_dirs(broker, conn, header, body):
    allowed = authz.cluster(broker, conn, authz.ALTER)
    results: dict[str, list] = {}
    for entry in body["dirs"]:
        for t in entry["topics"]:
            for index in t["partitions"]:
                code = _alter_dir(broker, (t["name"], index), entry["path"]) if allowed \
                    else Errors.CLUSTER_AUTHORIZATION_FAILED
                results.setdefault(t["name"], []).append({"partition_index": index, "error_code": int(code)})
    return {"throttle_time_ms": 0,
            "results": [{"topic_name": n, "partitions": ps} for n, ps in results.items()]}


def _disk_bytes(path: str) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def describe_log_dirs(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.DESCRIBE):
        # Kafka: no directories, and from v3 the error at the top
        return {"throttle_time_ms": 0, "results": [],
                "error_code": int(Errors.CLUSTER_AUTHORIZATION_FAILED) if header.api_version >= 3 else 0}
    asked = body["topics"]
    wanted = None if asked is None else {(t["topic"], p) for t in asked for p in t["partitions"]}
    by_dir: dict[str, dict[str, list]] = {d: {} for d in broker.logs.log_dirs}
    for tp, lg in sorted(broker.logs.logs.items()):
        if wanted is not None and tp not in wanted:
            continue
        d = os.path.dirname(lg.dir)
        by_dir.setdefault(d, {}).setdefault(tp[0], []).append({
            "partition_index": tp[1], "partition_size": lg.size_bytes,
            "offset_lag": max(lg.high_watermark - lg.log_end_offset, 0), "is_future_key": False})
    for tp, fut in sorted(broker.logs.futures.items()):
        cur = broker.logs.get(tp)
        if (wanted is not None and tp not in wanted) or cur is None:
            continue
        by_dir.setdefault(os.path.dirname(fut.dir), {}).setdefault(tp[0], []).append({
            "partition_index": tp[1], "partition_size": fut.size_bytes,
            "offset_lag": max(cur.log_end_offset - fut.log_end_offset, 0), "is_future_key": True})
    results = []
    for d, topics in by_dir.items():
        res = {"error_code": 0, "log_dir": d, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
               "total_bytes": -1, "usable_bytes": -1}
        try:
            if d in broker.logs.offline_dirs:
                raise OSError(broker.logs.offline_dirs[d])
            res["total_bytes"], res["usable_bytes"] = _disk_bytes(d)
        except OSError:
            res["error_code"], res["topics"] = int(Errors.KAFKA_STORAGE_ERROR), []
        results.append(res)
    return {"throttle_time_ms": 0, "error_code": 0, "results": results}
