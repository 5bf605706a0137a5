"""InitProducerId for idempotent producers (kafka-python 3 turns idempotence on by default) and, with a
transactional id, for transactional ones (the transaction coordinator: new id, epoch bump, fencing,
KIP-360 recovery with the request's producer id and epoch).

Producer ids come from blocks reserved durably in ZooKeeper (``/latest_producer_id_block``, as Kafka
does), so an id is never handed out twice, even across broker restarts.
"""
from __future__ import annotations

import asyncio
import logging

from ...protocol.errors import Errors
from . import authz

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    def __init__(self, broker):
        self.broker = broker
        self._next = 0
        self._end = -1           # inclusive end of the current block; -1 = none yet
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next > self._end:
                start, end = await asyncio.to_thread(self.broker.zk.allocate_producer_id_block, BLOCK_SIZE)
                self._next, self._end = start, end
            pid = self._next
            self._next += 1
            return pid


async def init_producer_id(broker, conn, header, body):
    tid = body.get("transactional_id")
    # Kafka: Write on the transactional id; without one (KIP-679) IdempotentWrite on the cluster or Write
    # on any topic
    if tid is not None and not authz.allowed(broker, conn, authz.WRITE, authz.TRANSACTIONAL_ID, tid):
        return {"throttle_time_ms": 0, "error_code": Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if tid is None and not (authz.cluster(broker, conn, authz.IDEMPOTENT_WRITE)
                            or authz.allowed_any(broker, conn, authz.WRITE, authz.TOPIC)):
        return {"throttle_time_ms": 0, "error_code": Errors.CLUSTER_AUTHORIZATION_FAILED, "producer_id": -1,
                "producer_epoch": -1}
    if tid is not None:
        code, pid, epoch = await broker.txn_coordinator.init_producer_id(
            tid, body["transaction_timeout_ms"], body.get("producer_id", -1), body.get("producer_epoch", -1))
        # PRODUCER_FENCED exists from v4 (KIP-588); older clients know INVALID_PRODUCER_EPOCH.
        if code == Errors.PRODUCER_FENCED and header.api_version < 4:
            code = Errors.INVALID_PRODUCER_EPOCH
        return {"throttle_time_ms": 0, "error_code": int(code), "producer_id": pid, "producer_epoch": epoch}
    try:
        pid = await broker.producer_ids.allocate()
    except Exception:
        log.exception("producer id block allocation failed")
        return {"throttle_time_ms": 0, "error_code": Errors.COORDINATOR_NOT_AVAILABLE, "producer_id": -1,
                "producer_epoch": -1}
    # Without a transactional id Kafka always issues a fresh id with epoch 0 (also for KIP-360 bumps).
    return {"throttle_time_ms": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0}
