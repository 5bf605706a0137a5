"""Throughput job: generate N GB inside Spark tasks, write them to a kbroker topic, read them back,
and verify the record count and an order-independent checksum per partition.

    python -m kbroker.spark.throughput --bootstrap-servers h1:9092 --gb 1
    spark-submit --master spark://m:7077 spark/throughput.py --bootstrap-servers h1:9092,h2:9092 --gb 100

Records are ``record_size`` bytes: the record id (8 bytes, big-endian) then bytes cut from a
fixed random block at an id-dependent position, so every value differs and compresses like
random data. Record i goes to partition ``i % partitions`` (the sink's ``partition`` column), so
the expected per-partition count and ``sum(crc32(value))`` come from re-generating the values
(nothing is collected to the driver but one row per partition). Memory per task is one Arrow
batch of about ``--batch-mb`` MB, whatever N is.

Prints MB/s per phase (with a progress bar on a terminal) and writes a JSON report that echoes
every setting. Exit status 1 when the verification fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

SEED = 0x6B62726F


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="kbroker.spark.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", required=True, help="kbroker brokers, host:port[,host:port]")
    p.add_argument("--gb", type=float, default=1.0, help="data to generate, in GB of values (default 1)")
    p.add_argument("--record-size", type=int, default=1024, help="value bytes per record (default 1024, >= 16)")
    p.add_argument("--partitions", type=int, default=6, help="topic partitions (default 6)")
    p.add_argument("--replication-factor", type=int, default=1, help="topic replication factor (default 1)")
    p.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"],
                   help="producer compression.type (default none)")
    p.add_argument("--acks", default="all", choices=["all", "1", "0"], help="producer acks (default all)")
    p.add_argument("--batch-size", type=int, default=1048576, help="producer batch.size (default 1 MiB)")
    p.add_argument("--tasks", type=int, default=0, help="write tasks (default: the topic's partitions)")
    p.add_argument("--min-partitions", type=int, default=0, help="read tasks hint (minPartitions; default 0 = "
                                                                   "one per topic partition)")
    p.add_argument("--batch-mb", type=float, default=8.0, help="Arrow batch size in MB inside tasks (default 8)")
    p.add_argument("--topic", default=None, help="topic name (default kbroker-throughput-<time>)")
    p.add_argument("--keep-topic", action="store_true", help="do not delete the topic afterwards")
    p.add_argument("--master", default=None, help="Spark master when run with plain python (default local[*])")
    p.add_argument("--report", default="throughput-report.json", help="JSON report path")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    p.add_argument("--no-warmup", action="store_true",
                   help="do not run the phases once on a small warm-up topic before timing")
    a = p.parse_args(argv)
    if a.record_size < 16:
        p.error("--record-size must be >= 16")
    if a.gb <= 0 or a.partitions < 1 or a.replication_factor < 1:
        p.error("--gb, --partitions and --replication-factor must be positive")
    return a


def make_generator(record_size: int, partitions: int):
    """mapInArrow function: ids -> (partition int, value binary)."""
    def generate(batches):
        import numpy as np
        import pyarrow as pa
        rng = np.random.default_rng(SEED)
        block = rng.integers(0, 256, size=2 * record_size, dtype=np.uint8)
        windows = np.lib.stride_tricks.sliding_window_view(block, record_size - 8)
        for b in batches:
            ids = b.column(0).to_numpy()
            n = len(ids)
            vals = np.empty((n, record_size), dtype=np.uint8)
            vals[:, :8] = ids.astype(">i8").view(np.uint8).reshape(n, 8)
            vals[:, 8:] = windows[ids % (record_size + 8)]
            offsets = np.arange(0, (n + 1) * record_size, record_size, dtype=np.int32)
            value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(vals)])
            part = pa.array((ids % partitions).astype(np.int32), pa.int32())
            yield pa.RecordBatch.from_arrays([part, value], names=["partition", "value"])
    return generate


def create_topic(bootstrap: str, topic: str, partitions: int, rf: int) -> None:
    import asyncio

    from kbroker.client import Admin, NewTopic

    async def go():
        async with Admin(bootstrap) as admin:
            await admin.create_topics([NewTopic(topic, partitions, rf)])
    asyncio.run(go())
    from .kafka import wait_for_partitions
    from .options import ClientConfig
    if wait_for_partitions(ClientConfig(bootstrap), topic, timeout=60) != partitions:
        raise RuntimeError(f"topic {topic} did not get {partitions} partitions")


def delete_topic(bootstrap: str, topic: str) -> None:
    import asyncio

    from kbroker.client import Admin

    async def go():
        async with Admin(bootstrap) as admin:
            await admin.delete_topics([topic])
    asyncio.run(go())


def per_partition(df):
    from pyspark.sql import functions as F
    rows = (df.groupBy("partition").agg(F.count(F.lit(1)).alias("n"), F.sum(F.crc32("value")).alias("crc"))
            .collect())
    return {int(r["partition"]): (int(r["n"]), int(r["crc"] or 0)) for r in rows}


def run(args) -> dict:
    from .progress import Progress, session
    records = int(args.gb * 1e9 // args.record_size)
    topic = args.topic or f"kbroker-throughput-{int(time.time())}"
    tasks = args.tasks or args.partitions
    rows_per_batch = max(1, int(args.batch_mb * 1e6 // args.record_size))
    spark = session("kbroker-throughput", args.master,
                    {"spark.sql.execution.arrow.maxRecordsPerBatch": str(rows_per_batch)})
    # The checksum pass groups by topic partition: a reduce side of 200 (Spark's default) meant
    # 200 shuffle files per map task and a fixed cost per phase whatever the size; one reduce task per
    # topic partition is enough. A value given to spark-submit wins.
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    settings = {k: v for k, v in vars(args).items()}
    settings.update(topic=topic, records=records, write_tasks=tasks, rows_per_arrow_batch=rows_per_batch,
                    spark_master=spark.sparkContext.master,
                    spark_default_parallelism=spark.sparkContext.defaultParallelism,
                    spark_sql_shuffle_partitions=int(spark.conf.get("spark.sql.shuffle.partitions")))
    nbytes = records * args.record_size
    report = {"settings": settings, "phases": {}}
    warm_topic = f"{topic}-warmup"
    topics = [topic] if args.no_warmup else [topic, warm_topic]
    for t in topics:
        create_topic(args.bootstrap_servers, t, args.partitions, args.replication_factor)

    def generated(n):
        return spark.range(n, numPartitions=tasks).mapInArrow(
            make_generator(args.record_size, args.partitions), "partition int, value binary")

    def write(df, t):
        (df.write.format("kbroker").option("kafka.bootstrap.servers", args.bootstrap_servers)
         .option("topic", t).option("kafka.acks", args.acks).option("kafka.compression.type", args.compression)
         .option("kafka.batch.size", str(args.batch_size)).mode("append").save())

    def reader(t):
        r = spark.read.format("kbroker").option("kafka.bootstrap.servers", args.bootstrap_servers).option("subscribe", t)
        if args.min_partitions:
            r = r.option("minPartitions", str(args.min_partitions))
        return r.load()

    try:
        gen = generated(records)
        if not args.no_warmup:
            # The three phases once, with the same plans, on a small warm-up topic: Spark's Python
            # workers (the generator's and the sink's, which run side by side in a write task),
            # the planners and the client connections start here and not inside the timed phases.
            # Their start-up is a fixed cost of seconds, not part of the per-GB rate.
            t0 = time.monotonic()
            small = generated(tasks * 64)
            write(small, warm_topic)
            warm_got, warm_want = per_partition(reader(warm_topic)), per_partition(small)
            if warm_got != warm_want:
                raise RuntimeError(f"warm-up topic {warm_topic}: read {warm_got}, expected {warm_want}")
            report["warmup_seconds"] = round(time.monotonic() - t0, 3)
        with Progress(spark, "write", nbytes, force=args.progress) as pw:
            write(gen, topic)
        report["phases"]["write"] = _phase(pw, nbytes, records)
        with Progress(spark, "read", nbytes, force=args.progress) as pr:
            got = per_partition(reader(topic))
        report["phases"]["read"] = _phase(pr, nbytes, records)
        with Progress(spark, "expected", nbytes, force=args.progress) as pe:
            want = per_partition(gen)
        report["phases"]["expected"] = _phase(pe, nbytes, records)
        verify = {}
        for p in range(args.partitions):
            w, g = want.get(p, (0, 0)), got.get(p, (0, 0))
            verify[str(p)] = {"expected_records": w[0], "read_records": g[0],
                              "expected_checksum": w[1], "read_checksum": g[1], "ok": w == g}
        report["verify"] = verify
        report["ok"] = all(v["ok"] for v in verify.values()) and sum(v["read_records"] for v in verify.values()) \
            == records
    finally:
        for t in topics:
            if t == topic and args.keep_topic:
                continue
            try:
                delete_topic(args.bootstrap_servers, t)
            except Exception as e:      # the report matters more than the cleanup
                report["cleanup_error"] = str(e)
    return report


def _phase(prog, nbytes: int, records: int) -> dict:
    """A phase's figures from its Progress. cpu_seconds_local: CPU of this process and its
    descendants over the phase (with a local master all of Spark, plus a broker this process
    started; executors on other hosts are not counted); unlike seconds, it does not stretch when
    other work takes the cores. run_queue_seconds_local: how long the same threads waited for a
    core (that stretch). timeline: the phase's Spark jobs and stages (progress.phase_timeline)."""
    seconds, cpu, rq = prog.seconds, prog.cpu_seconds, prog.run_queue_seconds
    return {"seconds": round(seconds, 3), "MB_per_s": round(nbytes / 1e6 / seconds, 2) if seconds else None,
            "records_per_s": round(records / seconds) if seconds else None,
            "seconds_per_GB": round(seconds / (nbytes / 1e9), 3) if nbytes else None,
            "cpu_seconds_local": round(cpu, 2) if cpu is not None else None,
            "run_queue_seconds_local": round(rq, 2) if rq is not None else None,
            "timeline": prog.timeline}


def main(argv=None) -> int:
    from .progress import format_timeline
    args = parse_args(argv)
    report = run(args)
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
    for name, ph in report["phases"].items():
        cpu = "" if ph.get("cpu_seconds_local") is None else f"  {ph['cpu_seconds_local']:.2f} CPU-s"
        rq = "" if ph.get("run_queue_seconds_local") is None else f", {ph['run_queue_seconds_local']:.2f} thread-s waiting for a core"
        print(f"{name:<9} {ph['seconds']:>9.2f} s  {ph['MB_per_s']:>9.2f} MB/s  {ph['records_per_s']:>10} records/s{cpu}{rq}")
    for name, ph in report["phases"].items():
        if ph.get("timeline"):
            print(format_timeline(name, ph["timeline"]))
    print(f"verification: {'OK' if report['ok'] else 'FAILED'} (report: {args.report})")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    if __package__ in (None, ""):       # spark-submit spark/throughput.py: run as kbroker.spark.throughput
        from kbroker.spark.throughput import main as _main
        sys.exit(_main())
    sys.exit(main())
