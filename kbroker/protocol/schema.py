"""Declarative message schemas compiled into per-version encoders and decoders.

A message is a list of ``Field``s, mirroring the structure of Kafka's JSON message definitions:
each field has a type, the versions it exists in, the versions in which it may be null, and an
optional tag (tagged fields live in the trailing TAG_BUFFER of flexible versions). ``Schema.decoder(v)``
and ``Schema.encoder(v)`` compile, once per version, straight-line decoders (generated source, fixed-width runs unpacked at
once) and a flat list of writer closures, with every absent/tagged default computed once, so decoding
a request is a few prepared calls rather than a walk of the definition.

Decoded messages are dicts keyed by snake_case field names; fields absent from a version are filled
with their defaults so handlers need not branch on versions for reads.
"""
from __future__ import annotations

import functools
import struct

from . import types as T
from .types import ProtocolError

MAX_VERSION = 0x7FFF


def parse_versions(spec):
    """'3+' -> (3, MAX); '0-8' -> (0, 8); '5' -> (5, 5); None/'none' -> None."""
    if spec is None or spec == "none":
        return None
    if isinstance(spec, tuple):
        return spec
    spec = spec.strip()
    if spec.endswith("+"):
        return int(spec[:-1]), MAX_VERSION
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo), int(hi)
    return int(spec), int(spec)


def _in(rng, v):
    return rng is not None and rng[0] <= v <= rng[1]


class Struct:
    """A nested (non-array) struct field type."""

    __slots__ = ("fields",)

    def __init__(self, fields):
        self.fields = fields


class _Null:
    """Marker for ``"default": "null"`` in Kafka's JSON: the field defaults to None in *every* version,
    including versions it is absent from (e.g. JoinGroup ``group_instance_id`` before v5 must read as
    None, not "", or a handler would take every old client for a static member)."""

    __slots__ = ()

    def __repr__(self):
        return "NULL"


NULL = _Null()


class Field:
    __slots__ = ("name", "type", "versions", "nullable", "default", "tag", "tagged")

    def __init__(self, name, type, versions="0+", nullable=None, default=None, tag=None, tagged=None):
        self.name = name
        # str primitive, "[]<primitive>", list[Field] (array of structs) or Struct
        self.type = type
        self.versions = parse_versions(versions)
        self.nullable = parse_versions(nullable)
        self.default = default
        self.tag = tag
        self.tagged = parse_versions(tagged) if tag is not None else None

    def default_value(self, version):
        if self.default is not None:
            return None if self.default is NULL else self.default
        if _in(self.nullable, version):
            return None
        t = self.type
        if isinstance(t, list) or (isinstance(t, str) and t.startswith("[]")):
            return []
        if isinstance(t, Struct):
            return {f.name: f.default_value(version) for f in t.fields}
        return _ZERO.get(t, 0)


F = Field  # definitions read better with a short name

_ZERO = {"string": "", "bytes": b"", "records": None, "bool": False, "uuid": T.ZERO_UUID, "float64": 0.0}

_FIXED_READ = {
    "int8": T.read_int8, "int16": T.read_int16, "int32": T.read_int32, "int64": T.read_int64,
    "uint16": T.read_uint16, "uint32": T.read_uint32, "float64": T.read_float64, "bool": T.read_bool,
    "uuid": T.read_uuid,
}
_FIXED_WRITE = {
    "int8": T.write_int8, "int16": T.write_int16, "int32": T.write_int32, "int64": T.write_int64,
    "uint16": T.write_uint16, "uint32": T.write_uint32, "float64": T.write_float64, "bool": T.write_bool,
    "uuid": T.write_uuid,
}
# (classic non-null, classic nullable, compact non-null, compact nullable)
_VAR_READ = {
    "string": (T.read_string, T.read_nullable_string, T.read_compact_string, T.read_compact_nullable_string),
    "bytes": (T.read_bytes, T.read_nullable_bytes, T.read_compact_bytes, T.read_compact_nullable_bytes),
    "records": (T.read_records, T.read_records, T.read_compact_records, T.read_compact_records),
}
_VAR_WRITE = {
    "string": (T.write_string, T.write_nullable_string, T.write_compact_string, T.write_compact_nullable_string),
    "bytes": (T.write_bytes, T.write_nullable_bytes, T.write_compact_bytes, T.write_compact_nullable_bytes),
    "records": (T.write_records, T.write_records, T.write_compact_records, T.write_compact_records),
}
# Smallest encoding of one array element: bounds an array's length by the bytes left before we
# allocate anything for it.
_MIN_SIZE = {"int8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
             "float64": 8, "uuid": 16, "string": 1, "bytes": 1, "records": 1}


def _primitive_reader(t, nullable, flexible):
    if t in _FIXED_READ:
        return _FIXED_READ[t]
    return _VAR_READ[t][(2 if flexible else 0) + (1 if nullable else 0)]


def _primitive_writer(t, nullable, flexible):
    if t in _FIXED_WRITE:
        return _FIXED_WRITE[t]
    return _VAR_WRITE[t][(2 if flexible else 0) + (1 if nullable else 0)]


def _array_reader(elem_read, elem_min, nullable, flexible):
    def read(buf, pos):
        if flexible:
            n, pos = T.read_uvarint(buf, pos)
            n -= 1
        else:
            n, pos = T.read_int32(buf, pos)
        if n < 0:
            if nullable:
                return None, pos
            raise ProtocolError("null in non-nullable array")
        if n * elem_min > len(buf) - pos:
            raise ProtocolError(f"array of {n} elements cannot fit in {len(buf) - pos} bytes")
        items = []
        append = items.append
        for _ in range(n):
            item, pos = elem_read(buf, pos)
            append(item)
        return items, pos
    return read


def _array_writer(elem_write, nullable, flexible):
    def write(out, v):
        if v is None:
            if not nullable:
                raise ValueError("null in non-nullable array")
            if flexible:
                out.buf.append(0)
            else:
                out.buf += b"\xff\xff\xff\xff"
            return
        if flexible:
            T.write_uvarint(out, len(v) + 1)
        else:
            T.write_int32(out, len(v))
        for item in v:
            elem_write(out, item)
    return write


class _Compiled:
    """Readers/writers of one struct at one version."""

    __slots__ = ("read", "write", "min_size")


def _compile_struct(fields, version, flexible):
    plain = []          # (name, reader, writer, default)
    tagged = {}         # tag -> (name, reader, writer, default)
    absent = []         # (name, field) not in this version: filled with defaults on decode
    min_size = 1 if flexible else 0
    for f in fields:
        if f.tag is not None and flexible and _in(f.tagged, version):
            r, w, _ = _compile_field(f, version, flexible)
            tagged[f.tag] = (f.name, r, w, f)
            continue
        if not _in(f.versions, version) or f.tag is not None:
            absent.append(f)
            continue
        r, w, m = _compile_field(f, version, flexible)
        plain.append((f.name, r, w, f))
        min_size += m
    tag_order = sorted(tagged.items())
    # Defaults are computed once per (struct, version) instead of per decode/encode (the Fetch request
    # has eight absent or tagged fields at the versions clients send). Immutable ones are copied into each
    # decoded dict with one update; lists and dicts are built per decode so no two dicts share them.
    fixed = {}          # name -> immutable default of an absent or (flexible) tagged field
    fresh = []          # (name, field) whose default is a list or dict
    for f in absent + ([f for _tag, (_n, _r, _w, f) in tag_order] if flexible else []):
        d = f.default_value(version)
        if isinstance(d, (list, dict)):
            fresh.append((f.name, _default_maker(f, version)))
        else:
            fixed[f.name] = d
    write_plain = [(name, w, f.default_value(version)) for name, _r, w, f in plain]
    write_tagged = [(tag, name, w, f.default_value(version)) for tag, (name, _r, w, f) in tag_order]

    read = _generate_reader([(name, r, f.type) for name, r, _w, f in plain], fixed, fresh, version,
                            tagged if flexible else None)

    def write(out, obj):
        get = obj.get
        for name, w, default in write_plain:
            v = get(name, _MISSING)
            w(out, default if v is _MISSING else v)
        if flexible:
            present = []
            for tag, name, w, default in write_tagged:
                v = get(name, _MISSING)
                if v is not _MISSING and v != default:
                    present.append((tag, w, v))
            T.write_uvarint(out, len(present))
            for tag, w, v in present:
                sub = T.Out()
                w(sub, v)
                data = sub.buf
                T.write_uvarint(out, tag)
                T.write_uvarint(out, len(data))
                out.buf += data

    c = _Compiled()
    c.read, c.write, c.min_size = read, write, max(min_size, 1)
    return c


_MISSING = object()


# Struct codes of the fixed-width types: consecutive fixed-width fields are read by one unpack_from.
_FIXED_CODE = {"int8": "b", "bool": "?", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
               "int64": "q", "float64": "d"}


def _generate_reader(plain, fixed, fresh, version, tagged):
    """The decoder of one struct at one version as straight-line Python rather than a loop over
    (name, reader) pairs: each run of consecutive fixed-width fields is one ``unpack_from`` (a short
    frame raises struct.error, which ``Schema.decode`` turns into ProtocolError), other fields one call
    each, the dict built by one literal. ``plain``: (name, reader, type or None). Field names appear
    only as repr'd dict keys; readers and defaults are passed in by name."""
    env = {"_fixed": fixed, "_read_tags": _read_tags, "_tagged": tagged, "_version": version}
    lines = ["def read(buf, pos):"]
    run = []            # (index, code) of the current fixed-width run

    def flush_run():
        if not run:
            return
        fmt = ">" + "".join(code for _i, code in run)
        k = run[0][0]            # the run's first field index names its Struct
        env[f"_s{k}"] = st = struct.Struct(fmt)
        names = "".join(f"v{i}, " for i, _c in run)
        lines.append(f"    {names}= _s{k}.unpack_from(buf, pos)")
        lines.append(f"    pos += {st.size}")
        run.clear()

    for i, (_name, r, t) in enumerate(plain):
        code = _FIXED_CODE.get(t) if isinstance(t, str) else None
        if code is not None:
            run.append((i, code))
            continue
        flush_run()
        env[f"_r{i}"] = r
        lines.append(f"    v{i}, pos = _r{i}(buf, pos)")
    flush_run()
    items = ", ".join(f"{name!r}: v{i}" for i, (name, _r, _t) in enumerate(plain))
    lines.append(f"    obj = {{{items}}}")
    if fixed:
        lines.append("    obj.update(_fixed)")
    for j, (name, make) in enumerate(fresh):
        env[f"_f{j}"] = make
        lines.append(f"    obj[{name!r}] = _f{j}()")
    if tagged is not None:
        lines.append("    pos = _read_tags(buf, pos, obj, _tagged)")
    lines.append("    return obj, pos")
    exec("\n".join(lines), env)     # noqa: S102 - source built from our own schema definitions
    return env["read"]


def _default_maker(f, version):
    """-> a function building a fresh list/dict default of ``f`` (never shared between decodes)."""
    d = f.default_value(version)
    if isinstance(d, list) and not d:
        return list
    if isinstance(d, dict) and not any(isinstance(v, (list, dict)) for v in d.values()):
        return d.copy          # d is ours alone; copies of it are handed out
    return functools.partial(f.default_value, version)


def _read_tags(buf, pos, obj, tagged):
    n, pos = T.read_uvarint(buf, pos)
    for _ in range(n):
        tag, pos = T.read_uvarint(buf, pos)
        size, pos = T.read_uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise ProtocolError("tagged field past the end of the frame")
        known = tagged.get(tag)
        if known is not None:
            name, r, _w, _f = known
            obj[name], used = r(buf[:end], pos)
            if used != end:
                raise ProtocolError(f"tagged field {name} size mismatch")
        pos = end
    return pos


def _compile_field(f, version, flexible):
    """-> (reader, writer, minimum encoded size)."""
    t = f.type
    nullable = _in(f.nullable, version)
    if isinstance(t, Struct):
        c = _compile_struct(t.fields, version, flexible)
        return c.read, c.write, c.min_size
    if isinstance(t, list):
        c = _compile_struct(t, version, flexible)
        return (_array_reader(c.read, c.min_size, nullable, flexible),
                _array_writer(c.write, nullable, flexible), 1)
    if t.startswith("[]"):
        et = t[2:]
        r = _primitive_reader(et, False, flexible)
        w = _primitive_writer(et, False, flexible)
        return (_array_reader(r, _MIN_SIZE[et], nullable, flexible),
                _array_writer(w, nullable, flexible), 1)
    return _primitive_reader(t, nullable, flexible), _primitive_writer(t, nullable, flexible), _MIN_SIZE[t]


class Schema:
    """One request or response message: fields plus the valid and flexible version ranges."""

    def __init__(self, name, valid, flexible, fields):
        self.name = name
        self.valid = parse_versions(valid)
        self.flexible = parse_versions(flexible)
        self.fields = fields
        self._cache = {}

    def is_flexible(self, version):
        return _in(self.flexible, version)

    def compiled(self, version) -> _Compiled:
        c = self._cache.get(version)
        if c is None:
            if not _in(self.valid, version):
                raise ProtocolError(f"{self.name} has no version {version}")
            c = self._cache[version] = _compile_struct(self.fields, version, self.is_flexible(version))
        return c

    def decode(self, buf, pos, version):
        """-> (dict, end position). Raises ProtocolError on malformed bytes."""
        try:
            return self.compiled(version).read(buf, pos)
        except ProtocolError:
            raise
        except (struct.error, ValueError, IndexError, TypeError, OverflowError, RecursionError) as e:
            # struct.error: a fixed-width read past the end of the frame
            raise ProtocolError(f"{self.name} v{version}: {e}") from None

    def encode_into(self, out, obj, version):
        self.compiled(version).write(out, obj)
