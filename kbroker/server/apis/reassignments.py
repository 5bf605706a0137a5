"""AlterPartitionReassignments (45) and ListPartitionReassignments (46), served by the controller's
broker (others: NOT_CONTROLLER at the top level), as Kafka's ZooKeeper mode: the controller
validates and starts the moves (kbroker.controller.Controller.alter_reassignments) and lists the
partitions whose assignment still has adding or removing replicas."""
from __future__ import annotations

from ...protocol.errors import Errors
from . import authz

NOT_CONTROLLER_MESSAGE = "This is not the correct controller for this cluster."


def _refused(res: dict) -> dict:
    res["error_code"], res["error_message"] = int(Errors.CLUSTER_AUTHORIZATION_FAILED), None
    return res


def _not_controller(res: dict) -> dict:
    res["error_code"], res["error_message"] = int(Errors.NOT_CONTROLLER), NOT_CONTROLLER_MESSAGE
    return res


async def alter_partition_reassignments(broker, conn, header, body):
    targets = {}
    for t in body["topics"]:
        for p in t["partitions"]:
            r = p["replicas"]
            targets[(t["name"], p["partition_index"])] = None if r is None else list(r)
    res = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "responses": []}
    if not authz.cluster(broker, conn, authz.ALTER):
        return _refused(res)
    ctl = broker.controller
    results = None if ctl is None else await ctl.alter_reassignments(targets)
    if results is None:
        return _not_controller(res)
    by_topic: dict[str, list] = {}
    for (name, index), (code, message) in results.items():
        by_topic.setdefault(name, []).append({"partition_index": index, "error_code": int(code),
                                              "error_message": message})
    res["responses"] = [{"name": n, "partitions": ps} for n, ps in by_topic.items()]
    return res


async def list_partition_reassignments(broker, conn, header, body):
    asked = body["topics"]
    parts = None if asked is None else [(t["name"], p) for t in asked for p in t["partition_indexes"]]
    res = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "topics": []}
    if not authz.cluster(broker, conn, authz.DESCRIBE):
        return _refused(res)
    ctl = broker.controller
    found = None if ctl is None else await ctl.list_reassignments(parts)
    if found is None:
        return _not_controller(res)
    by_topic: dict[str, list] = {}
    for (name, index), (replicas, adding, removing) in sorted(found.items()):
        by_topic.setdefault(name, []).append({"partition_index": index, "replicas": replicas,
                                              "adding_replicas": adding, "removing_replicas": removing})
    res["topics"] = [{"name": n, "partitions": ps} for n, ps in by_topic.items()]
    return res
