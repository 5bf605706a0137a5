"""``kbroker dump-log``: kafka-dump-log.sh — print a log dir's files as Kafka's DumpLogSegments does.

``--files`` takes segments (``.log``), offset and time indexes (``.index``, ``.timeindex``), producer
snapshots (``.snapshot``) and transaction indexes (``.txnindex``); each is printed after ``Dumping <file>``
in the Java tool's line format, so scripts that parse its output read ours. Batches are listed shallowly;
``--deep-iteration`` adds a ``| offset: ...`` line per record and ``--print-data-log`` (implies it) the
key and payload as UTF-8 text. Index entries are checked against the segment (mismatches, out-of-order
timestamps and non-consecutive offsets are reported on stderr at the end, as Kafka).

The files are only read (no index is opened writable, nothing is created), so it is safe on a running
broker's dir.
"""
from __future__ import annotations

import os
import struct
import sys

from kbroker._native.crc import crc32c
from kbroker.record import HEADER_SIZE, LAYOUT, LOG_OVERHEAD, BatchError, decode_records, read_batch

INT_MAX = 2**31 - 1
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}
_INDEX_ENTRY = struct.Struct(">II")              # relative offset, position
_TIME_ENTRY = struct.Struct(">qI")               # timestamp, relative offset
_TXN_ENTRY = struct.Struct(">hqqqq")             # version, producer id, first, last, last stable offset
_SNAPSHOT_HEAD = struct.Struct(">hIi")           # version, crc, count
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")     # kbroker/log/producer_state.py's (Kafka's v1) layout


def register(subparsers) -> None:
    p = subparsers.add_parser("dump-log", help="print log segments, indexes and snapshots (kafka-dump-log.sh)",
                              description="This tool helps to parse a log file and dump its contents to the "
                                          "console, useful for debugging a seemingly corrupt log segment.")
    p.add_argument("--files", required=True,
                   help="REQUIRED: The comma separated list of data and index log files to be dumped.")
    p.add_argument("--print-data-log", action="store_true",
                   help="If set, printing the messages content when dumping data logs.")
    p.add_argument("--deep-iteration", action="store_true",
                   help="If set, uses deep instead of shallow iteration. Automatically set if print-data-log "
                        "is enabled.")
    p.add_argument("--verify-index-only", action="store_true",
                   help="If set, just verify the index log without printing its content.")
    p.add_argument("--index-sanity-check", action="store_true",
                   help="If set, just checks the index sanity without printing its content.")
    p.add_argument("--max-message-size", type=int, default=5 * 1024 * 1024, help="Size of largest message.")
    p.add_argument("--max-bytes", type=int, default=INT_MAX,
                   help="Limit the amount of total batches read in bytes avoiding reading the whole .log file(s).")
    p.add_argument("--skip-record-metadata", action="store_true",
                   help="Whether to skip printing metadata for each record.")
    p.set_defaults(func=main)


def main(args) -> int:
    problems = Problems()
    deep = args.deep_iteration or args.print_data_log
    for name in args.files.split(","):
        print(f"Dumping {name}")
        suffix = os.path.splitext(name)[1]
        try:
            if suffix == ".log":
                dump_log(name, args.print_data_log, deep, args.skip_record_metadata, args.max_bytes, problems)
            elif suffix == ".index":
                dump_index(name, args.index_sanity_check, args.verify_index_only, args.max_message_size, problems)
            elif suffix == ".timeindex":
                dump_time_index(name, args.index_sanity_check, args.verify_index_only, problems)
            elif suffix == ".snapshot":
                dump_snapshot(name)
            elif suffix == ".txnindex":
                dump_txn_index(name)
            else:
                print(f"Ignoring unknown file {name}", file=sys.stderr)
        except OSError as e:
            print(f"Error: cannot read {name}: {e.strerror}", file=sys.stderr)
            return 1
    problems.print()
    return 0


class Problems:
    """What the checks found, printed on stderr after every file (Kafka's order)."""

    def __init__(self):
        self.index_mismatches: dict[str, list] = {}
        self.time_mismatches: dict[str, list] = {}
        self.time_out_of_order: dict[str, list] = {}
        self.time_not_found: dict[str, list] = {}
        self.non_consecutive: dict[str, list] = {}

    def print(self) -> None:
        err = sys.stderr
        for path, items in self.index_mismatches.items():
            print(f"Mismatches in :{path}", file=err)
            for index_offset, log_offset in items:
                print(f"  Index offset: {index_offset}, log offset: {log_offset}", file=err)
        for path, items in self.time_mismatches.items():
            print(f"Found timestamp mismatch in :{path}", file=err)
            for index_ts, log_ts in items:
                print(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}", file=err)
        for path, items in self.time_out_of_order.items():
            print(f"Found out of order timestamp in :{path}", file=err)
            for index_ts, prev_ts in items:
                print(f"  Index timestamp: {index_ts}, Previously indexed timestamp: {prev_ts}", file=err)
        if self.time_not_found:
            print("The following indexed offsets are not found in the log.", file=err)
            for items in self.time_not_found.values():
                for indexed, found in items:
                    print(f"Indexed offset: {indexed}, found log offset: {found}", file=err)
        for path, items in self.non_consecutive.items():
            print(f"Non-consecutive offsets in {path}", file=err)
            for first, second in items:
                print(f"  {first} is followed by {second}", file=err)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _base_offset(path: str) -> int:
    return int(os.path.basename(path).split(".")[0])


def _bool(v) -> str:
    return "true" if v else "false"


def _optional_long(v: int | None) -> str:
    return "OptionalLong.empty" if v is None else f"OptionalLong[{v}]"


def _next_sequence(base: int, delta: int) -> int:
    """A producer sequence ``delta`` after ``base`` (sequences wrap at INT32_MAX to 0)."""
    return (base + delta) % (INT_MAX + 1) if base >= 0 else -1


def batches(data: bytes, limit: int = INT_MAX):
    """(position, BatchInfo) of the whole batches at the start of ``data`` (within ``limit`` bytes)."""
    pos = 0
    end = min(len(data), limit)
    while pos + LOG_OVERHEAD <= end:
        length = int.from_bytes(data[pos + 8:pos + 12], "big", signed=True)
        size = LOG_OVERHEAD + length
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + size > len(data) or (limit < INT_MAX and pos + size > end):
            return
        try:
            info = read_batch(data, pos, False)
        except BatchError:
            return
        yield pos, info
        pos += size


def dump_log(path, print_data, deep, skip_metadata, max_bytes, problems: Problems) -> None:
    data = _read(path)
    print(f"Log starting offset: {_base_offset(path)}")
    valid = 0
    last = -1
    for pos, b in batches(data, max_bytes):
        raw = memoryview(data)[pos:pos + b.size]
        attrs = b.attributes
        ts_type = "LogAppendTime" if attrs & LAYOUT["ATTR_LOG_APPEND_TIME"] else "CreateTime"
        horizon = b.first_timestamp if attrs & LAYOUT["ATTR_DELETE_HORIZON"] else None
        crc_ok = crc32c(raw[LAYOUT["CRC_START"]:]) == b.crc
        print(f"baseOffset: {b.base_offset} lastOffset: {b.last_offset} count: {b.record_count} "
              f"baseSequence: {b.base_sequence} lastSequence: {_next_sequence(b.base_sequence, b.last_offset_delta)} "
              f"producerId: {b.producer_id} producerEpoch: {b.producer_epoch} "
              f"partitionLeaderEpoch: {b.partition_leader_epoch} isTransactional: {_bool(b.is_transactional)} "
              f"isControl: {_bool(b.is_control)} deleteHorizonMs: {_optional_long(horizon)} position: {valid} "
              f"{ts_type}: {b.max_timestamp} size: {b.size} magic: {b.magic} "
              f"compresscodec: {CODEC_NAMES.get(b.codec, b.codec)} crc: {b.crc} isvalid: {_bool(crc_ok)}")
        if deep:
            for rec in decode_records(raw):
                offset, ts, key, value, headers = rec[:5]
                if last != -1 and offset != last + 1:
                    problems.non_consecutive.setdefault(os.path.abspath(path), []).append((last, offset))
                last = offset
                line = "| "
                if not skip_metadata:
                    line += (f"offset: {offset} {ts_type}: {ts} keySize: {-1 if key is None else len(key)} "
                             f"valueSize: {-1 if value is None else len(value)} "
                             f"sequence: {_next_sequence(b.base_sequence, offset - b.base_offset)} "
                             f"headerKeys: [{','.join(h[0] for h in headers)}]")
                    if b.is_control:
                        line += _control(key, value)
                    sep = " "
                else:
                    sep = ""
                if print_data and not b.is_control:
                    if key is not None:
                        line += f"{sep}key: {bytes(key).decode('utf-8', 'replace')}"
                        sep = " "
                    if value is not None:
                        line += f" payload: {bytes(value).decode('utf-8', 'replace')}"
                print(line)
        valid += b.size
    trailing = len(data) - valid
    if trailing > 0 and max_bytes == INT_MAX:
        print(f"Found {trailing} invalid bytes at the end of {os.path.basename(path)}")


def _control(key, value) -> str:
    ctype = int.from_bytes(bytes(key)[2:4], "big", signed=True) if key is not None and len(key) >= 4 else -1
    name = _CONTROL_TYPES.get(ctype)
    if name is None:
        return f" controlType: UNKNOWN({ctype})"
    epoch = int.from_bytes(bytes(value)[2:6], "big", signed=True) if value is not None and len(value) >= 6 else -1
    return f" endTxnMarker: {name} coordinatorEpoch: {epoch}"


def _entries(path: str, entry: struct.Struct) -> list:
    """The entries of an index file up to its zero-filled preallocation (an entry with relative offset 0
    after the first ends them, as Kafka reads them)."""
    data = _read(path)
    out = []
    for i, fields in enumerate(entry.iter_unpack(data[:len(data) - len(data) % entry.size])):
        rel = fields[0] if entry is _INDEX_ENTRY else fields[1]
        if i > 0 and rel == 0:
            break
        out.append(fields)
    return out


def _sanity(path: str, entry: struct.Struct) -> str | None:
    size = os.path.getsize(path)
    if size % entry.size:
        return (f"Index file {os.path.basename(path)} is corrupt, found {size} bytes which is neither positive "
                f"nor a multiple of {entry.size}.")
    return None


def dump_index(path, sanity_only, verify_only, max_message_size, problems: Problems) -> None:
    base = _base_offset(path)
    entries = _entries(path, _INDEX_ENTRY)
    if not entries:
        print(f"{path} is empty.")
        return
    if sanity_only:
        why = _sanity(path, _INDEX_ENTRY)
        print(why or f"{path} passed sanity check.")
        return
    log = _read(os.path.splitext(path)[0] + ".log")
    for rel, position in entries:
        offset = base + rel
        first = next(batches(log[position:position + max_message_size]), None)
        found = first[1].last_offset if first is not None else -1
        if found != offset:
            problems.index_mismatches.setdefault(os.path.abspath(path), []).insert(0, (offset, found))
        if not verify_only:
            print(f"offset: {offset} position: {position}")


def dump_time_index(path, sanity_only, verify_only, problems: Problems) -> None:
    base = _base_offset(path)
    entries = _entries(path, _TIME_ENTRY)
    if sanity_only:
        why = _sanity(path, _TIME_ENTRY)
        print(why or f"{path} passed sanity check.")
        return
    stem = os.path.splitext(path)[0]
    log = _read(stem + ".log")
    index = [(base + rel, pos) for rel, pos in _entries(stem + ".index", _INDEX_ENTRY)] \
        if os.path.exists(stem + ".index") else []
    prev = -1
    key = os.path.abspath(path)
    for ts, rel in entries:
        offset = base + rel
        start = max((pos for o, pos in index if o <= offset), default=0)
        batch = next(((p, b) for p, b in batches(log[start:]) if b.last_offset >= offset), None)
        if batch is None:
            problems.time_not_found.setdefault(key, []).append((offset, -1))
        elif batch[1].last_offset != offset:
            problems.time_not_found.setdefault(key, []).append((offset, batch[1].last_offset))
        else:
            p, b = batch
            records = decode_records(memoryview(log)[start + p:start + p + b.size])
            max_ts = max((r[1] for r in records), default=-1)
            if max_ts != ts:
                problems.time_mismatches.setdefault(key, []).append((ts, max_ts))
            if prev >= ts:
                problems.time_out_of_order.setdefault(key, []).append((ts, prev))
        if not verify_only:
            print(f"timestamp: {ts} offset: {offset}")
        prev = ts


def dump_snapshot(path) -> None:
    data = _read(path)
    if len(data) < _SNAPSHOT_HEAD.size:
        print(f"Snapshot file {path} is too small", file=sys.stderr)
        return
    version, crc, count = _SNAPSHOT_HEAD.unpack_from(data)
    body = data[_SNAPSHOT_HEAD.size:]
    if crc32c(data[6:]) != crc:
        print(f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
              f"Computed crc: {crc32c(data[6:])}", file=sys.stderr)
        return
    for pid, epoch, last_seq, last_offset, delta, ts, coord_epoch, txn_first in _SNAPSHOT_ENTRY.iter_unpack(
            body[:count * _SNAPSHOT_ENTRY.size]):
        first_seq = (last_seq - delta) % (INT_MAX + 1)
        print(f"producerId: {pid} producerEpoch: {epoch} coordinatorEpoch: {coord_epoch} "
              f"currentTxnFirstOffset: {_optional_long(txn_first if txn_first >= 0 else None)} lastTimestamp: {ts} "
              f"firstSequence: {first_seq} lastSequence: {last_seq} lastOffset: {last_offset} offsetDelta: {delta} "
              f"timestamp: {ts}")


def dump_txn_index(path) -> None:
    data = _read(path)
    for version, pid, first, last, lso in _TXN_ENTRY.iter_unpack(data[:len(data) - len(data) % _TXN_ENTRY.size]):
        print(f"version: {version} producerId: {pid} firstOffset: {first} lastOffset: {last} "
              f"lastStableOffset: {lso}")
