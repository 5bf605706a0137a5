"""KIP-951: a Produce (v10+) or Fetch (v16+) answered NOT_LEADER_OR_FOLLOWER (Fetch: FENCED_LEADER_EPOCH too)
names the partition's current leader and its address on the request's listener, so the client moves without
a Metadata round trip. Tagged fields: absent for clients that do not ask."""
from __future__ import annotations

from ...protocol.errors import Errors

PRODUCE_CODES = frozenset((int(Errors.NOT_LEADER_OR_FOLLOWER),))
FETCH_CODES = frozenset((int(Errors.NOT_LEADER_OR_FOLLOWER), int(Errors.FENCED_LEADER_EPOCH)))


def current_leader(broker, topic: str, partition: int) -> dict:
    """{leader_id, leader_epoch} as this broker's metadata knows them (-1, -1 when it knows none)."""
    info = broker.metadata.partition(topic, partition)
    if info is None or info.leader not in broker.metadata.brokers:
        return {"leader_id": -1, "leader_epoch": -1}
    return {"leader_id": info.leader, "leader_epoch": info.leader_epoch}


def node_endpoints(broker, listener: str | None, ids) -> list[dict]:
    """The address of each broker in ``ids`` on ``listener`` (the one the request came in on)."""
    wanted = set(ids)
    return [{"node_id": b.broker_id, "host": host, "port": port, "rack": b.rack}
            for b, host, port in broker.metadata.listener_brokers(listener) if b.broker_id in wanted]
