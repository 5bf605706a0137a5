"""Group APIs: thin handlers that decode the request shape of each version and call the
GroupCoordinator (``kbroker.coordinator``). JoinGroup and SyncGroup return coroutines that complete
when the rebalance does (long polls).

Their advertised versions (the table in ``kbroker.server.apis``) are Kafka 3.9's whole ranges, so
clients of a ZooKeeper-era cluster that send old versions (and new clients sending flexible ones) are
served.
"""
from __future__ import annotations

from ...protocol.errors import Errors
from . import authz

_GROUP_DENIED = int(Errors.GROUP_AUTHORIZATION_FAILED)
_TOPIC_DENIED = int(Errors.TOPIC_AUTHORIZATION_FAILED)


def _group(broker, conn, op, group_id) -> bool:
    return authz.allowed(broker, conn, op, authz.GROUP, group_id)


def _host(conn) -> str:
    peer = getattr(conn, "peer", None)
    return f"/{peer[0]}" if peer else ""


async def join_group(broker, conn, header, body):
    if not _group(broker, conn, authz.READ, body["group_id"]):
        return {"throttle_time_ms": 0, "error_code": _GROUP_DENIED, "generation_id": -1,
                "protocol_type": None, "protocol_name": None if header.api_version >= 7 else "", "leader": "",
                "skip_assignment": False, "member_id": body.get("member_id", ""), "members": []}
    r = await broker.group_coordinator.join_group(body, header.api_version, header.client_id or "", _host(conn))
    if header.api_version < 7 and r["protocol_name"] is None:
        r = dict(r, protocol_name="")   # nullable only from v7
    return r


def heartbeat(broker, conn, header, body):
    if not _group(broker, conn, authz.READ, body["group_id"]):
        return {"throttle_time_ms": 0, "error_code": _GROUP_DENIED}
    return {"throttle_time_ms": 0, "error_code": broker.group_coordinator.heartbeat(body)}


async def sync_group(broker, conn, header, body):
    if not _group(broker, conn, authz.READ, body["group_id"]):
        return {"throttle_time_ms": 0, "error_code": _GROUP_DENIED, "protocol_type": None, "protocol_name": None,
                "assignment": b""}
    return await broker.group_coordinator.sync_group(body)


def leave_group(broker, conn, header, body):
    if not _group(broker, conn, authz.READ, body["group_id"]):
        return {"throttle_time_ms": 0, "error_code": _GROUP_DENIED, "members": []}
    if header.api_version < 3:
        leaving = [(body["member_id"], None)]
    else:
        leaving = [(m["member_id"], m.get("group_instance_id")) for m in body["members"]]
    err, codes = broker.group_coordinator.leave_group(body["group_id"], leaving)
    if header.api_version < 3:
        return {"throttle_time_ms": 0, "error_code": err or (codes[0] if codes else 0), "members": []}
    members = [{"member_id": mid, "group_instance_id": iid, "error_code": c}
               for (mid, iid), c in zip(leaving, codes)]
    return {"throttle_time_ms": 0, "error_code": err, "members": members}


async def offset_commit(broker, conn, header, body):
    """v0 commits are stored in ``__consumer_offsets`` like v1+ (Kafka kept v0 commits in ZooKeeper) and
    are standalone commits: v0 carries no generation or member id. v1 may give each partition's commit
    timestamp (-1: now); v2-4 a retention time (-1: the broker's ``offsets.retention.minutes``) that
    fixes each offset's expiry."""
    version = header.api_version
    retention = body.get("retention_time_ms", -1) if 2 <= version <= 4 else -1
    # Group Read, then Read on each topic (Kafka): refused partitions are not committed
    group_ok = _group(broker, conn, authz.READ, body["group_id"])
    refused = authz.refused(broker, conn, authz.READ, authz.TOPIC, [t["name"] for t in body["topics"]])
    wanted, order, codes = {}, [], {}
    for t in body["topics"]:
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            order.append(tp)
            if not group_ok or tp[0] in refused:
                codes[tp] = _TOPIC_DENIED if group_ok else _GROUP_DENIED
                continue
            wanted[tp] = (p["committed_offset"], p.get("committed_leader_epoch", -1), p["committed_metadata"])
    if wanted or not order:
        codes.update(await broker.group_coordinator.commit_offsets(
        body["group_id"], body.get("generation_id_or_member_epoch", -1), body.get("member_id", ""),
            body.get("group_instance_id"), wanted, retention_ms=retention,
            timestamps=_commit_timestamps(body) if version == 1 else None))
    topics: dict = {}
    for tp in order:
        topics.setdefault(tp[0], []).append({"partition_index": tp[1], "error_code": codes.get(tp, 0)})
    return {"throttle_time_ms": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


def _commit_timestamps(body) -> dict:
    return {(t["name"], p["partition_index"]): p["commit_timestamp"]
            for t in body["topics"] for p in t["partitions"] if p["commit_timestamp"] != -1}


def offset_fetch(broker, conn, header, body):
    """v0 reads the offsets from ``__consumer_offsets`` (Kafka read v0 fetches from ZooKeeper); v8+
    batches groups, each answered with its own error code."""
    version = header.api_version
    if version >= 8:
        groups = []
        for g in body["groups"]:
            err, topics = _fetch_group(broker, conn, g["group_id"], g["topics"], version, body.get("require_stable"))
            groups.append({"group_id": g["group_id"], "topics": topics, "error_code": err})
        return {"throttle_time_ms": 0, "groups": groups}
    err, topics = _fetch_group(broker, conn, body["group_id"], body["topics"], version, body.get("require_stable"))
    return {"throttle_time_ms": 0, "error_code": err, "topics": topics}


def _fetch_group(broker, conn, group_id, req_topics, version, require_stable=False) -> tuple[int, list]:
    """-> (group error, response topics); before v2 the group error goes on every requested partition.
    Group Describe, then Describe on each topic (Kafka): a named topic refused answers
    TOPIC_AUTHORIZATION_FAILED, an unnamed one (all of the group's) is left out. ``require_stable`` (v7+,
    read_committed consumers): a partition whose offset waits for a transaction's marker answers
    UNSTABLE_OFFSET_COMMIT (retriable) instead of the offset before the transaction."""
    wanted = None if req_topics is None else [(t["name"], p) for t in req_topics for p in t["partition_indexes"]]
    if _group(broker, conn, authz.DESCRIBE, group_id):
        err, found = broker.group_coordinator.fetch_offsets(group_id, wanted)
    else:
        err, found = _GROUP_DENIED, {}
    topics: dict = {}
    if err and version < 2:
        for tp in wanted or []:
            topics.setdefault(tp[0], []).append(_fetched(tp[1], None, err))
    elif not err:
        refused = authz.refused(broker, conn, authz.DESCRIBE, authz.TOPIC, {tp[0] for tp in wanted or found})
        gc = broker.group_coordinator
        for tp, e in (found.items() if wanted is None else ((tp, found.get(tp)) for tp in wanted)):
            if tp[0] in refused:
                if wanted is not None:
                    topics.setdefault(tp[0], []).append(_fetched(tp[1], None, _TOPIC_DENIED))
                continue
            if require_stable and gc.has_pending_txn_offsets(group_id, tp):
                topics.setdefault(tp[0], []).append(_fetched(tp[1], None, int(Errors.UNSTABLE_OFFSET_COMMIT)))
                continue
            topics.setdefault(tp[0], []).append(_fetched(tp[1], e, 0))
    return err, [{"name": n, "partitions": ps} for n, ps in topics.items()]


def _fetched(partition, entry, code):
    if entry is None:
        return {"partition_index": partition, "committed_offset": -1, "committed_leader_epoch": -1,
                "metadata": "", "error_code": code}
    return {"partition_index": partition, "committed_offset": entry.offset,
            "committed_leader_epoch": entry.leader_epoch, "metadata": entry.metadata, "error_code": 0}


def describe_groups(broker, conn, header, body):
    gc = broker.group_coordinator
    groups = [gc.describe_group(g) if _group(broker, conn, authz.DESCRIBE, g) else
              {"error_code": _GROUP_DENIED, "group_id": g, "group_state": "", "protocol_type": "", "protocol_data": "",
               "members": []} for g in body["groups"]]
    if body.get("include_authorized_operations"):
        for g in groups:
            if g["error_code"] == 0:
                g["authorized_operations"] = authz.authorized_operations(broker, conn, authz.GROUP, g["group_id"])
    return {"throttle_time_ms": 0, "groups": groups}


async def list_groups(broker, conn, header, body):
    # Every group here is a classic one; a v5 type filter without "classic" matches none (as Kafka).
    types = body.get("types_filter")
    if types and "classic" not in {t.lower() for t in types}:
        return {"throttle_time_ms": 0, "error_code": 0, "groups": []}
    err, groups = await broker.group_coordinator.list_groups(body.get("states_filter"))
    if not authz.cluster(broker, conn, authz.DESCRIBE):     # then only the groups it may Describe
        groups = [g for g in groups if _group(broker, conn, authz.DESCRIBE, g["group_id"])]
    return {"throttle_time_ms": 0, "error_code": err, "groups": groups}


async def delete_groups(broker, conn, header, body):
    gc = broker.group_coordinator
    results = []
    for g in body["groups_names"]:
        ok = _group(broker, conn, authz.DELETE, g)
        results.append({"group_id": g, "error_code": await gc.delete_group(g) if ok else _GROUP_DENIED})
    return {"throttle_time_ms": 0, "results": results}


async def offset_delete(broker, conn, header, body):
    order = [(t["name"], p["partition_index"]) for t in body["topics"] for p in t["partitions"]]
    if not _group(broker, conn, authz.DELETE, body["group_id"]):
        return {"error_code": _GROUP_DENIED, "throttle_time_ms": 0, "topics": []}
    refused = authz.refused(broker, conn, authz.READ, authz.TOPIC, {tp[0] for tp in order})
    err, codes = await broker.group_coordinator.delete_offsets(body["group_id"],
                                                               [tp for tp in order if tp[0] not in refused])
    codes.update({tp: _TOPIC_DENIED for tp in order if tp[0] in refused})
    topics: dict = {}
    if not err:
        for tp in order:
            topics.setdefault(tp[0], []).append({"partition_index": tp[1], "error_code": codes.get(tp, 0)})
    return {"error_code": err, "throttle_time_ms": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


