"""The codec against kafka-python's own protocol classes, plus framing rules and hostile input.

For every API and every version that both we and kafka-python speak, a populated request and
response are encoded by us and decoded by kafka-python (and compared value by value), encoded by
kafka-python and decoded by us, and the two encodings of the same values must be byte-identical
(this checks header versions too). kafka-python builds its classes from Kafka's JSON files, which
in its version drop some old API versions (e.g. Produce 0-2): those versions are covered by the
schema oracle test only.
"""
from __future__ import annotations

import os
import random
import struct
import tracemalloc
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka.protocol.admin import (
    AlterConfigsRequest, AlterConfigsResponse, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteGroupsRequest, DeleteGroupsResponse,
    DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeClusterRequest, DescribeClusterResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, ListGroupsRequest, ListGroupsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest, FetchResponse, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, SyncGroupRequest, SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, FindCoordinatorResponse,
    MetadataRequest, MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)
from kafka.protocol.schemas.fields.codecs.types import BitField

from kbroker.protocol import api
from kbroker.protocol.messages import REQUESTS, RESPONSES
from kbroker.protocol.schema import Struct
from kbroker.protocol.types import ZERO_UUID, FileRegions, ProtocolError
from kbroker.protocol.errors import Errors

KP = {
    0: (ProduceRequest, ProduceResponse), 1: (FetchRequest, FetchResponse),
    2: (ListOffsetsRequest, ListOffsetsResponse), 3: (MetadataRequest, MetadataResponse),
    8: (OffsetCommitRequest, OffsetCommitResponse), 9: (OffsetFetchRequest, OffsetFetchResponse),
    10: (FindCoordinatorRequest, FindCoordinatorResponse), 11: (JoinGroupRequest, JoinGroupResponse),
    12: (HeartbeatRequest, HeartbeatResponse), 13: (LeaveGroupRequest, LeaveGroupResponse),
    14: (SyncGroupRequest, SyncGroupResponse), 15: (DescribeGroupsRequest, DescribeGroupsResponse),
    16: (ListGroupsRequest, ListGroupsResponse), 17: (SaslHandshakeRequest, SaslHandshakeResponse),
    18: (ApiVersionsRequest, ApiVersionsResponse), 19: (CreateTopicsRequest, CreateTopicsResponse),
    20: (DeleteTopicsRequest, DeleteTopicsResponse), 21: (DeleteRecordsRequest, DeleteRecordsResponse),
    22: (InitProducerIdRequest, InitProducerIdResponse),
    23: (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
    32: (DescribeConfigsRequest, DescribeConfigsResponse), 33: (AlterConfigsRequest, AlterConfigsResponse),
    36: (SaslAuthenticateRequest, SaslAuthenticateResponse),
    37: (CreatePartitionsRequest, CreatePartitionsResponse),
    42: (DeleteGroupsRequest, DeleteGroupsResponse),
    44: (IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse),
    60: (DescribeClusterRequest, DescribeClusterResponse),
}
MUST_COVER = {18, 3, 0, 1, 2, 22, 23, 19, 20, 37, 32, 44, 10, 11, 14, 8, 9}


def _in(rng, v):
    return rng is not None and rng[0] <= v <= rng[1]


def shared_versions(key):
    """Versions in our range that kafka-python's JSON also defines."""
    ours = REQUESTS[key].valid
    theirs = KP[key][0]._valid_versions
    return [v for v in range(ours[0], ours[1] + 1) if _in(theirs, v)]


CASES = [(k, v) for k in sorted(KP) for v in shared_versions(k)]


# ---- populated values ------------------------------------------------------------------------------

_INT_RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}
_TEXT = "abcxyz-._ é漢🙂"


def _present(f, version, flexible):
    tagged = f.tag is not None and flexible and _in(f.tagged, version)
    return tagged, (tagged or (_in(f.versions, version) and f.tag is None))


def gen_struct(fields, version, flexible, rng):
    obj = {}
    for f in fields:
        tagged, present = _present(f, version, flexible)
        if present:
            obj[f.name] = gen_value(f, version, flexible, rng, non_default=tagged)
    return obj


def gen_value(f, version, flexible, rng, non_default=False):
    """A random value for field f; non_default (tagged fields) keeps it from being omitted on encode."""
    nullable = _in(f.nullable, version)
    if nullable and not non_default and rng.random() < 0.2:
        return None
    t = f.type
    if isinstance(t, Struct):
        return gen_struct(t.fields, version, flexible, rng)
    if isinstance(t, list):
        n = rng.randint(1 if non_default else 0, 2)
        return [gen_struct(t, version, flexible, rng) for _ in range(n)]
    if t.startswith("[]"):
        n = rng.randint(1 if non_default else 0, 3)
        return [_prim(t[2:], rng) for _ in range(n)]
    v = _prim(t, rng)
    if non_default:
        while v == f.default_value(version):
            v = _prim(t, rng)
    return v


def _prim(t, rng):
    if t in _INT_RANGES:
        b = _INT_RANGES[t]
        return rng.choice([rng.randint(-(1 << b), (1 << b) - 1), rng.randint(-2, min(300, (1 << b) - 1))])
    if t == "uint16":
        return rng.randint(0, 0xFFFF)
    if t == "bool":
        return rng.random() < 0.5
    if t == "string":
        return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, 12)))
    if t in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 40))
    if t == "uuid":
        return rng.randbytes(16)
    if t == "float64":
        return rng.choice([0.0, rng.uniform(-1e12, 1e12), float(rng.randint(0, 1 << 40))])
    raise AssertionError(t)


def populated(schema, version, seed):
    rng = random.Random(f"{schema.name}-{version}-{seed}")
    body = gen_struct(schema.fields, version, schema.is_flexible(version), rng)
    if schema.name == "ApiVersionsResponse":
        body["error_code"] = 0  # kafka-python decodes error bodies as v0 (KIP-511)
    return body


# ---- conversion to and from kafka-python's data classes ------------------------------------------

def _kp_field(kp_fields, name):
    if name in kp_fields:
        return name, kp_fields[name]
    # kafka-python renames *_authorized_operations to authorized_operations (a bitfield set)
    assert name.endswith("authorized_operations"), name
    return "authorized_operations", kp_fields["authorized_operations"]


def _is_bitfield(kp_field):
    return getattr(kp_field, "_type_str", None) == "bitfield"


def to_kp(fields, obj, kp_fields, version, flexible, make):
    kw = {}
    for f in fields:
        if f.name not in obj:
            continue
        name, kf = _kp_field(kp_fields, f.name)
        kw[name] = _val_to_kp(f, obj[f.name], kf, version, flexible)
    return make(**kw)


def _val_to_kp(f, v, kf, version, flexible):
    if v is None:
        return None
    t = f.type
    if isinstance(t, Struct):
        return to_kp(t.fields, v, kf.fields, version, flexible, kf.data_class)
    if isinstance(t, list):
        return [to_kp(t, e, kf.fields, version, flexible, kf.data_class) for e in v]
    if t == "uuid":
        return uuid.UUID(bytes=v)
    if _is_bitfield(kf):
        return BitField.from_32_bit_field(v & 0xFFFFFFFF)
    return v


def from_kp(fields, kp_obj, version, flexible):
    out = {}
    kp_fields = kp_obj._struct.fields
    for f in fields:
        _tagged, present = _present(f, version, flexible)
        if not present:
            continue
        name, kf = _kp_field(kp_fields, f.name)
        out[f.name] = _val_from_kp(f, getattr(kp_obj, name), kf, version, flexible)
    return out


def _val_from_kp(f, v, kf, version, flexible):
    t = f.type
    if _is_bitfield(kf):
        return -0x80000000 if v is None else struct.unpack(">i", struct.pack(">I", BitField.to_32_bit_field(v)))[0]
    if v is None:
        return ZERO_UUID if t == "uuid" else None
    if isinstance(t, Struct):
        return from_kp(t.fields, v, version, flexible)
    if isinstance(t, list):
        return [from_kp(t, e, version, flexible) for e in v]
    if t == "uuid":
        return v.bytes
    if isinstance(v, (memoryview, bytearray)):
        return bytes(v)
    return v


def present(schema, body, version):
    """Our decoded dict restricted to the fields the version carries (decode also fills the rest)."""
    return _project(schema.fields, body, version, schema.is_flexible(version))


def _project(fields, obj, version, flexible):
    out = {}
    for f in fields:
        if not _present(f, version, flexible)[1]:
            continue
        v = obj[f.name]
        if isinstance(f.type, Struct) and v is not None:
            v = _project(f.type.fields, v, version, flexible)
        elif isinstance(f.type, list) and v is not None:
            v = [_project(f.type, e, version, flexible) for e in v]
        out[f.name] = v
    return out


def norm(v):
    """Our decoded values, comparable with generated ones: views become bytes."""
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, (memoryview, bytearray)):
        return bytes(v)
    return v


def kp_message(cls, schema, body, version):
    flexible = schema.is_flexible(version)
    return to_kp(schema.fields, body, cls._struct.fields, version, flexible,
                 lambda **kw: cls(version=version, **kw))


# ---- the cross-checks ----------------------------------------------------------------------------

def test_cross_check_covers_the_required_apis():
    covered = {k for k, _v in CASES}
    assert MUST_COVER <= covered
    for k in MUST_COVER:  # and most of each range (kafka-python 3.0 dropped only the oldest versions)
        assert len(shared_versions(k)) >= 2, k


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("key,version", CASES)
def test_request_against_kafka_python(key, version, seed):
    schema = REQUESTS[key]
    kp_cls = KP[key][0]
    body = populated(schema, version, seed)
    ours = api.encode_request(key, version, 7 + seed, "kbroker-test", body)

    decoded = kp_cls.decode(ours, version=version, header=True, framed=True)
    assert decoded.header.request_api_key == key
    assert decoded.header.request_api_version == version
    assert decoded.header.correlation_id == 7 + seed
    assert decoded.header.client_id == "kbroker-test"
    assert from_kp(schema.fields, decoded, version, schema.is_flexible(version)) == body

    msg = kp_message(kp_cls, schema, body, version)
    msg.with_header(correlation_id=7 + seed, client_id="kbroker-test")
    theirs = msg.encode(header=True, framed=True)
    assert bytes(theirs) == ours

    frame = memoryview(bytearray(theirs))[4:]
    header, pos = api.parse_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
        (key, version, 7 + seed, "kbroker-test")
    assert norm(present(schema, api.decode_request(key, version, frame, pos), version)) == body


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("key,version", CASES)
def test_response_against_kafka_python(key, version, seed):
    schema = RESPONSES[key]
    kp_cls = KP[key][1]
    body = populated(schema, version, seed)
    ours = b"".join(api.encode_response(key, version, 99 + seed, body))

    decoded = kp_cls.decode(ours, version=version, header=True, framed=True)
    assert decoded.header.correlation_id == 99 + seed
    assert from_kp(schema.fields, decoded, version, schema.is_flexible(version)) == body

    msg = kp_message(kp_cls, schema, body, version)
    msg.with_header(correlation_id=99 + seed)
    theirs = bytes(msg.encode(header=True, framed=True))
    assert theirs == ours

    corr, got = api.decode_response(key, version, memoryview(theirs)[4:])
    assert corr == 99 + seed
    assert norm(present(schema, got, version)) == body


@pytest.mark.parametrize("key", sorted(REQUESTS))
def test_own_round_trip_every_version(key):
    """Every version of every API (including those kafka-python cannot speak) round-trips."""
    for version in range(REQUESTS[key].valid[0], REQUESTS[key].valid[1] + 1):
        for seed in range(3):
            req = populated(REQUESTS[key], version, seed)
            frame = memoryview(api.encode_request(key, version, 1, None, req))[4:]
            header, pos = api.parse_request_header(frame)
            assert header.client_id is None
            assert norm(present(REQUESTS[key], api.decode_request(key, version, frame, pos), version)) == req
            resp = populated(RESPONSES[key], version, seed)
            data = b"".join(api.encode_response(key, version, 2, resp))
            assert struct.unpack_from(">i", data)[0] == len(data) - 4
            assert norm(present(RESPONSES[key], api.decode_response(key, version, memoryview(data)[4:])[1], version)) == resp


def test_decode_fills_defaults_of_absent_fields():
    body = api.decode_request(1, 4, *_header_and_pos(api.encode_request(1, 4, 1, "c", {
        "max_wait_ms": 500, "min_bytes": 1, "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "fetch_offset": 5, "partition_max_bytes": 1024}]}]})))
    part = body["topics"][0]["partitions"][0]
    assert part["current_leader_epoch"] == -1 and part["log_start_offset"] == -1
    assert body["replica_id"] == -1 and body["session_epoch"] == -1
    assert body["replica_state"] == {"replica_id": -1, "replica_epoch": -1}


def _header_and_pos(frame_bytes):
    frame = memoryview(bytearray(frame_bytes))[4:]
    header, pos = api.parse_request_header(frame)
    return frame, pos


# ---- header rules --------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(REQUESTS))
def test_request_header_v2_only_for_flexible_versions(key):
    schema = REQUESTS[key]
    for version in range(schema.valid[0], schema.valid[1] + 1):
        frame = api.encode_request(key, version, 5, "abc", {})
        # size, key, version, correlation id, client_id (int16 length even in v2)
        assert struct.unpack_from(">ihhih", frame) == (len(frame) - 4, key, version, 5, 3)
        assert frame[14:17] == b"abc"
        header, pos = api.parse_request_header(memoryview(frame)[4:])
        expected = 13 + (1 if schema.is_flexible(version) else 0)
        assert pos == expected, (schema.name, version)
        if schema.is_flexible(version):
            assert frame[17] == 0  # empty header TAG_BUFFER


@pytest.mark.parametrize("key", sorted(RESPONSES))
def test_response_header_v1_only_for_flexible_versions_except_api_versions(key):
    schema = RESPONSES[key]
    for version in range(schema.valid[0], schema.valid[1] + 1):
        body = populated(schema, version, 0)
        data = b"".join(api.encode_response(key, version, 77, body))
        out_without_header = _body_bytes(schema, version, body)
        header_len = len(data) - 4 - len(out_without_header)
        flexible_header = schema.is_flexible(version) and key != api.API_VERSIONS
        assert header_len == (5 if flexible_header else 4), (schema.name, version)
        assert struct.unpack_from(">i", data, 4)[0] == 77


def _body_bytes(schema, version, body):
    from kbroker.protocol import types as T
    out = T.Out()
    schema.encode_into(out, body, version)
    return b"".join(out.finish())


def test_api_versions_v3_response_header_is_v0_and_kafka_python_reads_it():
    body = {"error_code": 0, "api_keys": [{"api_key": 3, "min_version": 0, "max_version": 12}],
            "throttle_time_ms": 0}
    data = b"".join(api.encode_response(18, 3, 12345, body))
    assert data[4:8] == struct.pack(">i", 12345)
    assert data[8:10] == b"\0\0"  # error_code follows the correlation id directly
    decoded = ApiVersionsResponse.decode(data, version=3, header=True, framed=True)
    assert decoded.api_keys[0].max_version == 12


def test_kip511_fallback_is_a_v0_error_response():
    data = api.encode_api_versions_fallback(4242)
    assert struct.unpack_from(">ii", data) == (len(data) - 4, 4242)
    # A client that sent v4 reads it (kafka-python switches to v0 when error_code != 0).
    decoded = ApiVersionsResponse.decode(data, version=4, header=True, framed=True)
    assert decoded.header.correlation_id == 4242
    assert decoded.error_code == Errors.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version) for k in decoded.api_keys] == [(18, 0)]
    assert decoded.api_keys[0].max_version >= 3
    # and it is exactly a v0 body: error, one-element array, nothing else
    assert len(data) == 4 + 4 + 2 + 4 + 6


# ---- records: zero copy and file regions ---------------------------------------------------------

def test_produce_records_decode_to_views_into_the_frame():
    batch = bytes(range(70))
    frame_bytes = api.encode_request(0, 8, 1, "p", {"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}, {"index": 1, "records": None}]}]})
    buf = bytearray(frame_bytes)
    frame = memoryview(buf)[4:]
    header, pos = api.parse_request_header(frame)
    body = api.decode_request(0, 8, frame, pos)
    parts = body["topic_data"][0]["partition_data"]
    rec = parts[0]["records"]
    assert isinstance(rec, memoryview) and rec.obj is buf
    assert bytes(rec) == batch
    assert parts[1]["records"] is None
    start = frame_bytes.index(batch)
    buf[start] = 0xEE  # the view sees writes to the receive buffer: no copy was made
    assert rec[0] == 0xEE


def test_flexible_produce_records_are_views_too():
    batch = b"\x01" * 300
    buf = bytearray(api.encode_request(0, 11, 1, "p", {"acks": 1, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}))
    frame = memoryview(buf)[4:]
    _h, pos = api.parse_request_header(frame)
    rec = api.decode_request(0, 11, frame, pos)["topic_data"][0]["partition_data"][0]["records"]
    assert isinstance(rec, memoryview) and rec.obj is buf and bytes(rec) == batch


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_fetch_response_with_file_regions(tmp_path, version):
    data = os.urandom(5000)
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        regions = FileRegions([(fd, 100, 1000), (fd, 3000, 1500)])
        regions.add(fd, 0, 10)
        tail_regions = FileRegions([(fd, 4990, 10)])
        body = {"responses": [{"topic": "t", "topic_id": bytes(16), "partitions": [
            {"partition_index": 0, "high_watermark": 9, "records": regions},
            {"partition_index": 1, "high_watermark": 3, "records": b"inline"},
            {"partition_index": 2, "high_watermark": 1, "records": tail_regions},
        ]}]}
        chunks = api.encode_response(1, version, 31, body)
        assert any(c is regions for c in chunks) and any(c is tail_regions for c in chunks)
        total = sum(c.size if isinstance(c, FileRegions) else len(c) for c in chunks)
        assert struct.unpack_from(">i", chunks[0])[0] == total - 4
        # what the network layer puts on the wire: bytes as they are, regions read from the file
        wire = b"".join(
            b"".join(os.pread(f, n, p) for f, p, n in c.regions) if isinstance(c, FileRegions) else bytes(c)
            for c in chunks)
        assert len(wire) == total
        decoded = FetchResponse.decode(wire, version=version, header=True, framed=True)
        parts = decoded.responses[0].partitions
        assert bytes(parts[0].records) == data[100:1100] + data[3000:4500] + data[:10]
        assert bytes(parts[1].records) == b"inline"
        assert bytes(parts[2].records) == data[4990:]
        _corr, ours = api.decode_response(1, version, memoryview(wire)[4:])
        assert bytes(ours["responses"][0]["partitions"][0]["records"]) == data[100:1100] + data[3000:4500] + data[:10]
    finally:
        os.close(fd)


# ---- hostile input -------------------------------------------------------------------------------

def _decode_frame(frame):
    header, pos = api.parse_request_header(frame)
    return api.decode_request(header.api_key, header.api_version, frame, pos)


REQUEST_CASES = [(k, v) for k in sorted(REQUESTS) for v in range(REQUESTS[k].valid[0], REQUESTS[k].valid[1] + 1)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(REQUEST_CASES), seed=st.integers(0, 5), data=st.data())
def test_truncated_request_frames_raise_only_protocol_error(case, seed, data):
    key, version = case
    body = populated(REQUESTS[key], version, seed)
    frame = api.encode_request(key, version, 1, "c", body)[4:]
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        _decode_frame(memoryview(frame[:cut]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(REQUEST_CASES), seed=st.integers(0, 5), data=st.data())
def test_mutated_request_frames_raise_only_protocol_error(case, seed, data):
    key, version = case
    body = populated(REQUESTS[key], version, seed)
    frame = bytearray(api.encode_request(key, version, 1, "c", body)[4:])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        frame += data.draw(st.binary(max_size=8))
    try:
        _decode_frame(memoryview(frame))
    except ProtocolError:
        pass


@given(st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_random_bytes_raise_only_protocol_error(blob):
    try:
        _decode_frame(memoryview(blob))
    except ProtocolError:
        pass


def _peak_during(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def _expect_protocol_error(frame):
    def run():
        with pytest.raises(ProtocolError):
            _decode_frame(memoryview(frame))
    return run


def test_hostile_array_length_classic():
    # Metadata v1 (non-flexible): topics int32 count = 2^31-1 in a 20-byte frame
    frame = struct.pack(">hhih", 3, 1, 1, 0) + struct.pack(">i", 0x7FFFFFFF) + b"\0" * 6
    assert len(frame) == 20
    assert _peak_during(_expect_protocol_error(frame)) < 64 * 1024


def test_hostile_array_length_flexible_and_primitive_arrays():
    # Metadata v12 (flexible): compact array count 2^32 (uvarint) in a small frame
    frame = struct.pack(">hhih", 3, 12, 1, 0) + b"\0" + b"\xff\xff\xff\xff\x0f" + b"\0" * 4
    assert _peak_during(_expect_protocol_error(frame)) < 64 * 1024
    # DeleteGroups v1: []string count 2^31-1
    frame = struct.pack(">hhih", 42, 1, 1, 0) + struct.pack(">i", 0x7FFFFFFF) + b"\0" * 6
    assert _peak_during(_expect_protocol_error(frame)) < 64 * 1024
    # Produce v8: records length 2^31-1 inside a tiny frame
    frame = (struct.pack(">hhih", 0, 8, 1, 0) + struct.pack(">hhi", -1, 1, 0) + struct.pack(">i", 1)
             + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1) + struct.pack(">ii", 0, 0x7FFFFFFF))
    assert _peak_during(_expect_protocol_error(frame)) < 64 * 1024


def test_short_headers_raise_protocol_error():
    full = api.encode_request(3, 1, 1, "client", {"topics": None})[4:]
    for cut in range(len(full)):
        with pytest.raises(ProtocolError):
            _decode_frame(memoryview(full[:cut]))


def test_unknown_api_key_and_version():
    with pytest.raises(ProtocolError):
        api.parse_request_header(memoryview(struct.pack(">hhih", 999, 0, 1, -1)))
    frame = memoryview(struct.pack(">hhih", 3, 99, 1, -1) + b"\0")
    with pytest.raises(ProtocolError):
        _decode_frame(frame)
    with pytest.raises(ProtocolError):
        api.decode_request(999, 0, memoryview(b""), 0)


def test_null_defaults_hold_in_versions_without_the_field():
    # JSON "default": "null": an old JoinGroup must not look like a static member ("" != None)
    join = api.decode_request(11, 4, *_header_and_pos(api.encode_request(11, 4, 1, "c", {
        "group_id": "g", "session_timeout_ms": 10000, "member_id": "", "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"x"}]})))
    assert join["group_instance_id"] is None and join["reason"] is None
    produce = api.decode_request(0, 2, *_header_and_pos(api.encode_request(0, 2, 1, "c", {
        "acks": 1, "timeout_ms": 5, "topic_data": []})))
    assert produce["transactional_id"] is None
    # a field that is merely nullable without a null default keeps the type's zero where absent
    fetch = api.decode_request(1, 11, *_header_and_pos(api.encode_request(1, 11, 1, "c", {})))
    assert fetch["cluster_id"] is None and fetch["rack_id"] == ""


def test_metadata_v11_plus_tolerates_librdkafkas_trailing_bytes_other_requests_do_not():
    """librdkafka's all-topics Metadata v12 body as sent on the wire (topics null, two false flags, no tags,
    then three more bytes): read as Kafka reads it. Trailing bytes after any other body still refuse it."""
    from kbroker.protocol import api
    from kbroker.protocol.types import ProtocolError as PE
    body = bytes.fromhex("00000000010000")
    assert api.decode_request(3, 12, body, 0) == {
        "topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False,
        "include_cluster_authorized_operations": False}
    with pytest.raises(PE, match="trailing"):
        api.decode_request(3, 9, bytes.fromhex("0000000000ff"), 0)
    with pytest.raises(PE, match="trailing"):
        api.decode_request(10, 0, bytes.fromhex("00016100"), 0)     # FindCoordinator v0 "a" + one byte
