"""Builders the tests share. Record batches come from kafka-python's encoder, independent of ours,
so a test that feeds them to kbroker checks our decoder against another implementation."""
import struct

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

T0 = 1_700_000_000_000


def batch(n=3, value_size=100, ts=T0, pid=-1, epoch=-1, seq=-1, *, key=b"k", fill=b"v", ts_step=1,
          max_bytes=1 << 22, codec=0, transactional=False) -> memoryview:
    """One RecordBatch v2 of ``n`` records (compressed with ``codec``: 0 none .. 4 zstd), writable:
    record i has timestamp ``ts + i * ts_step`` (``ts_step`` may be a function of i giving the
    offset from ``ts``), key ``key`` (bytes, None, or a function of i) and value ``fill * value_size``.
    ``max_bytes`` is the builder's limit: a record that would pass it is not appended.
    ``transactional``: the batch's transactional attribute (a producer id is then needed)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=transactional,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  batch_size=max_bytes)
    for i in range(n):
        stamp = ts + (ts_step(i) if callable(ts_step) else i * ts_step)
        b.append(i, timestamp=stamp, key=key(i) if callable(key) else key, value=fill * value_size,
                 headers=[])
    return memoryview(bytearray(b.build()))


def set_max_timestamp(buf, max_timestamp: int):
    """Write ``max_timestamp`` into the batch header at the start of ``buf`` (writable) and make
    the CRC match: a batch as clients that leave the field unset (-1), or set it wrong, send it."""
    struct.pack_into(">q", buf, 35, max_timestamp)
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:struct.unpack_from(">i", buf, 8)[0] + 12])))
    return buf
