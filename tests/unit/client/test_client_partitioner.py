"""Kafka's murmur2 partitioner: Java client vectors, kafka-python agreement, sticky null keys."""
import random

import pytest

from kbroker.client.partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive

# org.apache.kafka.common.utils.Utils.murmur2 outputs (signed int32), as asserted by Kafka's UtilsTest.
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data,expected", sorted(JAVA_VECTORS.items()))
def test_java_vectors(data, expected):
    assert murmur2(data) == expected


def test_agrees_with_kafka_python_on_every_tail_length():
    from kafka.partitioner.default import murmur2 as kp_murmur2
    rng = random.Random(7)
    for n in range(0, 67):
        for _ in range(30):
            data = bytes(rng.getrandbits(8) for _ in range(n))
            assert murmur2(data) & 0xFFFFFFFF == kp_murmur2(data)


def test_partition_uses_sign_bit_mask_not_abs():
    from kafka.partitioner.default import murmur2 as kp_murmur2
    rng = random.Random(11)
    for _ in range(500):
        key = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 40)))
        # kafka-python's DefaultPartitioner: (murmur2 & 0x7fffffff) % partitions
        assert partition_for_key(key, 7) == (kp_murmur2(key) & 0x7FFFFFFF) % 7
    assert to_positive(-2147483648) == 0 and to_positive(-1) == 0x7FFFFFFF


def test_sticky_partitioner():
    sp = StickyPartitioner(random.Random(3))
    first = sp.partition("t", None, 6)
    assert all(sp.partition("t", None, 6) == first for _ in range(50))   # sticks
    sp.on_new_batch("t", first, 6)
    second = sp.partition("t", None, 6)
    assert second != first                                                # moves on, elsewhere
    sp.on_new_batch("t", first, 6)                                        # stale notice: no change
    assert sp.partition("t", None, 6) == second
    assert sp.partition("t", b"k", 6) == partition_for_key(b"k", 6)       # keys ignore stickiness
    assert sp.partition("u", None, 4, available=[2]) == 2                 # only partitions with a leader
