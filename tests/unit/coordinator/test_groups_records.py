"""__consumer_offsets record formats against golden bytes written out by hand from Kafka's schemas
(group-coordinator/src/main/resources/common/message/OffsetCommitKey.json v1, OffsetCommitValue.json
v3, GroupMetadataKey.json v2, GroupMetadataValue.json v3): every key and value starts with its int16
schema version; strings are int16 length + UTF-8 (-1 = null), bytes int32 length, arrays int32 count."""
import struct

import pytest

from kbroker.coordinator import records as consumer_offsets


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def s(v):
    return i16(-1) if v is None else i16(len(v.encode())) + v.encode()


def test_offset_commit_key_v1():
    want = i16(1) + s("my-group") + s("orders") + i32(7)
    assert want == bytes.fromhex("0001" "0008") + b"my-group" + bytes.fromhex("0006") + b"orders" + bytes.fromhex("00000007")
    assert consumer_offsets.offset_key("my-group", "orders", 7) == want
    assert consumer_offsets.decode_key(want) == ("offset", "my-group", "orders", 7)


def test_offset_commit_value_v3():
    want = i16(3) + i64(1234567) + i32(4) + s("meta") + i64(1700000000123)
    assert consumer_offsets.offset_value(consumer_offsets.OffsetValue(1234567, 4, "meta", 1700000000123)) == want
    v = consumer_offsets.decode_offset_value(want)
    assert (v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp) == \
        (1234567, 4, "meta", 1700000000123, -1)


def test_offset_commit_value_older_versions_decode():
    v1 = i16(1) + i64(5) + s("") + i64(10) + i64(99)     # v1 has expireTimestamp, no leader epoch
    v = consumer_offsets.decode_offset_value(v1)
    assert (v.offset, v.leader_epoch, v.commit_timestamp, v.expire_timestamp) == (5, -1, 10, 99)
    v0 = i16(0) + i64(6) + s("x") + i64(11)
    assert consumer_offsets.decode_offset_value(v0).offset == 6


def test_group_metadata_key_v2():
    want = i16(2) + s("my-group")
    assert consumer_offsets.group_key("my-group") == want
    assert consumer_offsets.decode_key(want) == ("group", "my-group")


def test_group_metadata_value_v3():
    member = (s("c-1-abc") + s("instance-1") + s("client-1") + s("/127.0.0.1") + i32(300000) + i32(10000)
              + i32(3) + b"sub" + i32(2) + b"as")
    member2 = (s("c-2-def") + s(None) + s("client-2") + s("/127.0.0.1") + i32(60000) + i32(6000)
               + i32(0) + i32(0))
    want = (i16(3) + s("consumer") + i32(5) + s("range") + s("c-1-abc") + i64(1700000000000)
            + i32(2) + member + member2)
    gv = consumer_offsets.GroupValue("consumer", 5, "range", "c-1-abc", 1700000000000, [
        consumer_offsets.MemberValue("c-1-abc", "instance-1", "client-1", "/127.0.0.1", 300000, 10000, b"sub", b"as"),
        consumer_offsets.MemberValue("c-2-def", None, "client-2", "/127.0.0.1", 60000, 6000, b"", b""),
    ])
    assert consumer_offsets.group_value(gv) == want
    assert consumer_offsets.decode_group_value(want) == gv


def test_empty_group_value_has_null_protocol_and_leader():
    want = i16(3) + s("consumer") + i32(2) + s(None) + s(None) + i64(-1) + i32(0)
    assert consumer_offsets.group_value(consumer_offsets.GroupValue("consumer", 2, None, None, -1, [])) == want


@pytest.mark.parametrize("bad", [b"", i16(9) + s("g"), i16(1) + s("g"), i16(3) + i64(1)])
def test_malformed_records_raise_format_error(bad):
    with pytest.raises(consumer_offsets.RecordFormatError):
        consumer_offsets.decode_key(bad) if len(bad) < 8 else consumer_offsets.decode_offset_value(bad)
