"""DescribeCluster (60): the cluster id, the controller and the live brokers, from the metadata cache;
from v2 (KIP-1073) with ``include_fenced_brokers``, this broker too while it has fenced itself.

A ZooKeeper-mode broker serves the BROKER endpoint type only (KIP-919): asking it for controllers is
MISMATCHED_ENDPOINT_TYPE, an unknown type UNSUPPORTED_ENDPOINT_TYPE (INVALID_REQUEST at v0, which
has no endpoint type field).
"""
from __future__ import annotations

from ...protocol.errors import Errors
from . import authz

ENDPOINT_TYPES = {1: "BROKER", 2: "CONTROLLER"}
BROKER_ENDPOINT = 1

NOT_REQUESTED = -0x80000000


def describe_cluster(broker, conn, header, body):
    md = broker.metadata
    res = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "endpoint_type": BROKER_ENDPOINT,
           "cluster_id": broker.cluster_id, "controller_id": md.controller_id, "brokers": [],
           "cluster_authorized_operations": NOT_REQUESTED}
    wanted = body.get("endpoint_type", BROKER_ENDPOINT)
    if wanted != BROKER_ENDPOINT:
        v0 = header.api_version == 0
        if wanted not in ENDPOINT_TYPES:
            res["error_code"] = int(Errors.INVALID_REQUEST if v0 else Errors.UNSUPPORTED_ENDPOINT_TYPE)
            res["error_message"] = f"Unsupported endpoint type {wanted}"
        else:
            res["error_code"] = int(Errors.INVALID_REQUEST if v0 else Errors.MISMATCHED_ENDPOINT_TYPE)
            res["error_message"] = (f"The request was sent to an endpoint of type {ENDPOINT_TYPES[wanted]}, "
                                    f"but we wanted an endpoint of type BROKER")
        return res
    res["brokers"] = [{"broker_id": b.broker_id, "host": host, "port": port, "rack": b.rack, "is_fenced": False}
                      for b, host, port in md.listener_brokers(conn.listener_name)]
    if body.get("include_fenced_brokers") and broker.self_fenced:
        # Only this broker knows it stepped down (its session lease ran out); the others still list it
        # as live until ZooKeeper expires the session, and then not at all.
        host, port = next(((h, p) for name, h, p in broker.endpoints if name == conn.listener_name),
                          (broker.advertised_host, broker.advertised_port))
        res["brokers"].append({"broker_id": broker.broker_id, "host": host, "port": port,
                               "rack": broker.config.get("broker.rack"), "is_fenced": True})
        res["brokers"].sort(key=lambda b: b["broker_id"])
    if body["include_cluster_authorized_operations"]:
        res["cluster_authorized_operations"] = authz.authorized_operations(broker, conn, authz.CLUSTER,
                                                                           authz.CLUSTER_NAME)
    return res
