"""Group APIs: thin handlers that decode the request shape of each version and call the
GroupCoordinator (``kbroker.coordinator``). JoinGroup and SyncGroup return coroutines that complete
when the rebalance does (long polls).

Advertised versions are the non-flexible ranges every client we test negotiates (kafka-python 3.0,
aiokafka 0.14, confluent-kafka/librdkafka 2.16, kcat/librdkafka 2.0); see kafka-protocol-facts §1.2.
"""
from __future__ import annotations

from ...coordinator.manager import GroupCoordinator
from ...protocol import api
from ...protocol.errors import Errors

VERSIONS = {
    8: (2, 7),    # OffsetCommit
    9: (1, 5),    # OffsetFetch
    11: (0, 5),   # JoinGroup
    12: (0, 3),   # Heartbeat
    13: (0, 3),   # LeaveGroup
    14: (0, 3),   # SyncGroup
    15: (0, 4),   # DescribeGroups
    16: (0, 2),   # ListGroups
    42: (0, 1),   # DeleteGroups
    47: (0, 0),   # OffsetDelete
}


def register(broker, handlers):
    gc = broker.group_coordinator = GroupCoordinator(broker)
    for key, (lo, hi) in VERSIONS.items():
        api.advertise(key, lo, hi)
    handlers[11] = lambda conn, header, body: join_group(gc, conn, header, body)
    handlers[14] = lambda conn, header, body: sync_group(gc, body)
    handlers[12] = lambda conn, header, body: {"throttle_time_ms": 0, "error_code": gc.heartbeat(body)}
    handlers[13] = lambda conn, header, body: leave_group(gc, header, body)
    handlers[8] = lambda conn, header, body: offset_commit(gc, header, body)
    handlers[9] = lambda conn, header, body: offset_fetch(gc, header, body)
    handlers[15] = lambda conn, header, body: describe_groups(gc, body)
    handlers[16] = lambda conn, header, body: list_groups(gc, body)
    handlers[42] = lambda conn, header, body: delete_groups(gc, body)
    handlers[47] = lambda conn, header, body: offset_delete(gc, body)


def _host(conn) -> str:
    peer = getattr(conn, "peer", None)
    return f"/{peer[0]}" if peer else ""


async def join_group(gc, conn, header, body):
    r = await gc.join_group(body, header.api_version, header.client_id or "", _host(conn))
    if header.api_version < 7 and r["protocol_name"] is None:
        r = dict(r, protocol_name="")   # nullable only from v7
    return r


async def sync_group(gc, body):
    return await gc.sync_group(body)


def leave_group(gc, header, body):
    if header.api_version < 3:
        leaving = [(body["member_id"], None)]
    else:
        leaving = [(m["member_id"], m.get("group_instance_id")) for m in body["members"]]
    err, codes = gc.leave_group(body["group_id"], leaving)
    if header.api_version < 3:
        return {"throttle_time_ms": 0, "error_code": err or (codes[0] if codes else 0), "members": []}
    members = [{"member_id": mid, "group_instance_id": iid, "error_code": c}
               for (mid, iid), c in zip(leaving, codes)]
    return {"throttle_time_ms": 0, "error_code": err, "members": members}


async def offset_commit(gc, header, body):
    wanted, order = {}, []
    for t in body["topics"]:
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            order.append(tp)
            wanted[tp] = (p["committed_offset"], p.get("committed_leader_epoch", -1), p["committed_metadata"])
    codes = await gc.commit_offsets(body["group_id"], body.get("generation_id_or_member_epoch", -1),
                                    body.get("member_id", ""), body.get("group_instance_id"), wanted)
    topics: dict = {}
    for tp in order:
        topics.setdefault(tp[0], []).append({"partition_index": tp[1], "error_code": codes.get(tp, 0)})
    return {"throttle_time_ms": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


def offset_fetch(gc, header, body):
    version = header.api_version
    req_topics = body["topics"]
    wanted = None if req_topics is None else [(t["name"], p) for t in req_topics for p in t["partition_indexes"]]
    err, found = gc.fetch_offsets(body["group_id"], wanted)
    topics: dict = {}
    if err and version < 2:
        for tp in wanted or []:
            topics.setdefault(tp[0], []).append(_fetched(tp[1], None, err))
    elif not err:
        for tp, e in (found.items() if wanted is None else ((tp, found.get(tp)) for tp in wanted)):
            topics.setdefault(tp[0], []).append(_fetched(tp[1], e, 0))
    return {"throttle_time_ms": 0, "error_code": err,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


def _fetched(partition, entry, code):
    if entry is None:
        return {"partition_index": partition, "committed_offset": -1, "committed_leader_epoch": -1,
                "metadata": "", "error_code": code}
    return {"partition_index": partition, "committed_offset": entry.offset,
            "committed_leader_epoch": entry.leader_epoch, "metadata": entry.metadata, "error_code": 0}


def describe_groups(gc, body):
    return {"throttle_time_ms": 0, "groups": [gc.describe_group(g) for g in body["groups"]]}


async def list_groups(gc, body):
    err, groups = await gc.list_groups(body.get("states_filter"))
    return {"throttle_time_ms": 0, "error_code": err, "groups": groups}


async def delete_groups(gc, body):
    results = []
    for g in body["groups_names"]:
        results.append({"group_id": g, "error_code": await gc.delete_group(g)})
    return {"throttle_time_ms": 0, "results": results}


async def offset_delete(gc, body):
    order = [(t["name"], p["partition_index"]) for t in body["topics"] for p in t["partitions"]]
    err, codes = await gc.delete_offsets(body["group_id"], order)
    topics: dict = {}
    if not err:
        for tp in order:
            topics.setdefault(tp[0], []).append({"partition_index": tp[1], "error_code": codes.get(tp, 0)})
    return {"error_code": err, "throttle_time_ms": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


__all__ = ["register", "Errors"]
