"""Partition choice, compatible with the Java client so keyed records land where Kafka's own
producers (and kafka-python, librdkafka's ``murmur2_random``) would put them.

Keyed records: ``(murmur2(key) & 0x7fffffff) % num_partitions`` — Java's ``Utils.toPositive`` masks
the sign bit rather than taking ``abs`` so ``Integer.MIN_VALUE`` cannot stay negative.
Null keys: sticky (KIP-480): keep filling one partition until its batch is sent, then move on, so
null-key traffic still forms large batches.
"""
from __future__ import annotations

import random

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's MurmurHash2 (``org.apache.kafka.common.utils.Utils.murmur2``) as a signed int32."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    mv = memoryview(data).cast("B")
    # Java reads each 4-byte block little-endian.
    for i in range(0, tail, 4):
        k = mv[i] | (mv[i + 1] << 8) | (mv[i + 2] << 16) | (mv[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest:
        # Java's switch falls through: 3 -> 2 -> 1, then one multiply.
        if rest == 3:
            h ^= mv[tail + 2] << 16
        if rest >= 2:
            h ^= mv[tail + 1] << 8
        h ^= mv[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """Keyed: murmur2. Unkeyed: one sticky partition per topic, changed when a batch completes."""

    def __init__(self, rng: random.Random | None = None):
        self._sticky: dict[str, int] = {}
        self._rng = rng or random.Random()

    def partition(self, topic: str, key: bytes | None, num_partitions: int,
                  available: list[int] | None = None) -> int:
        if key is not None:
            return partition_for_key(key, num_partitions)
        p = self._sticky.get(topic)
        if p is None or p >= num_partitions:
            p = self._pick(num_partitions, available, None)
            self._sticky[topic] = p
        return p

    def on_new_batch(self, topic: str, prev_partition: int, num_partitions: int,
                     available: list[int] | None = None) -> None:
        """The sticky partition's batch filled up or was sent: switch to a different partition."""
        if self._sticky.get(topic) == prev_partition:
            self._sticky[topic] = self._pick(num_partitions, available, prev_partition)

    def _pick(self, n: int, available: list[int] | None, avoid: int | None) -> int:
        choices = available if available else list(range(n))
        if len(choices) > 1 and avoid is not None:
            choices = [p for p in choices if p != avoid]
        return self._rng.choice(choices)
