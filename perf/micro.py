"""Micro-benchmarks of kbroker's data path (pyperf).

Run (results as pyperf JSON; ``--fast`` for a rough run, ``--rigorous`` for a careful one):

    python -m kbroker.perf.micro --fast -o micro.json
    python -m kbroker.perf.micro --rigorous -o micro.json
    python -m kbroker.perf.micro --select 'crc32c_' --fast -o crc.json     # a subset (regex)
    python -m kbroker.perf.micro --list                                   # names only
    python -m pyperf show micro.json
    python -m pyperf compare_to before.json after.json --table

Every value is **seconds per call of the named operation** (pyperf's unit; ``pyperf show`` prints
ns/us/ms). Throughput = the size in the name divided by that time. Names carry the sizes:

  crc32c_ours_<size> / crc32c_pkg_<size>        (128B, 1KiB, 4KiB, 64KiB, 1MiB)
      CRC-32C of one random buffer: ``kbroker._native.crc.crc32c`` against the ``crc32c`` package
      (both called from Python, so both pay the same call overhead; it dominates at 128 B).
  batch_validate_stamp_<batch>_<record>_records  (16KiB / 1MiB batches of 100B / 1KiB records)
      ``batch.validate_and_stamp`` of one uncompressed producer batch: header checks, CRC over the
      batch, record count, and the in-place baseOffset/partitionLeaderEpoch stamp (CreateTime).
  log_append_<batch>_1KiB_records                (16KiB / 1MiB)
      ``Log.append_as_leader`` (validate+stamp, producer-state check, one write, sparse index upkeep)
      into a Log on /dev/shm (tmpfs: no disk in the figure).
  index_lookup_native_64Ki_entries
      ``segment.index_lookup``: binary search of one random offset in an offset index of 65,535
      entries (the mmap of a real segment's ``.index``).
  log_read_translate_64Ki_entries
      ``Log.read(offset, 1 MiB)``: offset → segment → index lookup → short header scan (pread) →
      end position for 1 MiB of whole batches; returns the (fd, position, length) region.
  produce_request_decode_v8_4x16KiB
      header parse + ``decode_request`` of a Produce v8 request with 4 partitions × one 16 KiB batch
      (records stay memoryviews into the frame).
  fetch_response_encode_v11_4_partitions_regions
      ``encode_response`` of a Fetch v11 response of 4 partitions whose records are FileRegions
      (header bytes only; the payload would leave through sendfile).
  metadata_response_encode_v8_100_topics
      ``encode_response`` of a Metadata v8 response: 1 broker, 100 topics × 4 partitions.
  batch_build_1000x100B_<codec>                  (none, lz4, zstd)
      ``BatchBuilder``: 1,000 ``append`` calls of 16 B keys and 100 B text values, then ``build``
      (compression and CRC included).
  batch_decode_records_10000x100B
      ``batch.decode_records`` of a 10,000-record batch into Python tuples.
  arrow_decode_10000x100B
      the same batch into pyarrow arrays (offset, timestamp, key, value) as one RecordBatch.

Method: each benchmark builds its inputs once per worker process, before timing (seeded random
data from ``kbroker.perf.inputs``, several distinct inputs cycled so one cached buffer does not
flatter the figure), then times ``loops`` calls with ``bench_time_func`` and puts the last result in
a sink. Subjects that stamp batches in place get fresh copies whose baseOffset was reset outside
the timed region (``inputs.BatchRing``; the timer is paused between passes over the ring).
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import sys
import tempfile
import time

import pyperf

from kbroker.perf import inputs
from kbroker.perf.inputs import KiB, MiB, SINK, size_label

_clock = time.perf_counter
_cycle = itertools.cycle
_islice = itertools.islice

MAX_MESSAGE_BYTES = 2 * MiB     # above the 1 MiB batches (Kafka's default is 1,048,588)
LEADER_EPOCH = 0

# name -> factory; a factory builds the inputs (untimed) and returns time_func(loops) -> seconds.
BENCHMARKS: dict[str, callable] = {}


def benchmark(name: str):
    def register(factory):
        if name in BENCHMARKS:
            raise ValueError(f"duplicate benchmark {name}")
        BENCHMARKS[name] = factory
        return factory
    return register


def scratch_dir(prefix: str) -> str:
    """A private directory on tmpfs (/dev/shm when present), removed at exit."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    atexit.register(shutil.rmtree, path, True)
    return path


def cycled(items, loops):
    """The first ``loops`` items of ``items`` repeated (C-level iteration, no index arithmetic)."""
    return _islice(_cycle(items), loops)


# ---- CRC32C ------------------------------------------------------------------------------------
CRC_SIZES = (128, KiB, 4 * KiB, 64 * KiB, MiB)


def _crc_bench(which: str, size: int):
    def factory():
        if which == "ours":
            from kbroker._native.crc import crc32c as fn
        else:
            from crc32c import crc32c as fn
        # 16 MiB of distinct inputs for the large sizes, 64 buffers for the small ones.
        count = max(4, min(64, 16 * MiB // size))
        bufs = inputs.random_buffers(size, count, f"crc/{size}")

        def time_func(loops):
            acc = 0
            t0 = _clock()
            for b in cycled(bufs, loops):
                acc ^= fn(b)
            dt = _clock() - t0
            SINK.put(acc)
            return dt
        return time_func
    return factory


for _size in CRC_SIZES:
    for _which in ("ours", "pkg"):
        benchmark(f"crc32c_{_which}_{size_label(_size)}")(_crc_bench(_which, _size))


# ---- batch validate + stamp --------------------------------------------------------------------
def _stamp_bench(batch_bytes: int, value_size: int):
    def factory():
        from kbroker._native.batch import validate_and_stamp
        protos = [inputs.fill_batch(batch_bytes, value_size, f"stamp/{batch_bytes}/{value_size}/{i}")
                  for i in range(4)]
        ring = inputs.BatchRing(protos, total_bytes=max(4 * MiB, 16 * batch_bytes))

        def time_func(loops):
            elapsed = 0.0
            left = loops
            info = None
            while left:
                bufs = ring.take(left)            # untimed: baseOffset reset to 0
                t0 = _clock()
                for b in bufs:
                    info = validate_and_stamp(b, 1000, LEADER_EPOCH, MAX_MESSAGE_BYTES, -1)
                elapsed += _clock() - t0
                left -= len(bufs)
            SINK.put(info.record_count)
            return elapsed
        return time_func
    return factory


for _batch_bytes in (16 * KiB, MiB):
    for _value in (100, KiB):
        benchmark(f"batch_validate_stamp_{size_label(_batch_bytes)}_{size_label(_value)}_records")(
            _stamp_bench(_batch_bytes, _value))


# ---- Log.append_as_leader ----------------------------------------------------------------------
ROLL_UNTIMED_AT = 64 * MiB


def _open_log(path: str, overrides: dict):
    from kbroker.log.log import Log, LogConfig
    log = Log(path, "bench", 0, LogConfig(overrides))
    atexit.register(log.close)       # runs before the rmtree registered earlier (LIFO)
    return log


def _append_bench(batch_bytes: int, value_size: int):
    def factory():
        from kbroker.log.log import now_ms
        root = scratch_dir("kbroker-micro-append-")
        # retention.bytes=0 and no delete delay: the untimed housekeeping below frees tmpfs memory.
        log = _open_log(os.path.join(root, "bench-0"),
                        {"retention.bytes": 0, "file.delete.delay.ms": 0})
        protos = [inputs.fill_batch(batch_bytes, value_size, f"append/{batch_bytes}/{value_size}/{i}")
                  for i in range(4)]
        ring = inputs.BatchRing(protos, total_bytes=max(4 * MiB, 16 * batch_bytes))
        append = log.append_as_leader

        def housekeeping(now):
            # Untimed: keep the segment small enough for tmpfs and never roll inside the timer.
            if log.active_segment.size >= ROLL_UNTIMED_AT:
                log.roll(now)
                log.delete_old_segments(now)
                log.remove_deleted_files(now, force=True)

        def time_func(loops):
            elapsed = 0.0
            left = loops
            res = None
            while left:
                now = now_ms()
                housekeeping(now)
                bufs = ring.take(left)
                t0 = _clock()
                for b in bufs:
                    res = append(b, LEADER_EPOCH, now)
                elapsed += _clock() - t0
                left -= len(bufs)
            SINK.put(res.last_offset)
            return elapsed
        return time_func
    return factory


for _batch_bytes in (16 * KiB, MiB):
    benchmark(f"log_append_{size_label(_batch_bytes)}_1KiB_records")(_append_bench(_batch_bytes, KiB))


# ---- index lookup / offset translation ---------------------------------------------------------
INDEX_BATCHES = 65536          # one index entry per batch after the first: 65,535 entries
LOOKUP_TARGETS = 4096


def _indexed_log():
    """A Log whose single segment holds 65,536 one-record batches and an index entry for each
    (index.interval.bytes=0), built once per worker process."""
    from kbroker.log.log import now_ms
    root = scratch_dir("kbroker-micro-index-")
    log = _open_log(os.path.join(root, "bench-0"), {"index.interval.bytes": 0})
    one = inputs.fill_batch(4 * KiB, 100, "index/one", max_records=1)
    now = now_ms()
    for _ in range(INDEX_BATCHES):
        log.append_as_leader(bytearray(one), LEADER_EPOCH, now)
    assert len(log.segments) == 1 and log.active_segment.index.entries == INDEX_BATCHES - 1
    targets = [inputs.rng("index/targets").randrange(INDEX_BATCHES) for _ in range(LOOKUP_TARGETS)]
    return log, targets


@benchmark("index_lookup_native_64Ki_entries")
def _index_native():
    from kbroker._native import segment as native
    log, targets = _indexed_log()
    idx = log.active_segment.index
    mm, entries, kind, base = idx.mm, idx.entries, native.INDEX_OFFSET, idx.base_offset
    rel = [t - base for t in targets]
    lookup = native.index_lookup

    def time_func(loops):
        acc = 0
        t0 = _clock()
        for r in cycled(rel, loops):
            acc += lookup(mm, entries, kind, r)
        dt = _clock() - t0
        SINK.put(acc)
        return dt
    return time_func


@benchmark("log_read_translate_64Ki_entries")
def _log_read():
    log, targets = _indexed_log()
    read = log.read

    def time_func(loops):
        size = 0
        t0 = _clock()
        for off in cycled(targets, loops):
            size += read(off, MiB).size
        dt = _clock() - t0
        SINK.put(size)
        return dt
    return time_func


# ---- protocol: request decode, response encode -------------------------------------------------
@benchmark("produce_request_decode_v8_4x16KiB")
def _produce_decode():
    from kbroker.protocol import api
    frames = []
    for i in range(8):
        body = {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [{
            "name": f"topic-{inputs.rng(f'decode/name/{i}').randrange(10**6)}",
            "partition_data": [{"index": p, "records": inputs.fill_batch(16 * KiB, 100, f"decode/{i}/{p}")}
                               for p in range(4)]}]}
        frame = api.encode_request(0, 8, i, "kbroker-perf", body)
        frames.append(memoryview(frame)[4:])          # the broker sees the frame without its size
    parse, decode = api.parse_request_header, api.decode_request

    def time_func(loops):
        body = None
        t0 = _clock()
        for f in cycled(frames, loops):
            header, pos = parse(f)
            body = decode(header.api_key, header.api_version, f, pos)
        dt = _clock() - t0
        SINK.put(body)
        return dt
    return time_func


@benchmark("fetch_response_encode_v11_4_partitions_regions")
def _fetch_encode():
    from kbroker.protocol import api
    from kbroker.protocol.types import FileRegions
    bodies = []
    for i in range(8):
        r = inputs.rng(f"fetch/{i}")
        hw = r.randrange(1 << 40)
        bodies.append({"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{
            "topic": f"topic-{r.randrange(10**6)}",
            "partitions": [{
                "partition_index": p, "error_code": 0, "high_watermark": hw,
                "last_stable_offset": hw, "log_start_offset": 0, "aborted_transactions": None,
                "preferred_read_replica": -1,
                "records": FileRegions([(100 + p, r.randrange(1 << 30), 256 * KiB)]),
            } for p in range(4)]}]})
    encode = api.encode_response

    def time_func(loops):
        chunks = None
        t0 = _clock()
        for i, body in enumerate(cycled(bodies, loops)):
            chunks = encode(1, 11, i, body)
        dt = _clock() - t0
        SINK.put(chunks)
        return dt
    return time_func


@benchmark("metadata_response_encode_v8_100_topics")
def _metadata_encode():
    from kbroker.protocol import api
    bodies = []
    for i in range(4):
        r = inputs.rng(f"metadata/{i}")
        bodies.append({
            "throttle_time_ms": 0,
            "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": 9092, "rack": None}],
            "cluster_id": "kbroker-perf-cluster", "controller_id": 0,
            "topics": [{
                "error_code": 0, "name": f"topic-{r.randrange(10**9)}", "is_internal": False,
                "partitions": [{"error_code": 0, "partition_index": p, "leader_id": 0,
                                "leader_epoch": r.randrange(100), "replica_nodes": [0],
                                "isr_nodes": [0], "offline_replicas": []} for p in range(4)],
            } for _ in range(100)],
        })
    encode = api.encode_response

    def time_func(loops):
        chunks = None
        t0 = _clock()
        for i, body in enumerate(cycled(bodies, loops)):
            chunks = encode(3, 8, i, body)
        dt = _clock() - t0
        SINK.put(chunks)
        return dt
    return time_func


# ---- record accumulation (client side) ---------------------------------------------------------
BUILD_RECORDS = 1000


def _build_bench(codec_name: str):
    def factory():
        from kbroker._native.batch import BatchBuilder
        codec = inputs.CODECS[codec_name]
        sets = [inputs.records(BUILD_RECORDS, 100, f"build/{i}", text=True) for i in range(4)]
        ts = int(time.time() * 1000)
        # Warm the codec import (done once per process by build()) outside the timer.
        warm = BatchBuilder(codec, MiB)
        warm.append(ts, b"k", b"v")
        warm.build()

        def time_func(loops):
            out = None
            t0 = _clock()
            for recs in cycled(sets, loops):
                b = BatchBuilder(codec, MiB)
                append = b.append
                for k, v in recs:
                    append(ts, k, v)
                out = b.build()
            dt = _clock() - t0
            SINK.put(len(out))
            return dt
        return time_func
    return factory


for _codec in ("none", "lz4", "zstd"):
    benchmark(f"batch_build_{BUILD_RECORDS}x100B_{_codec}")(_build_bench(_codec))


# ---- RecordBatch -> Arrow ----------------------------------------------------------------------
ARROW_RECORDS = 10_000


def batch_to_arrow(batch):
    """Decode one uncompressed RecordBatch v2 into a pyarrow RecordBatch with offset, timestamp,
    key and value columns.

    Built from what exists today: the native ``decode_records`` makes a Python tuple per record,
    then pyarrow copies the columns. A native path that writes Arrow buffers (offsets + data for
    key/value, int64 for offset/timestamp) straight from the batch, with no per-record Python
    object, is future work for the Spark data source."""
    import pyarrow as pa
    from kbroker._native.batch import decode_records
    offsets, timestamps, keys, values, _headers = zip(*decode_records(batch))
    return pa.RecordBatch.from_arrays(
        [pa.array(offsets, pa.int64()), pa.array(timestamps, pa.timestamp("ms")),
         pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
        names=["offset", "timestamp", "key", "value"])


def _arrow_inputs():
    return [inputs.fill_batch(4 * MiB, 100, f"arrow/{i}", max_records=ARROW_RECORDS) for i in range(2)]


@benchmark(f"batch_decode_records_{ARROW_RECORDS}x100B")
def _decode_records():
    from kbroker._native.batch import decode_records
    batches = _arrow_inputs()

    def time_func(loops):
        recs = None
        t0 = _clock()
        for b in cycled(batches, loops):
            recs = decode_records(b)
        dt = _clock() - t0
        SINK.put(len(recs))
        return dt
    return time_func


@benchmark(f"arrow_decode_{ARROW_RECORDS}x100B")
def _arrow_decode():
    import pyarrow  # noqa: F401  (imported untimed)
    batches = _arrow_inputs()
    table = batch_to_arrow(batches[0])
    assert table.num_rows == ARROW_RECORDS, table.num_rows

    def time_func(loops):
        rb = None
        t0 = _clock()
        for b in cycled(batches, loops):
            rb = batch_to_arrow(b)
        dt = _clock() - t0
        SINK.put(rb.num_rows)
        return dt
    return time_func


# ---- runner ------------------------------------------------------------------------------------
def lazy(factory):
    """time_func that builds its inputs on the first call (in the worker process, before its own
    timer starts), so a worker prepares only the benchmark it runs."""
    state = {}

    def time_func(loops):
        fn = state.get("fn")
        if fn is None:
            fn = state["fn"] = factory()
        return fn(loops)
    return time_func


def _forward_args(cmd, args):
    if args.select:
        cmd.extend(("--select", args.select))


def main(module: str = "kbroker.perf.micro", benchmarks: dict | None = None) -> None:
    benchmarks = BENCHMARKS if benchmarks is None else benchmarks
    runner = pyperf.Runner(program_args=("-m", module), add_cmdline_args=_forward_args)
    runner.argparser.add_argument("--select", metavar="REGEX",
                                  help="run only the benchmarks whose name matches REGEX")
    runner.argparser.add_argument("--list", action="store_true", help="print the benchmark names")
    args = runner.parse_args()
    names = [n for n in benchmarks if not args.select or re.search(args.select, n)]
    if args.list:
        print("\n".join(names))
        return
    if not names:
        sys.exit(f"no benchmark matches {args.select!r}")
    runner.metadata["description"] = "kbroker micro-benchmarks (seconds per operation)"
    for name in names:
        runner.bench_time_func(name, lazy(benchmarks[name]))


if __name__ == "__main__":
    main()
