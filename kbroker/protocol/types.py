"""Primitive wire types of the Kafka protocol (big-endian) and the two flexible-version encodings.

Readers are plain functions ``read(buf, pos) -> (value, pos)`` over a memoryview; writers append to
an ``Out`` buffer. Every reader checks bounds before slicing or allocating, so a hostile length can never
make us allocate more than the frame already holds: malformed input raises ``ProtocolError``.
"""
from __future__ import annotations

import struct


class ProtocolError(Exception):
    """The bytes do not form a valid message of the expected schema (Kafka's InvalidRequestException)."""


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")


class FileRegions:
    """Records that live in segment files: ``(fd, position, length)`` ranges sent with sendfile.

    The encoder cannot inline these; it splits the response into chunks around them and the network
    layer writes the chunks in order. ``size`` is promised in the response's length fields up front,
    so a short sendfile (file truncated underneath) must close the connection.
    """

    __slots__ = ("regions", "size")

    def __init__(self, regions=None):
        self.regions = list(regions) if regions else []
        self.size = sum(r[2] for r in self.regions)

    @classmethod
    def of(cls, regions: list, size: int) -> "FileRegions":
        """Wrap a list of ranges whose total ``size`` the caller already knows (the fetch path: the log
        hands both back), without copying the list or summing it again."""
        fr = cls.__new__(cls)
        fr.regions = regions
        fr.size = size
        return fr

    def add(self, fd: int, position: int, length: int) -> None:
        self.regions.append((fd, position, length))
        self.size += length

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"FileRegions({self.regions!r})"


class Out:
    """Response/request being built: a list of finished chunks plus the bytearray being filled."""

    __slots__ = ("buf", "chunks")

    def __init__(self):
        self.buf = bytearray()
        self.chunks = []

    def regions(self, fr: FileRegions) -> None:
        if self.buf:
            self.chunks.append(self.buf)  # a fresh bytearray follows, so no copy is needed
            self.buf = bytearray()
        self.chunks.append(fr)

    def finish(self) -> list:
        if self.buf or not self.chunks:
            self.chunks.append(self.buf)
            self.buf = bytearray()
        return self.chunks


def _need(buf, pos: int, n: int) -> int:
    end = pos + n
    if n < 0 or end > len(buf):
        raise ProtocolError(f"need {n} bytes at {pos}, frame has {len(buf)}")
    return end


# ---- fixed-width ----------------------------------------------------------------------------------

def read_int8(buf, pos):
    return _I8.unpack_from(buf, pos)[0], pos + 1


def read_bool(buf, pos):
    return _I8.unpack_from(buf, pos)[0] != 0, pos + 1


def read_int16(buf, pos):
    return _I16.unpack_from(buf, pos)[0], pos + 2


def read_uint16(buf, pos):
    return _U16.unpack_from(buf, pos)[0], pos + 2


def read_int32(buf, pos):
    return _I32.unpack_from(buf, pos)[0], pos + 4


def read_uint32(buf, pos):
    return _U32.unpack_from(buf, pos)[0], pos + 4


def read_int64(buf, pos):
    return _I64.unpack_from(buf, pos)[0], pos + 8


def read_float64(buf, pos):
    return _F64.unpack_from(buf, pos)[0], pos + 8


def read_uuid(buf, pos):
    end = _need(buf, pos, 16)
    return bytes(buf[pos:end]), end


def write_int8(out, v):
    out.buf += _I8.pack(v)


def write_bool(out, v):
    out.buf.append(1 if v else 0)


def write_int16(out, v):
    out.buf += _I16.pack(v)


def write_uint16(out, v):
    out.buf += _U16.pack(v)


def write_int32(out, v):
    out.buf += _I32.pack(v)


def write_uint32(out, v):
    out.buf += _U32.pack(v)


def write_int64(out, v):
    out.buf += _I64.pack(v)


def write_float64(out, v):
    out.buf += _F64.pack(v)


ZERO_UUID = bytes(16)


def write_uuid(out, v):
    v = v or ZERO_UUID
    if len(v) != 16:
        raise ValueError("uuid must be 16 bytes")
    out.buf += v


# ---- varints (flexible versions use *unsigned* varints; records use zigzag) ----------------------

def read_uvarint(buf, pos):
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise ProtocolError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("unsigned varint longer than 5 bytes")


def _append_base128(b: bytearray, v: int) -> None:
    while v >= 0x80:
        b.append((v & 0x7F) | 0x80)
        v >>= 7
    b.append(v)


def write_uvarint(out, v):
    if v < 0:
        raise ValueError("unsigned varint must be >= 0")
    _append_base128(out.buf, v)


def uvarint_bytes(v: int) -> bytes:
    """An unsigned varint (base 128, low group first) on its own."""
    if v < 0:
        raise ValueError("unsigned varint must be >= 0")
    b = bytearray()
    _append_base128(b, v)
    return bytes(b)


def varint_bytes(v: int) -> bytes:
    """A record field's varint/varlong: zigzag (protobuf sint64; small magnitudes of either sign stay
    short), then an unsigned varint."""
    return uvarint_bytes((v << 1) ^ (v >> 63))


# ---- strings / bytes / records: classic (int16/int32 length) and compact (uvarint len+1) ---------

def _decode_str(buf, pos, end):
    try:
        return str(buf[pos:end], "utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"invalid UTF-8 string: {e}") from None


def read_string(buf, pos):
    n, pos = read_int16(buf, pos)
    if n < 0:
        raise ProtocolError("null in non-nullable string")
    end = _need(buf, pos, n)
    return _decode_str(buf, pos, end), end


def read_nullable_string(buf, pos):
    n, pos = read_int16(buf, pos)
    if n < 0:
        return None, pos
    end = _need(buf, pos, n)
    return _decode_str(buf, pos, end), end


def read_compact_string(buf, pos):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise ProtocolError("null in non-nullable compact string")
    end = _need(buf, pos, n - 1)
    return _decode_str(buf, pos, end), end


def read_compact_nullable_string(buf, pos):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = _need(buf, pos, n - 1)
    return _decode_str(buf, pos, end), end


def write_string(out, v):
    if v is None:
        raise ValueError("null in non-nullable string")
    data = v.encode("utf-8")
    out.buf += _I16.pack(len(data))
    out.buf += data


def write_nullable_string(out, v):
    if v is None:
        out.buf += b"\xff\xff"
        return
    write_string(out, v)


def write_compact_string(out, v):
    if v is None:
        raise ValueError("null in non-nullable compact string")
    data = v.encode("utf-8")
    write_uvarint(out, len(data) + 1)
    out.buf += data


def write_compact_nullable_string(out, v):
    if v is None:
        out.buf.append(0)
        return
    write_compact_string(out, v)


def read_bytes(buf, pos):
    n, pos = read_int32(buf, pos)
    if n < 0:
        raise ProtocolError("null in non-nullable bytes")
    end = _need(buf, pos, n)
    return bytes(buf[pos:end]), end


def read_nullable_bytes(buf, pos):
    n, pos = read_int32(buf, pos)
    if n < 0:
        return None, pos
    end = _need(buf, pos, n)
    return bytes(buf[pos:end]), end


def read_compact_bytes(buf, pos):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise ProtocolError("null in non-nullable compact bytes")
    end = _need(buf, pos, n - 1)
    return bytes(buf[pos:end]), end


def read_compact_nullable_bytes(buf, pos):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = _need(buf, pos, n - 1)
    return bytes(buf[pos:end]), end


def read_records(buf, pos):
    """Records stay a view into the request frame: produce batches are stamped and written from it."""
    n, pos = read_int32(buf, pos)
    if n < 0:
        return None, pos
    end = _need(buf, pos, n)
    return buf[pos:end], end


def read_compact_records(buf, pos):
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = _need(buf, pos, n - 1)
    return buf[pos:end], end


def write_bytes(out, v):
    if v is None:
        raise ValueError("null in non-nullable bytes")
    out.buf += _I32.pack(len(v))
    out.buf += v


def write_nullable_bytes(out, v):
    if v is None:
        out.buf += b"\xff\xff\xff\xff"
        return
    write_bytes(out, v)


def write_compact_bytes(out, v):
    if v is None:
        raise ValueError("null in non-nullable compact bytes")
    write_uvarint(out, len(v) + 1)
    out.buf += v


def write_compact_nullable_bytes(out, v):
    if v is None:
        out.buf.append(0)
        return
    write_compact_bytes(out, v)


def write_records(out, v):
    if v is None:
        out.buf += b"\xff\xff\xff\xff"
    elif isinstance(v, FileRegions):
        out.buf += _I32.pack(v.size)
        out.regions(v)
    else:
        out.buf += _I32.pack(len(v))
        out.buf += v


def write_compact_records(out, v):
    if v is None:
        out.buf.append(0)
    elif isinstance(v, FileRegions):
        write_uvarint(out, v.size + 1)
        out.regions(v)
    else:
        write_uvarint(out, len(v) + 1)
        out.buf += v
