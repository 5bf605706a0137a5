"""Bodies of the controller's requests (LeaderAndIsr v5, UpdateMetadata v7, StopReplica v3) built
from the controller context. Each carries the controller id and epoch and the target's broker
epoch; partition_epoch / zk_version is the state znode's version after the controller's write."""
from __future__ import annotations

import base64

from .context import ControllerContext

LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA, CONTROLLED_SHUTDOWN = 4, 5, 6, 7
VERSIONS = {LEADER_AND_ISR: 5, STOP_REPLICA: 3, UPDATE_METADATA: 7, CONTROLLED_SHUTDOWN: 3}
LEADER_DURING_DELETE = -2
PLAINTEXT = 0   # SecurityProtocol id
SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}


def topic_id_raw(topic_id: str | None) -> bytes:
    return base64.urlsafe_b64decode(topic_id + "==") if topic_id else bytes(16)


def _by_topic(parts):
    out: dict[str, list[int]] = {}
    for t, p in sorted(parts):
        out.setdefault(t, []).append(p)
    return out


def leader_and_isr(ctx: ControllerContext, controller_id: int, broker_epoch: int, parts,
                   is_new=frozenset()) -> dict:
    topics = []
    leaders = set()
    for t, ps in _by_topic(parts).items():
        states = []
        for p in ps:
            st, version = ctx.states[(t, p)]
            leaders.add(st.leader)
            states.append({"partition_index": p, "controller_epoch": st.controller_epoch,
                           "leader": st.leader, "leader_epoch": st.leader_epoch, "isr": list(st.isr),
                           "partition_epoch": version, "replicas": list(ctx.replicas((t, p))),
                           "adding_replicas": [], "removing_replicas": [], "is_new": (t, p) in is_new})
        topics.append({"topic_name": t, "topic_id": topic_id_raw(ctx.topic_ids.get(t)),
                       "partition_states": states})
    live_leaders = [{"broker_id": b.broker_id, "host_name": b.host, "port": b.port}
                    for bid, b in sorted(ctx.brokers.items()) if bid in leaders]
    return {"controller_id": controller_id, "controller_epoch": ctx.epoch, "broker_epoch": broker_epoch,
            "type": 0, "topic_states": topics, "live_leaders": live_leaders}


def update_metadata(ctx: ControllerContext, controller_id: int, broker_epoch: int, parts,
                    deleted: dict | None = None) -> dict:
    """``parts`` present in the context; ``deleted``: {(topic, p): (replicas, topic_id)} of
    partitions being deleted (sent with leader -2 so brokers drop them)."""
    live = ctx.live()
    topics: dict[str, dict] = {}
    for t, ps in _by_topic(parts).items():
        entry = topics.setdefault(t, {"topic_name": t, "topic_id": topic_id_raw(ctx.topic_ids.get(t)),
                                      "partition_states": []})
        for p in ps:
            st, version = ctx.states[(t, p)]
            replicas = ctx.replicas((t, p))
            entry["partition_states"].append({
                "partition_index": p, "controller_epoch": st.controller_epoch, "leader": st.leader,
                "leader_epoch": st.leader_epoch, "isr": list(st.isr), "zk_version": version,
                "replicas": list(replicas), "offline_replicas": [r for r in replicas if r not in live]})
    for (t, p), (replicas, topic_id) in sorted((deleted or {}).items()):
        entry = topics.setdefault(t, {"topic_name": t, "topic_id": topic_id_raw(topic_id),
                                      "partition_states": []})
        entry["partition_states"].append({
            "partition_index": p, "controller_epoch": ctx.epoch, "leader": LEADER_DURING_DELETE,
            "leader_epoch": 0, "isr": [], "zk_version": 0, "replicas": list(replicas), "offline_replicas": []})
    brokers = [{"id": b.broker_id, "endpoints": _endpoints(b), "rack": b.rack} for _, b in sorted(ctx.brokers.items())]
    return {"controller_id": controller_id, "controller_epoch": ctx.epoch, "broker_epoch": broker_epoch,
            "topic_states": list(topics.values()), "live_brokers": brokers}


def _endpoints(b) -> list[dict]:
    if not b.endpoints:
        return [{"port": b.port, "host": b.host, "listener": "PLAINTEXT", "security_protocol": PLAINTEXT}]
    return [{"port": port, "host": host, "listener": name,
             "security_protocol": SECURITY_PROTOCOL_IDS[b.protocols.get(name, name)]}
            for name, host, port in b.endpoints]


def stop_replica(ctx: ControllerContext, controller_id: int, broker_epoch: int, parts, delete: bool) -> dict:
    topics = []
    for t, ps in _by_topic(parts).items():
        topics.append({"topic_name": t, "partition_states": [
            {"partition_index": p, "leader_epoch": -2 if delete else -1, "delete_partition": delete}
            for p in ps]})
    return {"controller_id": controller_id, "controller_epoch": ctx.epoch, "broker_epoch": broker_epoch,
            "topic_states": topics}
