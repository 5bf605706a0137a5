"""KIP-392: the replica a consumer should fetch from. With ``replica.selector.class`` set to Kafka's
RackAwareReplicaSelector, a leader answers a consumer's Fetch (v11+, a non-empty rack_id) for a partition
with ``preferred_read_replica`` and no records when an in-sync follower in the consumer's rack can serve the
fetch offset and the leader is in another rack; the consumer then fetches from that follower, which serves
consumers up to its high watermark (fetch.py)."""
from __future__ import annotations

import time

RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
# The first Fetch version with rack_id; from it on followers serve consumers (Kafka's client metadata).
FIRST_VERSION = 11


def enabled(broker) -> bool:
    return broker.config.get("replica.selector.class") == RACK_AWARE


def preferred_read_replica(broker, part, fetch_offset: int, rack: str, listener) -> int:
    """The id of the replica ``part``'s consumer in ``rack`` should read ``fetch_offset`` from, or -1 (this
    leader). As Kafka's selector: the leader when it is in the rack (or no replica is); else, among the
    in-sync followers in the rack with an address on the request's listener that hold ``fetch_offset``,
    the one with the greatest log end, then the most recently caught up."""
    if not rack:
        return -1
    brokers = broker.metadata.brokers
    me = brokers.get(broker.broker_id)
    if me is not None and me.rack == rack:
        return -1
    now = int(time.time() * 1000)
    best = None
    for r, f in part.followers.items():
        b = brokers.get(r)
        if (b is None or b.rack != rack or r not in part.isr or b.address(listener) is None
                or f.leo < fetch_offset or f.log_start_offset > fetch_offset):
            continue
        key = (-f.leo, now - f.last_caught_up_ms, r)
        if best is None or key < best:
            best = key
    return -1 if best is None else best[2]
