"""Which partitions of a coordinator's internal topic this broker leads, and the coordinators' periodic
tasks: shared by the group and the transaction coordinator."""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


def led_partitions(broker, topic: str) -> dict[int, int]:
    """{partition: leader epoch} of ``topic``'s partitions this broker leads: the ReplicaManager's view
    when there is one (it learns leadership first), else the metadata cache's."""
    rm = getattr(broker, "replica_manager", None)
    if rm is not None:
        return {tp[1]: part.leader_epoch for tp, part in list(rm.partitions.items())
                if tp[0] == topic and part.is_leader}
    t = broker.metadata.topics.get(topic)
    if t is None:
        return {}
    me = broker.broker_id
    return {p: info.leader_epoch for p, info in t.partitions.items() if info.leader == me}


def leader_epoch(broker, topic: str, p: int):
    """This broker's leader epoch of ``topic``-``p``, or None if it does not lead it."""
    rm = getattr(broker, "replica_manager", None)
    if rm is not None:
        part = rm.partitions.get((topic, p))
        return part.leader_epoch if part is not None and part.is_leader else None
    t = broker.metadata.topics.get(topic)
    info = t.partitions.get(p) if t is not None else None
    return info.leader_epoch if info is not None and info.leader == broker.broker_id else None


async def periodic(interval_s: float, fn, what: str) -> None:
    """Run ``fn`` (plain or coroutine function) every ``interval_s`` until cancelled; a failure is logged."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            r = fn()
            if asyncio.iscoroutine(r):
                await r
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s periodic task failed", what)
