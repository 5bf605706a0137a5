"""Framing of whole requests and responses: headers, API keys and the advertised versions.

Header rules (KIP-482/511): request header v2 (client_id still an int16 string, then a TAG_BUFFER) is
used exactly when the *request* version is flexible; response header v1 (a TAG_BUFFER after the
correlation id) exactly when the response version is flexible — except ApiVersions, whose response
header is always v0 so a client that guessed a version too new can still read the error.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from . import types as T
from .errors import Errors
from .messages import REQUESTS, RESPONSES, API_NAMES
from .types import FileRegions, ProtocolError


class ApiKey(enum.IntEnum):
    """Kafka's API keys (the names of ``org.apache.kafka.common.protocol.ApiKeys``) for every API we
    have a schema for."""
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


API_VERSIONS = ApiKey.API_VERSIONS

# What ApiVersions advertises, api_key -> (min, max). Filled once, at import of kbroker.server.apis,
# from its handler table (the only place an API's versions are declared); connections check request
# versions against it.
SUPPORTED: dict[int, tuple[int, int]] = {}

# Produce versions we actually serve; lower advertised versions get UNSUPPORTED_VERSION.
PRODUCE_MIN_SERVED = 3


def check_range(api_key: int, lo: int, hi: int) -> None:
    """Refuse a declared version range outside the API's schema (or an API without a schema)."""
    schema = REQUESTS.get(api_key)
    if schema is None:
        raise ValueError(f"api key {api_key} has no schema")
    valid = schema.valid
    if lo > hi or lo < valid[0] or hi > valid[1]:
        raise ValueError(f"{API_NAMES[api_key]} {lo}-{hi} outside its schema range {valid}")


def advertise(api_key: int, lo: int, hi: int) -> None:
    """Advertise one API outside the broker's table: for a KafkaServer wired with handlers of its
    own (network tests). The broker's APIs are declared only in kbroker.server.apis.TABLE."""
    check_range(api_key, lo, hi)
    SUPPORTED[api_key] = (lo, hi)


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


_HDR = struct.Struct(">hhi")


def parse_request_header(buf) -> tuple[RequestHeader, int]:
    """Parse the header at the start of a frame (size prefix already removed).

    Raises ProtocolError for a truncated header or an API key we have no schema for: the caller closes
    the connection, as Kafka does, because no valid response can be addressed.
    """
    if len(buf) < 8:
        raise ProtocolError("truncated request header")
    api_key, version, correlation_id = _HDR.unpack_from(buf, 0)
    schema = REQUESTS.get(api_key)
    if schema is None:
        raise ProtocolError(f"unknown api key {api_key}")
    try:
        client_id, pos = T.read_nullable_string(buf, 8)
        if schema.is_flexible(version) and api_key != API_VERSIONS:
            pos = _skip_tags(buf, pos)
        elif api_key == API_VERSIONS and version >= 3 and version <= schema.valid[1]:
            pos = _skip_tags(buf, pos)
    except struct.error:  # a frame of 8 or 9 bytes: client_id length cut off
        raise ProtocolError("truncated request header") from None
    return RequestHeader(api_key, version, correlation_id, client_id), pos


def _skip_tags(buf, pos):
    n, pos = T.read_uvarint(buf, pos)
    for _ in range(n):
        _tag, pos = T.read_uvarint(buf, pos)
        size, pos = T.read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise ProtocolError("header tag past the end of the frame")
    return pos


def decode_request(api_key: int, version: int, buf, pos: int) -> dict:
    schema = REQUESTS.get(api_key)
    if schema is None:
        raise ProtocolError(f"unknown api key {api_key}")
    body, end = schema.decode(buf, pos, version)
    if end != len(buf) and not (api_key == _METADATA and version >= 11):
        raise ProtocolError(f"{schema.name} v{version}: {len(buf) - end} trailing bytes")
    return body


# librdkafka's all-topics Metadata request from v11 on carries three bytes after the body's tagged
# fields; Kafka's request reader stops at the end of the body and never looks at them.
_METADATA = 3


def encode_response(api_key: int, version: int, correlation_id: int, body: dict) -> list:
    """-> chunks (bytes and FileRegions) of the whole response, size prefix included."""
    schema = RESPONSES[api_key]
    out = T.Out()
    out.buf += b"\0\0\0\0"  # size, patched below
    T.write_int32(out, correlation_id)
    if schema.is_flexible(version) and api_key != API_VERSIONS:
        out.buf.append(0)  # empty header TAG_BUFFER
    schema.encode_into(out, body, version)
    chunks = out.finish()
    size = sum(c.size if isinstance(c, FileRegions) else len(c) for c in chunks) - 4
    struct.pack_into(">i", chunks[0], 0, size)  # chunks[0] is the bytearray holding the header
    return chunks


def encode_api_versions_fallback(correlation_id: int) -> bytes:
    """KIP-511: an ApiVersions request of a version we do not know gets a v0 answer carrying
    UNSUPPORTED_VERSION and our ApiVersions range, so the client retries with a version we speak."""
    lo, hi = SUPPORTED.get(API_VERSIONS, (0, 3))
    return b"".join(encode_response(API_VERSIONS, 0, correlation_id, {
        "error_code": Errors.UNSUPPORTED_VERSION,
        "api_keys": [{"api_key": API_VERSIONS, "min_version": lo, "max_version": hi}],
    }))


def encode_request(api_key: int, version: int, correlation_id: int, client_id: str | None, body: dict) -> bytes:
    schema = REQUESTS[api_key]
    out = T.Out()
    out.buf += b"\0\0\0\0"
    out.buf += _HDR.pack(api_key, version, correlation_id)
    T.write_nullable_string(out, client_id)
    if schema.is_flexible(version):
        out.buf.append(0)
    schema.encode_into(out, body, version)
    data = out.finish()
    if len(data) != 1:
        raise ValueError("requests cannot carry file regions")
    frame = data[0]
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


def decode_response(api_key: int, version: int, buf) -> tuple[int, dict]:
    """Decode a response frame (size prefix removed) -> (correlation_id, body)."""
    schema = RESPONSES[api_key]
    correlation_id, pos = T.read_int32(buf, 0)
    if schema.is_flexible(version) and api_key != API_VERSIONS:
        pos = _skip_tags(buf, pos)
    body, _end = schema.decode(buf, pos, version)
    return correlation_id, body
