"""Replica placement for new topics and partitions (Kafka's AdminUtils.assignReplicasToBrokers).

Leaders go round-robin over the brokers from a random start; followers sit at a shift that grows
each time the leaders wrap around, so a topic's replicas and leadership spread evenly. With rack
information on every broker the broker list is first arranged so consecutive entries alternate
racks, and a follower is skipped while its rack (or broker) already holds a replica of the
partition and an unused rack (or broker) remains.
"""
from __future__ import annotations

import logging
import random

from ..protocol.errors import Errors

log = logging.getLogger(__name__)


class AssignmentError(Exception):
    """Placement refused: ``code`` is the Kafka error code for the response."""

    def __init__(self, code: int, message: str | None = None):
        super().__init__(message)
        self.code = int(code)
        self.message = message


def assign_replicas(brokers, n_partitions: int, replication_factor: int, *, start_partition: int = 0,
                    start_index: int = -1, racks: dict[int, str | None] | None = None) -> dict[int, list[int]]:
    """{partition: replicas} for ``n_partitions`` partitions numbered from ``start_partition``.

    ``brokers``: live broker ids; ``racks``: {id: rack or None}. Rack-aware placement when every
    broker has a rack; without any rack (or with only some, as Kafka's "safe" mode) rack-unaware."""
    ids = sorted(brokers)
    n = len(ids)
    if n_partitions <= 0:
        raise AssignmentError(Errors.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise AssignmentError(Errors.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0.")
    if replication_factor > n:
        raise AssignmentError(Errors.INVALID_REPLICATION_FACTOR,
                              f"Replication factor: {replication_factor} larger than available brokers: {n}.")
    racks = racks or {}
    with_rack = {b: racks.get(b) for b in ids if racks.get(b) is not None}
    if with_rack and len(with_rack) == n:
        return _rack_aware(with_rack, n_partitions, replication_factor, start_partition, start_index)
    if with_rack:
        log.warning("only some brokers have broker.rack set; placing replicas without racks")
    return _rack_unaware(ids, n_partitions, replication_factor, start_partition, start_index)


def _rack_unaware(ids, n_partitions, rf, start_partition, start_index):
    n = len(ids)
    start = start_index if start_index >= 0 else random.randrange(n)
    shift = start_index if start_index >= 0 else random.randrange(n)
    out = {}
    p = max(0, start_partition)
    for _ in range(n_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        for j in range(rf - 1):
            replicas.append(ids[_replica_index(first, shift, j, n)])
        out[p] = replicas
        p += 1
    return out


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n if n > 1 else first


def rack_alternated(racks: dict[int, str]) -> list[int]:
    """Brokers ordered so racks alternate: first broker of each rack (racks sorted), then the
    second of each, ... e.g. {0:a,1:a,2:b,3:c,4:c} -> [0, 2, 3, 1, 4]."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(racks):
        by_rack.setdefault(racks[b], []).append(b)
    names = sorted(by_rack)
    iters = {r: iter(by_rack[r]) for r in names}
    out: list[int] = []
    i = 0
    while len(out) < len(racks):
        b = next(iters[names[i]], None)
        if b is not None:
            out.append(b)
        i = (i + 1) % len(names)
    return out


def _rack_aware(racks: dict[int, str], n_partitions, rf, start_partition, start_index):
    arranged = rack_alternated(racks)
    n = len(arranged)
    n_racks = len(set(racks.values()))
    start = start_index if start_index >= 0 else random.randrange(n)
    shift = start_index if start_index >= 0 else random.randrange(n)
    out = {}
    p = max(0, start_partition)
    for _ in range(n_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        leader = arranged[first]
        replicas = [leader]
        used_racks = {racks[leader]}
        used = {leader}
        k = 0
        for _ in range(rf - 1):
            while True:
                b = arranged[_replica_index(first, shift * n_racks, k, n)]
                k += 1
                # Prefer a new rack and a new broker; once every rack (broker) holds one, any will do.
                if ((racks[b] not in used_racks or len(used_racks) == n_racks)
                        and (b not in used or len(used) == n)):
                    replicas.append(b)
                    used_racks.add(racks[b])
                    used.add(b)
                    break
        out[p] = replicas
        p += 1
    return out


def check_manual_assignment(replica_lists: list[list[int]], live: set[int], expected_rf: int | None,
                            first_partition: int) -> None:
    """Validate replica lists given by the client (CreateTopics/CreatePartitions assignments)."""
    for i, replicas in enumerate(replica_lists):
        p = first_partition + i
        if not replicas:
            raise AssignmentError(Errors.INVALID_REPLICA_ASSIGNMENT, f"Replica list of partition {p} is empty.")
        if len(set(replicas)) != len(replicas):
            raise AssignmentError(Errors.INVALID_REPLICA_ASSIGNMENT,
                                  f"Duplicate brokers not allowed in replica assignment: {_ids(replicas)} "
                                  f"for partition id {p}.")
        unknown = [b for b in replicas if b not in live]
        if unknown:
            raise AssignmentError(Errors.INVALID_REPLICA_ASSIGNMENT,
                                  f"Unknown broker(s) in replica assignment: {_ids(unknown)}.")
        if expected_rf is None:
            expected_rf = len(replicas)
        elif len(replicas) != expected_rf:
            raise AssignmentError(Errors.INVALID_REPLICA_ASSIGNMENT,
                                  f"Inconsistent replication factor between partitions, partition "
                                  f"{first_partition} has {expected_rf} while partition {p} has {len(replicas)}.")


def _ids(ids) -> str:
    return ", ".join(str(i) for i in ids)
