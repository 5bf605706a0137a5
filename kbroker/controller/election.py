"""Leader election rules (Kafka's PartitionLeaderElectionAlgorithms), pure functions.

Each returns (leader, isr) or None when no eligible replica exists. Candidates are taken in
assignment order, so the preferred replica (the first) wins whenever it is eligible.
"""
from __future__ import annotations

NO_LEADER = -1


def offline(replicas, isr, live, unclean: bool = False):
    """The leader is gone (or there is none): first live ISR member; with ``unclean`` any live
    replica (its log may lack acknowledged records, hence an ISR of just itself)."""
    live_isr = [r for r in replicas if r in isr and r in live]
    if live_isr:
        return live_isr[0], [r for r in isr if r in live]
    if unclean:
        live_replicas = [r for r in replicas if r in live]
        if live_replicas:
            return live_replicas[0], [live_replicas[0]]
    return None


def controlled_shutdown(replicas, isr, live, shutting_down):
    """Move leadership off brokers that are shutting down, to a live ISR member that is not."""
    candidates = [r for r in replicas if r in isr and r in live and r not in shutting_down]
    if candidates:
        return candidates[0], [r for r in isr if r not in shutting_down]
    return None


def preferred(replicas, isr, live):
    """Give leadership back to the first replica when it is alive and in sync."""
    if replicas and replicas[0] in live and replicas[0] in isr:
        return replicas[0], list(isr)
    return None


def without_replica(leader: int, isr, broker: int):
    """(leader, isr) after taking ``broker`` out: it leaves the ISR unless it is the last member
    (Kafka keeps the last in-sync replica recorded, so its return can restore the partition), and
    a removed leader leaves the partition leaderless."""
    new_isr = [r for r in isr if r != broker] or list(isr)
    return (NO_LEADER if leader == broker else leader), new_isr
