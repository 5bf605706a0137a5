"""Builders the tests share. Record batches come from kafka-python's encoder, independent of ours,
so a test that feeds them to kbroker checks our decoder against another implementation."""
from kafka.record.default_records import DefaultRecordBatchBuilder

T0 = 1_700_000_000_000


def batch(n=3, value_size=100, ts=T0, pid=-1, epoch=-1, seq=-1, *, key=b"k", fill=b"v", ts_step=1,
          max_bytes=1 << 22, transactional=False) -> memoryview:
    """One uncompressed RecordBatch v2 of ``n`` records, writable: record i has timestamp
    ``ts + i * ts_step``, key ``key`` (bytes, None, or a function of i) and value ``fill * value_size``.
    ``max_bytes`` is the builder's limit: a record that would pass it is not appended.
    ``transactional``: the batch's transactional attribute (a producer id is then needed)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  batch_size=max_bytes)
    for i in range(n):
        b.append(i, timestamp=ts + i * ts_step, key=key(i) if callable(key) else key, value=fill * value_size,
                 headers=[])
    return memoryview(bytearray(b.build()))
