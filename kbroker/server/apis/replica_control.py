"""Controller -> broker requests (ZooKeeper mode): UpdateMetadata (6) here; LeaderAndIsr (4) and
StopReplica (5) join this module with the replica manager. Thin: epoch checks, then the broker's
metadata cache / replica manager do the work.

Epochs: STALE_CONTROLLER_EPOCH below the highest controller epoch seen, STALE_BROKER_EPOCH when
broker_epoch (-1 = any) is not this broker's registration czxid. A controller epoch not seen before is
taken only after ZooKeeper confirms it (``current_controller()``: a sync then a read), and the current
epoch only from its holder, so a client that forges LeaderAndIsr / UpdateMetadata with a huge epoch
cannot fence the real controller out."""
from __future__ import annotations

import asyncio
import logging

from ...protocol.errors import Errors

log = logging.getLogger(__name__)


async def check_controller_request(broker, body) -> int:
    """STALE_CONTROLLER_EPOCH when an older controller speaks, STALE_BROKER_EPOCH when the request
    was meant for an earlier incarnation of this broker; 0 otherwise (and the epoch is recorded).

    Any client can send these APIs. A newer epoch than we have seen is taken only once ZooKeeper
    confirms it (a rare read: once per controller election), so a forged request with a huge epoch
    cannot fence the real controller out of this broker for good."""
    md = broker.metadata
    epoch, sender = body["controller_epoch"], body["controller_id"]
    if epoch < md.controller_epoch:
        log.warning("rejecting a request of controller %d: epoch %d < %d", sender, epoch, md.controller_epoch)
        return Errors.STALE_CONTROLLER_EPOCH
    if epoch == md.controller_epoch and sender != md.controller_epoch_holder:
        log.warning("rejecting a request claiming controller %d epoch %d: that epoch is controller %d's",
                    sender, epoch, md.controller_epoch_holder)
        return Errors.STALE_CONTROLLER_EPOCH
    if epoch > md.controller_epoch and broker.zk is not None:
        try:
            holder, zk_epoch = await asyncio.to_thread(broker.zk.current_controller)
        except Exception as e:
            log.warning("cannot check controller epoch %d in ZooKeeper (%r); rejecting", epoch, e)
            return Errors.STALE_CONTROLLER_EPOCH
        if epoch > zk_epoch or (epoch == zk_epoch and sender != holder):
            log.warning("rejecting a request claiming controller %d epoch %d: ZooKeeper has controller %s "
                        "epoch %d", sender, epoch, holder, zk_epoch)
            return Errors.STALE_CONTROLLER_EPOCH
        if epoch < md.controller_epoch:   # a confirmed newer epoch arrived while we read
            return Errors.STALE_CONTROLLER_EPOCH
    own = broker.zk.broker_epoch if broker.zk is not None else None
    if body["broker_epoch"] != -1 and body["broker_epoch"] != own:
        log.warning("rejecting a request of controller %d for broker epoch %d (ours is %s)",
                    body["controller_id"], body["broker_epoch"], own)
        return Errors.STALE_BROKER_EPOCH
    md.controller_epoch, md.controller_epoch_holder = epoch, sender
    return 0


async def update_metadata(broker, body):
    code = await check_controller_request(broker, body)
    if code:
        return {"error_code": code}
    await broker.apply_update_metadata(body)
    return {"error_code": 0}


async def leader_and_isr(broker, body):
    """LeaderAndIsr v5: become leader or follower of each named partition (ReplicaManager); a
    partition state with an older leader epoch gets STALE_CONTROLLER_EPOCH, as in Kafka."""
    from ...config import parse_topic_config
    from ...replica import LeaderAndIsrState
    from ..metadata import topic_id_text

    code = await check_controller_request(broker, body)
    if code:
        return {"error_code": code, "topics": []}
    rm = broker.replica_manager
    # Topic configs (min.insync.replicas, segment sizes...) must be known before a log opens;
    # LeaderAndIsr for a new topic arrives before its UpdateMetadata, so read them here.
    names = [ts["topic_name"] for ts in body["topic_states"]]
    known = {n: broker.metadata.topics[n].config for n in names if n in broker.metadata.topics}
    missing = [n for n in names if n not in known]
    if missing:
        read = await asyncio.to_thread(lambda: {n: broker.zk.get_topic_config(n) for n in missing})
        known.update(read)
    async with rm.state_lock:
        topics = []
        for ts in body["topic_states"]:
            name = ts["topic_name"]
            raw_id = bytes(ts["topic_id"])
            tid = topic_id_text(raw_id) if any(raw_id) else None
            try:
                overrides = {k: parse_topic_config(k, v) for k, v in (known.get(name) or {}).items()}
            except Exception:
                log.exception("topic %s: unusable config overrides; using the defaults", name)
                overrides = {}
            errors = []
            for ps in ts["partition_states"]:
                tp = (name, ps["partition_index"])
                st = LeaderAndIsrState(ps["leader"], ps["leader_epoch"], list(ps["isr"]), list(ps["replicas"]),
                                       ps["partition_epoch"], ps["controller_epoch"], ps["is_new"])
                try:
                    err = rm.apply_leader_and_isr(tp, st, overrides, tid)
                except Exception:
                    log.exception("LeaderAndIsr for %s-%d failed", *tp)
                    err = Errors.KAFKA_STORAGE_ERROR
                errors.append({"partition_index": tp[1], "error_code": int(err)})
            topics.append({"topic_id": ts["topic_id"], "partition_errors": errors})
    return {"error_code": 0, "topics": topics}


async def stop_replica(broker, body):
    """StopReplica v3: stop fetching; delete_partition removes the log. An older leader epoch than
    ours is FENCED_LEADER_EPOCH (-1 = no epoch, -2 = the topic is being deleted: always apply)."""
    code = await check_controller_request(broker, body)
    if code:
        return {"error_code": code, "partition_errors": []}
    rm = broker.replica_manager
    out = []
    async with rm.state_lock:
        for ts in body["topic_states"]:
            for ps in ts["partition_states"]:
                tp = (ts["topic_name"], ps["partition_index"])
                p = rm.partitions.get(tp)
                epoch = ps["leader_epoch"]
                if p is not None and epoch >= 0 and epoch < p.leader_epoch:
                    err = Errors.FENCED_LEADER_EPOCH
                else:
                    try:
                        err = rm.stop_replica(tp, ps["delete_partition"])
                    except Exception:
                        log.exception("StopReplica for %s-%d failed", *tp)
                        err = Errors.KAFKA_STORAGE_ERROR
                out.append({"topic_name": tp[0], "partition_index": tp[1], "error_code": int(err)})
    return {"error_code": 0, "partition_errors": out}
