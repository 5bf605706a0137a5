"""ControlledShutdown (7): a broker about to stop asks the controller to move its leaderships away
first. Served by the controller's broker; others answer NOT_CONTROLLER."""
from __future__ import annotations

import asyncio
import logging

from ...client.connection import BrokerConnection, KafkaError
from ...protocol.errors import Errors

log = logging.getLogger(__name__)


async def controlled_shutdown(broker, body):
    controller = broker.controller
    if controller is None or not controller.active:
        return {"error_code": Errors.NOT_CONTROLLER, "remaining_partitions": []}
    code, remaining = await controller.controlled_shutdown(body["broker_id"], body["broker_epoch"])
    return {"error_code": code,
            "remaining_partitions": [{"topic_name": t, "partition_index": p} for t, p in remaining]}


async def request_controlled_shutdown(broker) -> bool:
    """Broker side (Broker.stop): ControlledShutdown v3 to the current controller until it answers
    with nothing left to move, at most ``controlled.shutdown.max.retries`` times, pausing
    ``controlled.shutdown.retry.backoff.ms`` between attempts. True when everything moved.

    Retries stop early when no partition still led here has another live replica (ZooKeeper's
    /brokers/ids; without the controller's answer: no partition with a replica here has one). The
    last broker of a cluster, or a partition whose other replicas are all down, has nowhere to go, and
    waiting the backoff out (10 s with the defaults) cannot change that unless a broker comes back in
    between (then the controller elects it once it is in sync)."""
    cfg = broker.config
    if not cfg.get("controlled.shutdown.enable"):
        return False
    retries = max(1, cfg.get("controlled.shutdown.max.retries"))
    backoff_s = cfg.get("controlled.shutdown.retry.backoff.ms") / 1000
    for attempt in range(1, retries + 1):
        left = None     # the controller's remaining partitions, when it answered without an error
        controller = broker.metadata.brokers.get(broker.metadata.controller_id)
        if controller is None:
            log.warning("controlled shutdown: no known controller (attempt %d of %d)", attempt, retries)
        else:
            try:
                conn = await BrokerConnection.open(controller.host, controller.port,
                                                   client_id=f"broker-{broker.broker_id}-shutdown",
                                                   security=broker.inter_broker_security)
                try:
                    _, resp = await conn.send(7, {"broker_id": broker.broker_id,
                                                  "broker_epoch": broker.zk.broker_epoch}, version=3)
                finally:
                    conn.close()
                if resp["error_code"] == 0 and not resp["remaining_partitions"]:
                    log.info("controlled shutdown succeeded")
                    return True
                log.warning("controlled shutdown attempt %d of %d: error %d, %d partitions still led here",
                            attempt, retries, resp["error_code"], len(resp["remaining_partitions"]))
                if resp["error_code"] == 0:
                    left = resp["remaining_partitions"]
            except (KafkaError, OSError) as e:
                log.warning("controlled shutdown attempt %d of %d failed: %s", attempt, retries, e)
        if attempt < retries:
            # Without the controller's answer (none known, unreachable: it may be the broker that just
            # left, and this one about to take over), judge by every partition with a replica here.
            if left is None:
                left = replicated_here(broker.metadata, broker.broker_id)
            if await _nowhere_to_go(broker, left):
                log.info("controlled shutdown: no partition still led here has another live replica; "
                         "not retrying")
                return False
            await asyncio.sleep(backoff_s)
    log.warning("controlled shutdown did not complete; shutting down anyway")
    return False


async def _nowhere_to_go(broker, left) -> bool:
    """True when none of ``left`` (ControlledShutdown's remaining partitions) has a replica other than
    this broker among the live brokers ZooKeeper lists; False when any has, or when that cannot be
    told (a partition unknown here, ZooKeeper unreachable): then the retries go on as configured."""
    try:
        live = set(await asyncio.to_thread(broker.zk.get_broker_ids))
    except Exception as e:          # kazoo raises its own errors; retrying is the safe answer
        log.warning("controlled shutdown: cannot read the live brokers (%s); retrying", e)
        return False
    return not partitions_with_live_replica(broker.metadata, broker.broker_id, left, live)


def replicated_here(metadata, broker_id: int) -> list[dict]:
    """Every partition of the metadata cache with a replica on ``broker_id``, shaped as
    ControlledShutdown's remaining partitions: a superset of what the controller would name."""
    return [{"topic_name": t, "partition_index": p}
            for t, info in metadata.topics.items() for p, part in info.partitions.items()
            if broker_id in part.replicas]


def partitions_with_live_replica(metadata, broker_id: int, left, live: set) -> int:
    """How many of ``left`` have a replica other than ``broker_id`` in ``live`` (an unknown partition
    counts as one: it cannot be ruled out)."""
    count = 0
    for p in left:
        info = metadata.partition(p["topic_name"], p["partition_index"])
        if info is None or any(r != broker_id and r in live for r in info.replicas):
            count += 1
    return count
