"""The native parser's string cache (ext/request.pyx ``_decode_str``): client ids and topic names a
client repeats are decoded once and the same str is handed on; strings that land in the same cache
slot (same length, same first, middle and last byte) or that are not ASCII still decode to their own
value. Fast: pure parsing, no broker."""
from __future__ import annotations

import struct

from kbroker._native.request import parse_fetch, parse_produce


def _s(b: bytes) -> bytes:
    return struct.pack(">h", len(b)) + b


def _produce(client_id: bytes, topic: bytes, version: int = 7) -> bytes:
    return (struct.pack(">hhi", 0, version, 9) + _s(client_id) + struct.pack(">h", -1)
            + struct.pack(">hi", 1, 1000) + struct.pack(">i", 1) + _s(topic)
            + struct.pack(">i", 1) + struct.pack(">ii", 0, 3) + b"abc")


def _fetch(client_id: bytes, topic: bytes) -> bytes:
    # Fetch v4: replica_id, max_wait, min_bytes, max_bytes, isolation; one topic, one partition
    return (struct.pack(">hhi", 1, 4, 3) + _s(client_id) + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0)
            + struct.pack(">i", 1) + _s(topic) + struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20))


def test_repeated_strings_are_the_same_object():
    a = parse_produce(_produce(b"rdkafka-client", b"orders"))
    b = parse_produce(_produce(b"rdkafka-client", b"orders"))
    assert a.client_id == "rdkafka-client" and a.topics[0][0] == "orders"
    assert b.client_id is a.client_id and b.topics[0][0] is a.topics[0][0]
    f = parse_fetch(_fetch(b"rdkafka-client", b"orders"))
    assert f.client_id is a.client_id and f.topics[0][0] is a.topics[0][0]


def test_same_slot_different_strings_decode_to_their_own_value():
    # same length and the same first, middle and last byte: the same cache slot, different text
    names = [b"t" + bytes([c]) * 3 + b"x" + bytes([d]) * 3 + b"z" for c in b"abcd" for d in b"0123"]
    assert len({(len(n), n[0], n[len(n) >> 1], n[-1]) for n in names}) == 1
    for _ in range(2):
        for n in names:
            req = parse_produce(_produce(n, n))
            assert req.client_id == n.decode() and req.topics[0][0] == n.decode()


def test_non_ascii_and_edge_lengths():
    for raw in ["é" * 3, "ü-topic", "日本", "é" * 3]:
        enc = raw.encode()
        req = parse_produce(_produce(enc, enc))
        assert req.client_id == raw and req.topics[0][0] == raw
    # a non-ASCII string whose UTF-8 bytes equal an ASCII string's length must not match it
    ascii_twin = b"abcdef"
    parse_produce(_produce(ascii_twin, ascii_twin))
    utf = "éèê".encode()           # 6 bytes, 3 characters
    assert len(utf) == len(ascii_twin)
    assert parse_produce(_produce(utf, utf)).client_id == "éèê"
    long = b"L" * 300               # beyond the cached length: decoded every time, still right
    assert parse_produce(_produce(long, b"t")).client_id == "L" * 300
    assert parse_produce(_produce(b"", b"t")).client_id == ""
