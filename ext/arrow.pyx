"""RecordBatch v2 <-> Arrow columns, for the Spark data source (kbroker.spark).

Read: ``RecordDecoder`` walks uncompressed records sections (what follows the 61-byte header
of a batch, after decompression) and appends each record straight into Arrow buffers it owns:
int32 offsets + data for key and value (with validity bitmaps), int64 offset, int64
timestamp in microseconds, int32 timestampType, and optionally the headers list
(list offsets, struct children key string / value binary). The buffers come from pyarrow's
default memory pool, which reuses the pages of freed batches (fresh malloc'd buffers cost a
page fault per 4 KiB, more than the decode itself); ``flush()`` hands them to pyarrow without
copying and returns a ``pyarrow.RecordBatch`` with exactly Spark's Arrow schema for the Kafka
source.

Types, the header layout (layout.pxd) and the varint helpers (varint.pxd) are declared in
arrow.pxd.

Write: ``partition_for_keys`` (Kafka's murmur2 partitioner over a binary column) and
``build_batches`` (rows of Arrow key/value/headers columns -> RecordBatch v2 bytes, sized
by batch.size) encode in two GIL-free passes (size, then write) into the result bytes.

The byte work runs without the GIL; Python objects are made per batch, never per record.
Header keys are written and read as bytes: Kafka's clients only ever produce UTF-8 keys.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy

import time

cdef int64_t INT32_LIMIT = 0x7FFFFFFF
cdef object _compression = None
cdef object _pa = None           # pyarrow, imported by the first RecordDecoder

# Return codes of the nogil decoder.
cdef enum:
    DONE = 0
    FULL = 1
    CORRUPT = -1
    NEED_MEMORY = -2             # a record does not fit the buffers: grow them, call again


class ArrowDecodeError(ValueError):
    """A records section that does not parse (truncated, lengths that lie)."""


# ---------------------------------------------------------------- owned buffers

@cython.final
cdef class _Mem:
    """A growable Arrow buffer from pyarrow's default memory pool. ``grow`` runs with the GIL;
    the put_* helpers write without it and never grow (the decoder checks room per record).
    Bitmap bytes are zeroed as they come into use (put_bit), other bytes are always written."""

    def __cinit__(self):
        self.buf = None
        self.data = NULL
        self.length = 0
        self.capacity = 0

    cdef int grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap
        if need <= self.capacity:
            return 0
        cap = max(need, 2 * self.capacity, 256)
        if self.buf is None:
            self.buf = _pa.allocate_buffer(cap, resizable=True)
        else:
            self.buf.resize(cap)
        self.data = <char *><uintptr_t>self.buf.address
        self.capacity = cap
        return 0

    cdef object finish(self):
        """The bytes written, as a pyarrow Buffer (no copy). The _Mem is not written again."""
        if self.buf is None:
            return _pa.py_buffer(b"")
        self.buf.resize(self.length, shrink_to_fit=False)
        return self.buf

    def __len__(self):
        return self.length


# Writers of the decode; the caller made room (room / bitmap_room).
cdef inline bint room(_Mem m, Py_ssize_t n) noexcept nogil:
    return m.length + n <= m.capacity


cdef inline bint bitmap_room(_Mem m, int64_t row) noexcept nogil:
    return (row >> 3) < m.capacity


cdef inline void put_i32(_Mem m, int32_t v) noexcept nogil:
    (<int32_t *>(m.data + m.length))[0] = v
    m.length += 4


cdef inline void put_i64(_Mem m, int64_t v) noexcept nogil:
    (<int64_t *>(m.data + m.length))[0] = v
    m.length += 8


cdef inline void put_bytes(_Mem m, const unsigned char *p, Py_ssize_t n) noexcept nogil:
    if n > 0:
        memcpy(m.data + m.length, p, <size_t>n)
        m.length += n


# Validity bit ``row`` (rows are appended in order, so the bitmap grows by whole bytes).
cdef inline void put_bit(_Mem m, int64_t row, bint valid) noexcept nogil:
    cdef Py_ssize_t byte = row >> 3
    if byte >= m.length:
        m.data[byte] = 0
        m.length = byte + 1
    if valid:
        m.data[byte] = <char>(<uint8_t>m.data[byte] | (1 << (row & 7)))


# ---------------------------------------------------------------- varints

# A length-prefixed field at p[pos]: its start and length (-1 = null); -1 when malformed.
cdef inline Py_ssize_t field_at(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end,
                                Py_ssize_t *start, int32_t *length) noexcept nogil:
    pos = read_varint(p, pos, end, length)
    if pos < 0 or length[0] < -1 or length[0] > end - pos:
        return -1
    start[0] = pos
    return pos + (length[0] if length[0] > 0 else 0)


# ---------------------------------------------------------------- read: records -> Arrow

@cython.final
cdef class RecordDecoder:
    """Accumulates decoded records as Arrow buffers; ``flush`` returns them as one
    pyarrow.RecordBatch. ``append`` stops when ``max_rows`` rows or ``max_bytes`` bytes of
    key/value/header data are held (at least one record is always taken), so binary columns
    stay far below int32 offsets' 2 GiB."""

    def __init__(self, bint include_headers=False, int64_t max_rows=65536,
                 int64_t max_bytes=64 * 1024 * 1024):
        global _pa
        if max_rows < 1 or max_bytes < 1 or max_bytes > (1 << 30):
            raise ValueError("max_rows must be >= 1 and max_bytes within [1, 1 GiB]")
        if _pa is None:
            import pyarrow
            _pa = pyarrow
        self.include_headers = include_headers
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.last_offset = -1
        self.hints = None
        self._reset()

    cdef list _mems(self):
        return [self.key_valid, self.key_off, self.key_data, self.val_valid, self.val_off, self.val_data,
                self.offsets, self.timestamps, self.ts_types, self.hdr_valid, self.hdr_off, self.hk_off,
                self.hk_data, self.hv_valid, self.hv_off, self.hv_data]

    cdef int _reset(self) except -1:
        cdef _Mem m
        cdef Py_ssize_t i
        self.rows = 0
        self.data_bytes = 0
        self.nheaders = 0
        self.key_valid, self.key_off, self.key_data = _Mem(), _Mem(), _Mem()
        self.val_valid, self.val_off, self.val_data = _Mem(), _Mem(), _Mem()
        self.offsets, self.timestamps, self.ts_types = _Mem(), _Mem(), _Mem()
        self.hdr_valid, self.hdr_off = _Mem(), _Mem()
        self.hk_off, self.hk_data = _Mem(), _Mem()
        self.hv_valid, self.hv_off, self.hv_data = _Mem(), _Mem(), _Mem()
        if self.hints is not None:
            # The next batch is most likely the size of the last one: one allocation per buffer
            # instead of a doubling series of reallocations.
            for i, m in enumerate(self._mems()):
                m.grow(<Py_ssize_t>self.hints[i])
        # Arrow offsets start with a 0.
        for m in (self.key_off, self.val_off, self.hdr_off, self.hk_off, self.hv_off):
            m.grow(4)
            put_i32(m, 0)
        return 0

    cdef int _grow_for_record(self) except -1:
        # Room for the record _decode stopped at (need_* bytes), doubling as needed.
        cdef int64_t nh = self.need_headers // 2 + 1     # a header takes at least 2 bytes
        self.key_data.grow(self.key_data.length + self.need_key)
        self.val_data.grow(self.val_data.length + self.need_value)
        for m in (self.key_off, self.val_off, self.ts_types, self.hdr_off):
            m.grow(m.length + 4)
        for m in (self.offsets, self.timestamps):
            m.grow(m.length + 8)
        self.key_valid.grow((self.rows >> 3) + 1)
        self.val_valid.grow((self.rows >> 3) + 1)
        if self.include_headers:
            self.hdr_valid.grow((self.rows >> 3) + 1)
            self.hk_data.grow(self.hk_data.length + self.need_headers)
            self.hv_data.grow(self.hv_data.length + self.need_headers)
            self.hk_off.grow(self.hk_off.length + 4 * nh)
            self.hv_off.grow(self.hv_off.length + 4 * nh)
            self.hv_valid.grow(((self.nheaders + nh) >> 3) + 1)
        return 0

    cdef int _decode(self, const unsigned char *p, Py_ssize_t n, int32_t count,
                     int64_t base_offset, int64_t base_timestamp, int64_t log_append_time,
                     int32_t ts_type, int64_t lo, int64_t hi,
                     Py_ssize_t *pos_io, int32_t *index_io) noexcept nogil:
        cdef Py_ssize_t pos = pos_io[0], rec_end, kstart, vstart, hks, hvs, after, kn, vn, rest
        cdef int32_t i, h, length, offset_delta, nh, klen, vlen, hkl, hvl
        cdef int64_t ts_delta, offset
        cdef bint keep
        i = index_io[0]
        while i < count:
            after = read_varint(p, pos, n, &length)
            if after < 0 or length < 1 or length > n - after:
                return CORRUPT
            rec_end = after + length
            after += 1      # record attributes: unused
            after = read_varlong(p, after, rec_end, &ts_delta)
            if after < 0:
                return CORRUPT
            after = read_varint(p, after, rec_end, &offset_delta)
            if after < 0:
                return CORRUPT
            after = field_at(p, after, rec_end, &kstart, &klen)
            if after < 0:
                return CORRUPT
            after = field_at(p, after, rec_end, &vstart, &vlen)
            if after < 0:
                return CORRUPT
            offset = base_offset + offset_delta
            keep = lo <= offset < hi
            if keep:
                kn = klen if klen > 0 else 0
                vn = vlen if vlen > 0 else 0
                rest = rec_end - after      # bounds the header bytes (and count) of this record
                if self.rows > 0 and (self.rows >= self.max_rows
                                      or self.data_bytes + kn + vn + rest > self.max_bytes):
                    pos_io[0] = pos
                    index_io[0] = i
                    return FULL
                if not (room(self.key_data, kn) and room(self.val_data, vn) and room(self.key_off, 4)
                        and room(self.val_off, 4) and room(self.offsets, 8) and room(self.timestamps, 8)
                        and room(self.ts_types, 4) and bitmap_room(self.key_valid, self.rows)
                        and bitmap_room(self.val_valid, self.rows)
                        and (not self.include_headers or (
                            room(self.hk_data, rest) and room(self.hv_data, rest)
                            and room(self.hk_off, 4 * (rest // 2 + 1)) and room(self.hv_off, 4 * (rest // 2 + 1))
                            and bitmap_room(self.hv_valid, self.nheaders + rest // 2 + 1)
                            and bitmap_room(self.hdr_valid, self.rows) and room(self.hdr_off, 4)))):
                    self.need_key, self.need_value, self.need_headers = kn, vn, rest
                    pos_io[0] = pos
                    index_io[0] = i
                    return NEED_MEMORY
                put_bit(self.key_valid, self.rows, klen >= 0)
                put_bytes(self.key_data, p + kstart, kn)
                put_i32(self.key_off, <int32_t>self.key_data.length)
                put_bit(self.val_valid, self.rows, vlen >= 0)
                put_bytes(self.val_data, p + vstart, vn)
                put_i32(self.val_off, <int32_t>self.val_data.length)
                put_i64(self.offsets, offset)
                put_i64(self.timestamps, (log_append_time if log_append_time >= 0
                                          else base_timestamp + ts_delta) * 1000)
                put_i32(self.ts_types, ts_type)
                self.data_bytes += kn + vn
            after = read_varint(p, after, rec_end, &nh)
            if after < 0 or nh < 0 or nh > rec_end - after:
                return CORRUPT
            for h in range(nh):
                after = field_at(p, after, rec_end, &hks, &hkl)
                if after < 0 or hkl < 0:
                    return CORRUPT
                after = field_at(p, after, rec_end, &hvs, &hvl)
                if after < 0:
                    return CORRUPT
                if keep and self.include_headers:
                    put_bytes(self.hk_data, p + hks, hkl)
                    put_i32(self.hk_off, <int32_t>self.hk_data.length)
                    put_bit(self.hv_valid, self.nheaders, hvl >= 0)
                    put_bytes(self.hv_data, p + hvs, hvl)
                    put_i32(self.hv_off, <int32_t>self.hv_data.length)
                    self.nheaders += 1
                    self.data_bytes += hkl + (hvl if hvl > 0 else 0)
            if after != rec_end:
                return CORRUPT
            if keep:
                if self.include_headers:
                    # Spark's Kafka source gives null, not [], for a record without headers.
                    put_bit(self.hdr_valid, self.rows, nh > 0)
                    put_i32(self.hdr_off, <int32_t>self.nheaders)
                self.rows += 1
                self.last_offset = offset
            pos = rec_end
            i += 1
        if pos != n:
            return CORRUPT
        pos_io[0] = pos
        index_io[0] = i
        return DONE

    def append(self, section, int32_t count, int64_t base_offset, int64_t base_timestamp,
               int64_t log_append_time, int32_t timestamp_type, int64_t lo, int64_t hi,
               Py_ssize_t pos=0, int32_t index=0):
        """Decode the records of one uncompressed records section, keeping those with
        ``lo <= offset < hi``. Resumes at byte ``pos`` / record ``index`` (what a previous call
        returned when it filled up). -> (pos, index, full): full means flush() then call again
        with the returned pos and index; otherwise the section is done."""
        cdef const unsigned char[::1] view = section
        cdef int rc
        cdef Py_ssize_t n = view.shape[0]
        if pos < 0 or pos > n or index < 0:
            raise ValueError("resume position outside the section")
        while True:
            with nogil:
                rc = self._decode(&view[0] if n else NULL, n, count, base_offset, base_timestamp,
                                  log_append_time, timestamp_type, lo, hi, &pos, &index)
            if rc != NEED_MEMORY:
                break
            self._grow_for_record()
        if rc == CORRUPT:
            raise ArrowDecodeError(f"malformed records section (base offset {base_offset}, "
                                   f"{count} records, {n} bytes)")
        return pos, index, rc == FULL

    def flush(self, str topic, int32_t partition):
        """The rows held so far as a pyarrow.RecordBatch (Spark's Kafka schema; ``headers`` last
        when include_headers); the decoder starts empty again."""
        import numpy as np
        pa = _pa
        cdef int64_t n = self.rows
        cdef bytes tb = topic.encode("utf-8")
        cdef _Mem m
        schema = kafka_arrow_schema(self.include_headers)
        self.hints = [m.length for m in self._mems()]
        key = pa.Array.from_buffers(pa.binary(), n, [self.key_valid.finish(), self.key_off.finish(),
                                                     self.key_data.finish()])
        value = pa.Array.from_buffers(pa.binary(), n, [self.val_valid.finish(), self.val_off.finish(),
                                                       self.val_data.finish()])
        # Constant columns: numpy/bytes fills, no per-row Python; Arrow arrays are immutable, so
        # the next batch of the same size (most are: the caps cut them) shares them.
        const_key = (topic, partition, n)
        if self.const_key != const_key:
            topic_off = np.arange(n + 1, dtype=np.int32) * np.int32(len(tb))
            topic_col = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(topic_off),
                                                               pa.py_buffer(tb * n)])
            part = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, partition,
                                                                                    dtype=np.int32))])
            self.const_key, self.const_cols = const_key, (topic_col, part)
        topic_col, part = self.const_cols
        offs = pa.Array.from_buffers(pa.int64(), n, [None, self.offsets.finish()])
        ts = pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, self.timestamps.finish()])
        tst = pa.Array.from_buffers(pa.int32(), n, [None, self.ts_types.finish()])
        cols = [key, value, topic_col, part, offs, ts, tst]
        if self.include_headers:
            hdr_type = schema.field("headers").type
            struct_type = hdr_type.value_type
            hk = pa.Array.from_buffers(pa.string(), self.nheaders,
                                       [None, self.hk_off.finish(), self.hk_data.finish()])
            hv = pa.Array.from_buffers(pa.binary(), self.nheaders,
                                       [self.hv_valid.finish(), self.hv_off.finish(), self.hv_data.finish()])
            structs = pa.Array.from_buffers(struct_type, self.nheaders, [None], children=[hk, hv])
            cols.append(pa.Array.from_buffers(hdr_type, n, [self.hdr_valid.finish(), self.hdr_off.finish()],
                                              children=[structs]))
        batch = pa.RecordBatch.from_arrays(cols, schema=schema)
        self._reset()
        return batch


_SCHEMAS = {}


def kafka_arrow_schema(bint include_headers=False):
    """Spark's Arrow schema for the Kafka source (every field nullable, timestamps in us UTC)."""
    import pyarrow as pa
    schema = _SCHEMAS.get(include_headers)
    if schema is None:
        fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary()),
                  pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                  pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC")),
                  pa.field("timestampType", pa.int32())]
        if include_headers:
            fields.append(pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()),
                                                                  pa.field("value", pa.binary())]))))
        schema = _SCHEMAS[include_headers] = pa.schema(fields)
    return schema


# ---------------------------------------------------------------- write: Arrow -> records

# BinCol / HdrCol (arrow.pxd): Arrow columns seen as raw pointers.

cdef inline bint col_valid(const BinCol *c, int64_t row) noexcept nogil:
    cdef int64_t i = c.base + row
    return c.valid == NULL or (c.valid[i >> 3] >> (i & 7)) & 1


cdef inline int32_t col_len(const BinCol *c, int64_t row) noexcept nogil:
    # -1 for null (Kafka's encoding of a null key/value).
    cdef int64_t i = c.base + row
    if not c.present or not col_valid(c, row):
        return -1
    return c.off[i + 1] - c.off[i]


cdef inline const unsigned char *col_ptr(const BinCol *c, int64_t row) noexcept nogil:
    return c.data + c.off[c.base + row]


cdef class _Column:
    """Keeps the pyarrow buffers of a binary column alive while raw pointers into them are used
    (fields in arrow.pxd)."""

    def __init__(self, arr):
        cdef const uint8_t[::1] valid_mv
        cdef const int32_t[::1] off_mv
        cdef const unsigned char[::1] data_mv
        import numpy as np
        import pyarrow as pa
        self.col.present = arr is not None
        self.col.valid = NULL
        if arr is None:
            return
        t = arr.type
        if not (pa.types.is_binary(t) or pa.types.is_string(t)):
            raise TypeError(f"expected a binary or string column, got {t}")
        bufs = arr.buffers()
        self.col.base = arr.offset
        keep = [bufs]
        if bufs[0] is not None and arr.null_count:
            valid_mv = np.frombuffer(bufs[0], dtype=np.uint8)
            self.col.valid = &valid_mv[0]
            keep.append(valid_mv)
        off_mv = np.frombuffer(bufs[1], dtype=np.int32)
        self.col.off = &off_mv[0]
        keep.append(off_mv)
        if bufs[2] is not None and len(bufs[2]):
            data_mv = np.frombuffer(bufs[2], dtype=np.uint8)
            self.col.data = &data_mv[0]
            keep.append(data_mv)
        else:
            self.col.data = <const unsigned char *>""
        self.keep = keep


cdef inline int64_t hdr_first(const HdrCol *c, int64_t row) noexcept nogil:
    return c.off[c.base + row]


cdef inline int64_t hdr_count(const HdrCol *c, int64_t row) noexcept nogil:
    cdef int64_t i = c.base + row
    if not c.present:
        return 0
    if c.valid != NULL and not ((c.valid[i >> 3] >> (i & 7)) & 1):
        return 0
    return c.off[i + 1] - c.off[i]


cdef class _ListColumn:
    """Keeps a headers column's buffers alive while raw pointers into them are used (fields in
    arrow.pxd)."""

    def __init__(self, arr):
        cdef const int32_t[::1] off_mv
        cdef const uint8_t[::1] valid_mv
        cdef _Column hk, hv
        import numpy as np
        self.col.present = arr is not None
        self.col.valid = NULL
        self.col.hkey.present = False
        self.col.hval.present = False
        if arr is None:
            return
        bufs = arr.buffers()
        self.col.base = arr.offset
        off_mv = np.frombuffer(bufs[1], dtype=np.int32)
        self.col.off = &off_mv[0]
        keep = [bufs, off_mv]
        if bufs[0] is not None and arr.null_count:
            valid_mv = np.frombuffer(bufs[0], dtype=np.uint8)
            self.col.valid = &valid_mv[0]
            keep.append(valid_mv)
        structs = arr.values
        if structs.null_count:
            raise ValueError("headers: a header (struct) may not be null")
        hk = _Column(structs.field(0))
        hv = _Column(structs.field(1))
        if hk.col.valid != NULL:
            raise ValueError("headers: a header key may not be null")
        self.col.hkey = hk.col
        self.col.hval = hv.col
        keep += [hk, hv]
        self.keep = keep


cdef inline int64_t record_body_size(const BinCol *k, const BinCol *v, const HdrCol *hd,
                                     int64_t row, int32_t index) noexcept nogil:
    cdef int32_t kl = col_len(k, row), vl = col_len(v, row), hl
    cdef int64_t nh = hdr_count(hd, row), h, j, size
    size = 1 + varlong_size(0) + varlong_size(index) + varlong_size(kl) + (kl if kl > 0 else 0) \
        + varlong_size(vl) + (vl if vl > 0 else 0) + varlong_size(nh)
    if nh:
        j = hdr_first(hd, row)
        for h in range(j, j + nh):
            hl = col_len(&hd.hkey, h)
            size += varlong_size(hl) + hl
            hl = col_len(&hd.hval, h)
            size += varlong_size(hl) + (hl if hl > 0 else 0)
    return size


cdef Py_ssize_t write_record(char *out, Py_ssize_t pos, const BinCol *k, const BinCol *v,
                             const HdrCol *hd, int64_t row, int32_t index, int64_t body) noexcept nogil:
    cdef int32_t kl = col_len(k, row), vl = col_len(v, row), hl
    cdef int64_t nh = hdr_count(hd, row), h, j
    pos = write_varlong(out, pos, body)
    out[pos] = 0                              # record attributes
    pos += 1
    pos = write_varlong(out, pos, 0)           # timestampDelta: one timestamp per batch
    pos = write_varlong(out, pos, index)       # offsetDelta
    pos = write_varlong(out, pos, kl)
    if kl > 0:
        memcpy(out + pos, col_ptr(k, row), <size_t>kl)
        pos += kl
    pos = write_varlong(out, pos, vl)
    if vl > 0:
        memcpy(out + pos, col_ptr(v, row), <size_t>vl)
        pos += vl
    pos = write_varlong(out, pos, nh)
    if nh:
        j = hdr_first(hd, row)
        for h in range(j, j + nh):
            hl = col_len(&hd.hkey, h)
            pos = write_varlong(out, pos, hl)
            memcpy(out + pos, col_ptr(&hd.hkey, h), <size_t>hl)
            pos += hl
            hl = col_len(&hd.hval, h)
            pos = write_varlong(out, pos, hl)
            if hl > 0:
                memcpy(out + pos, col_ptr(&hd.hval, h), <size_t>hl)
                pos += hl
    return pos


def partition_for_keys(keys, int32_t num_partitions):
    """Kafka's default partition of each row's key, ``(murmur2(key) & 0x7fffffff) % n``, as an
    int32 numpy array; -1 where the key is null (the caller spreads those)."""
    import numpy as np
    cdef _Column kc = _Column(keys)
    cdef int64_t n = len(keys), row
    cdef int32_t[::1] out
    cdef int32_t kl, length, i, tail, rest
    cdef uint32_t h, k, m = 0x5BD1E995
    cdef const unsigned char *d
    if num_partitions < 1:
        raise ValueError("num_partitions must be >= 1")
    result = np.empty(n, dtype=np.int32)
    out = result
    with nogil:
        for row in range(n):
            kl = col_len(&kc.col, row)
            if kl < 0:
                out[row] = -1
                continue
            d = col_ptr(&kc.col, row)
            length = kl
            h = <uint32_t>0x9747B28C ^ <uint32_t>length
            tail = length & ~3
            i = 0
            while i < tail:
                # little-endian 4-byte blocks, as Java's Utils.murmur2 reads them
                k = <uint32_t>d[i] | (<uint32_t>d[i + 1] << 8) | (<uint32_t>d[i + 2] << 16) \
                    | (<uint32_t>d[i + 3] << 24)
                k *= m
                k ^= k >> 24
                k *= m
                h *= m
                h ^= k
                i += 4
            rest = length & 3
            if rest == 3:
                h ^= <uint32_t>d[tail + 2] << 16
            if rest >= 2:
                h ^= <uint32_t>d[tail + 1] << 8
            if rest >= 1:
                h ^= <uint32_t>d[tail]
                h *= m
            h ^= h >> 13
            h *= m
            h ^= h >> 15
            out[row] = <int32_t>((h & 0x7FFFFFFF) % <uint32_t>num_partitions)
    return result


def build_batches(keys, values, headers, rows, int64_t batch_size, int codec=0,
                  timestamp_ms=None, int32_t max_records=1 << 20):
    """Encode the rows ``rows`` (int64 numpy array of row indices, in order) of the Arrow columns
    ``keys`` / ``values`` (binary or string, or None for all-null keys) and ``headers``
    (list<struct<key string, value binary>> or None) into RecordBatch v2 bytes (baseOffset 0,
    no producer id), each at most ``batch_size`` bytes uncompressed unless a single record is
    larger. -> list of (bytes, record_count)."""
    global _compression
    cdef _Column kc = _Column(keys)
    cdef _Column vc = _Column(values)
    cdef _ListColumn hc = _ListColumn(headers)
    cdef const int64_t[::1] idx = rows
    cdef int64_t n = idx.shape[0], start = 0, end, total, body, r
    cdef int32_t count
    cdef int64_t ts = <int64_t>(time.time_ns() // 1000000) if timestamp_ms is None else timestamp_ms
    cdef bytes section, out
    cdef char *p
    cdef Py_ssize_t pos
    cdef list result = []
    cdef uint32_t crc
    cdef Py_ssize_t size
    if values is None:
        raise ValueError("values are required")
    if n and (keys is not None and len(keys) != len(values)):
        raise ValueError("keys and values differ in length")
    while start < n:
        # pass 1: how many rows fit in batch_size
        with nogil:
            total = 0
            end = start
            while end < n and end - start < max_records:
                r = idx[end]
                body = record_body_size(&kc.col, &vc.col, &hc.col, r, <int32_t>(end - start))
                body += varlong_size(body)
                if end > start and HEADER_SIZE + total + body > batch_size:
                    break
                total += body
                end += 1
        if HEADER_SIZE + total - LOG_OVERHEAD > INT32_LIMIT:
            raise OverflowError("a record batch would exceed 2 GiB")
        count = <int32_t>(end - start)
        # pass 2: write the records section, straight after the header when uncompressed
        out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + total if codec == 0 else total)
        p = PyBytes_AS_STRING(out) + (HEADER_SIZE if codec == 0 else 0)
        with nogil:
            pos = 0
            for r in range(start, end):
                body = record_body_size(&kc.col, &vc.col, &hc.col, idx[r], <int32_t>(r - start))
                pos = write_record(p, pos, &kc.col, &vc.col, &hc.col, idx[r], <int32_t>(r - start), body)
        if codec != 0:
            if _compression is None:
                from kbroker.record import compression as _c
                _compression = _c
            section = _compression.compress(codec, out)
            out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + len(section))
            memcpy(PyBytes_AS_STRING(out) + HEADER_SIZE, PyBytes_AS_STRING(section), len(section))
        p = PyBytes_AS_STRING(out)
        size = len(out)
        with nogil:
            store_be64(p + OFF_BASE_OFFSET, 0)
            store_be32(p + OFF_LENGTH, <uint32_t>(size - LOG_OVERHEAD))
            store_be32(p + OFF_LEADER_EPOCH, <uint32_t>-1)
            p[OFF_MAGIC] = MAGIC_V2
            store_be16(p + OFF_ATTRIBUTES, <unsigned short>codec)
            store_be32(p + OFF_LAST_OFFSET_DELTA, <uint32_t>(count - 1))
            store_be64(p + OFF_BASE_TIMESTAMP, <uint64_t>ts)
            store_be64(p + OFF_MAX_TIMESTAMP, <uint64_t>ts)
            store_be64(p + OFF_PRODUCER_ID, <uint64_t>-1)
            store_be16(p + OFF_PRODUCER_EPOCH, <unsigned short>0xFFFF)   # -1
            store_be32(p + OFF_BASE_SEQUENCE, <uint32_t>-1)
            store_be32(p + OFF_RECORDS_COUNT, <uint32_t>count)
            crc = crc32c_update(0, p + CRC_START, <size_t>(size - CRC_START))
            store_be32(p + OFF_CRC, crc)
        result.append((out, count))
        start = end
    return result



def set_producer_fields(batch, int64_t producer_id, int32_t producer_epoch, int32_t base_sequence):
    """Stamp an idempotent producer's id/epoch/baseSequence into a built batch (a new bytes)
    and recompute its CRC."""
    cdef const unsigned char[::1] view = batch
    cdef Py_ssize_t size = view.shape[0]
    cdef bytes out = PyBytes_FromStringAndSize(<const char *>&view[0], size)
    cdef char *p = PyBytes_AS_STRING(out)
    with nogil:
        store_be64(p + OFF_PRODUCER_ID, <uint64_t>producer_id)
        store_be16(p + OFF_PRODUCER_EPOCH, <unsigned short>producer_epoch)
        store_be32(p + OFF_BASE_SEQUENCE, <uint32_t>base_sequence)
        store_be32(p + OFF_CRC, crc32c_update(0, p + CRC_START, <size_t>(size - CRC_START)))
    return out
