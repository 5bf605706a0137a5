"""kbroker dump-log on real segment files written by a Log: Kafka's DumpLogSegments line formats for
batches, records (--deep-iteration, --print-data-log, --skip-record-metadata), offset and time indexes
(with their checks on stderr), producer snapshots, transaction indexes, trailing bytes, --max-bytes."""
import os
import struct
import subprocess
import sys

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from kbroker.log import Log, LogConfig

from builders import T0, batch

SEG = "00000000000000000000"


def dump(*args):
    r = subprocess.run([sys.executable, "-m", "kbroker", "dump-log", *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines(), r.stderr.splitlines()


def gzip_batch(ts):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=1, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=ts, key=None, value=b"zipped" * 50, headers=[("h1", b"a"), ("h2", None)])
    b.append(1, timestamp=ts + 5, key=b"k2", value=None, headers=[])
    return memoryview(bytearray(b.build()))


@pytest.fixture
def log_dir(tmp_path):
    d = tmp_path / "t-0"
    lg = Log(str(d), "t", 0, LogConfig({"index.interval.bytes": 1}))
    lg.append_as_leader(batch(2, value_size=3, pid=7, epoch=1, seq=0), 4, T0)
    lg.append_as_leader(gzip_batch(T0 + 10), 4, T0)
    lg.flush()
    lg.producer_state.write_snapshot(lg.log_end_offset)
    lg.close()
    return d


def test_shallow_batches(log_dir):
    out, err = dump("--files", str(log_dir / f"{SEG}.log"))
    assert out[:2] == [f"Dumping {log_dir / SEG}.log", "Log starting offset: 0"]
    first = os.path.getsize(log_dir / f"{SEG}.log") - int(out[3].split(" size: ")[1].split()[0])
    assert out[2].startswith(
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 0 lastSequence: 1 producerId: 7 producerEpoch: 1 "
        "partitionLeaderEpoch: 4 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
        f"position: 0 CreateTime: {T0 + 1} size: {first} magic: 2 compresscodec: none crc: ")
    assert out[2].endswith(" isvalid: true")
    assert out[3].startswith(
        "baseOffset: 2 lastOffset: 3 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
        "partitionLeaderEpoch: 4 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
        f"position: {first} CreateTime: {T0 + 15} ")
    assert " compresscodec: gzip " in out[3]
    assert len(out) == 4 and err == []


def test_records_with_data(log_dir):
    out, _ = dump("--files", str(log_dir / f"{SEG}.log"), "--print-data-log")
    records = [line for line in out if line.startswith("|")]
    assert records == [
        f"| offset: 0 CreateTime: {T0} keySize: 1 valueSize: 3 sequence: 0 headerKeys: [] key: k payload: vvv",
        f"| offset: 1 CreateTime: {T0 + 1} keySize: 1 valueSize: 3 sequence: 1 headerKeys: [] key: k payload: vvv",
        f"| offset: 2 CreateTime: {T0 + 10} keySize: -1 valueSize: 300 sequence: -1 headerKeys: [h1,h2] payload: {'zipped' * 50}",
        f"| offset: 3 CreateTime: {T0 + 15} keySize: 2 valueSize: -1 sequence: -1 headerKeys: [] key: k2",
    ]
    deep, _ = dump("--files", str(log_dir / f"{SEG}.log"), "--deep-iteration")
    assert [line for line in deep if line.startswith("|")][0] == (
        f"| offset: 0 CreateTime: {T0} keySize: 1 valueSize: 3 sequence: 0 headerKeys: []")
    bare, _ = dump("--files", str(log_dir / f"{SEG}.log"), "--print-data-log", "--skip-record-metadata")
    assert [line for line in bare if line.startswith("|")] == ["| key: k payload: vvv", "| key: k payload: vvv",
                                                                "|  payload: " + "zipped" * 50, "| key: k2"]


def test_indexes_and_their_checks(log_dir):
    out, _ = dump("--files", str(log_dir / f"{SEG}.log"))
    second = int(out[3].split(" position: ")[1].split()[0])
    out, err = dump("--files", f"{log_dir / SEG}.index,{log_dir / SEG}.timeindex")
    # Kafka's rule: a batch is indexed once index.interval.bytes were written since the last entry
    assert out == [f"Dumping {log_dir / SEG}.index", f"offset: 3 position: {second}",
                   f"Dumping {log_dir / SEG}.timeindex", f"timestamp: {T0 + 15} offset: 3"]
    assert err == []
    sane, _ = dump("--files", f"{log_dir / SEG}.index", "--index-sanity-check")
    assert sane[1] == f"{log_dir / SEG}.index passed sanity check."
    # An entry naming another offset than its batch's last is a mismatch, reported on stderr.
    with open(log_dir / f"{SEG}.index", "r+b") as f:
        f.write(struct.pack(">II", 2, second))
    out, err = dump("--files", f"{log_dir / SEG}.index", "--verify-index-only")
    assert out == [f"Dumping {log_dir / SEG}.index"]
    assert err == [f"Mismatches in :{log_dir / SEG}.index", "  Index offset: 2, log offset: 3"]


def test_snapshot_txn_index_trailing_bytes_and_max_bytes(log_dir, tmp_path):
    out, _ = dump("--files", str(log_dir / "00000000000000000004.snapshot"))
    assert out[1:] == [
        "producerId: 7 producerEpoch: 1 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong.empty "
        f"lastTimestamp: {T0 + 1} firstSequence: 0 lastSequence: 1 lastOffset: 1 offsetDelta: 1 timestamp: {T0 + 1}"]
    txn = tmp_path / f"{SEG}.txnindex"
    txn.write_bytes(struct.pack(">hqqqq", 0, 9, 10, 20, 21))
    out, _ = dump("--files", str(txn))
    assert out[1:] == ["version: 0 producerId: 9 firstOffset: 10 lastOffset: 20 lastStableOffset: 21"]
    with open(log_dir / f"{SEG}.log", "ab") as f:
        f.write(b"\0" * 7)
    out, _ = dump("--files", str(log_dir / f"{SEG}.log"))
    assert out[-1] == f"Found 7 invalid bytes at the end of {SEG}.log"
    out, _ = dump("--files", str(log_dir / f"{SEG}.log"), "--max-bytes", "100")
    assert len(out) == 3                        # the first batch only, no trailing-bytes line
    _, err = dump("--files", str(tmp_path / "notes.txt"))
    assert err == [f"Ignoring unknown file {tmp_path / 'notes.txt'}"]
