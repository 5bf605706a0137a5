"""Framing of whole requests and responses: headers, the API registry and the advertised versions.

Header rules (KIP-482/511): request header v2 (client_id still an int16 string, then a TAG_BUFFER) is
used exactly when the *request* version is flexible; response header v1 (a TAG_BUFFER after the
correlation id) exactly when the response version is flexible — except ApiVersions, whose response
header is always v0 so a client that guessed a version too new can still read the error.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from . import types as T
from .messages import REQUESTS, RESPONSES, API_NAMES
from .types import FileRegions, ProtocolError

API_VERSIONS = 18

# What ApiVersions advertises (facts §1.2 "rec." ranges): every client we support negotiates
# inside these without any flexible version except ApiVersions v3. Produce is advertised from v0
# because librdkafka < 2.x fix disables compression when Produce's min version is > 0; v0-2 are
# refused at request time (they cannot carry magic-2 batches).
SUPPORTED: dict[int, tuple[int, int]] = {}

# Produce versions we actually serve; lower advertised versions get UNSUPPORTED_VERSION.
PRODUCE_MIN_SERVED = 3


def advertise(api_key: int, lo: int, hi: int) -> None:
    """Register an API as implemented; called by the broker for each handler it wires up."""
    valid = REQUESTS[api_key].valid
    if lo < valid[0] or hi > valid[1]:
        raise ValueError(f"{API_NAMES[api_key]} {lo}-{hi} outside its schema range {valid}")
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
    if end != len(buf):
        raise ProtocolError(f"{schema.name} v{version}: {len(buf) - end} trailing bytes")
    return body


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
        "error_code": 35,
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
