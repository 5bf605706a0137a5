"""Spark data source benchmark (not a timed test): what the Arrow-native path buys.

    python -m kbroker.perf.spark_bench [--mb 200] [--sizes 100,1024] [--rounds 3] [--only read|write]
                                       [--no-tuples] [--out spark_bench.json]
    python -m kbroker.perf.spark_bench --only clientfetch --client-fetch-mb 200 --rounds 6 \
                                       --client-fetch-old old_connection.py

Starts one kbroker broker (LocalCluster, real ZooKeeper, log dir in /dev/shm when it exists) and
one SparkSession (local[2]), then for each record size:

- read: ``SELECT sum(length(value))`` over the topic (warm cache; ``rounds`` interleaved rounds,
  each variant once per round, ratios taken within a round: median and range) through
  * ``kbroker``        the data source (fetch by recv_into, native decode into Arrow buffers),
  * ``synthetic``      an Arrow source yielding the same bytes with the same schema, no broker:
                       the ceiling of a Python data source on this Spark,
  * ``clientfetch``    the data source with its fetches made through kbroker's asyncio client
                       (fresh frame buffers) instead of its recv_into channel (reused buffers),
  * ``tuples``         the same fetches decoded per record into Python tuples (what the native
                       decode replaces; half the rounds);
  ratios synthetic time / kbroker time (target >= 0.8), the same for clientfetch, and kbroker vs
  tuples; broker CPU-seconds per read of the topic.
- write: the same rows written by the ``kbroker`` sink vs confluent-kafka producing them inside
  the same Spark tasks (acks=all, lz4 off), ratio kbroker / confluent-kafka.
- throughput (``--throughput-gb 1,2,4,8 --throughput-probe-gb 0.004``): the throughput job at each
  size, seconds and CPU-seconds per GB, spread and fit, and where each phase's fixed time goes; with the
  probe, the marginal seconds per GB of each size with the probe of the same round subtracted, their
  spread (goal <= 1.15) and the 1 TB capacity figures they give.
- client fetch (``--client-fetch-mb``): kbroker's client alone reading one partition, optionally
  against an older connection.py in the same rounds (client CPU and wall time, old / new).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


# ---------------------------------------------------------------- comparison sources

class _Part(InputPartition):
    def __init__(self, topic, partition, start, end):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        super().__init__((topic, partition, start, end))


class SyntheticSource(DataSource):
    """Yields ``rows`` records of ``size`` bytes per partition as Arrow batches of the Kafka
    schema, built from numpy buffers (no broker, no decode)."""

    @classmethod
    def name(cls):
        return "kbroker_synthetic"

    def schema(self):
        from kbroker.spark.source import kafka_schema
        return kafka_schema(False)

    def reader(self, schema):
        return SyntheticReader(self.options)


class SyntheticReader(DataSourceReader):
    def __init__(self, options):
        self.rows = int(options["rows"])
        self.size = int(options["size"])
        self.parts = int(options["partitions"])
        self.batch = int(options.get("batch", "65536"))

    def partitions(self):
        return [_Part("synthetic", p, 0, self.rows) for p in range(self.parts)]

    def read(self, part):
        import numpy as np
        import pyarrow as pa

        from kbroker._native.arrow import kafka_arrow_schema
        schema = kafka_arrow_schema(False)
        size = self.size
        done = 0
        tb = b"synthetic"
        while done < self.rows:
            n = min(self.batch, self.rows - done)
            # fresh buffers per batch, as a decoder produces them
            vals = np.full(n * size, 7, dtype=np.uint8)
            offs = np.arange(0, (n + 1) * size, size, dtype=np.int32)
            value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(vals)])
            key = pa.nulls(n, pa.binary())
            topic = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 9),
                                                           pa.py_buffer(tb * n)])
            partc = pa.array(np.full(n, part.partition, dtype=np.int32))
            offset = pa.array(np.arange(done, done + n, dtype=np.int64))
            ts = pa.array(np.full(n, 1_700_000_000_000_000, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC"))
            tst = pa.array(np.zeros(n, dtype=np.int32))
            yield pa.RecordBatch.from_arrays([key, value, topic, partc, offset, ts, tst], schema=schema)
            done += n


class ClientFetchSource(DataSource):
    """The kbroker source with its fetches made through kbroker's client (asyncio streams) instead
    of the source's own recv_into channel: the read path before that change, same decode."""

    @classmethod
    def name(cls):
        return "kbroker_clientfetch"

    def schema(self):
        from kbroker.spark.source import kafka_schema
        return kafka_schema(False)

    def reader(self, schema):
        from kbroker.spark.options import read_config
        return ClientFetchReader(read_config(self.options, streaming=False))


class ClientFetchReader(DataSourceReader):
    def __init__(self, cfg):
        self.cfg = cfg

    def partitions(self):
        from kbroker.spark.kafka import plan_batch
        from kbroker.spark.options import split_ranges
        return [_Part(r.topic, r.partition, r.start, r.end) for r in split_ranges(plan_batch(self.cfg), None)]

    def read(self, part):
        from kbroker.spark.kafka import read_range
        c = self.cfg
        yield from read_range(c.client, part.topic, part.partition, part.start, part.end, False,
                              c.fail_on_data_loss, c.max_records_per_batch, c.max_bytes_per_batch, via_client=True)


class TupleSource(DataSource):
    """The kbroker source's fetch path with a per-record Python decode yielding tuples."""

    @classmethod
    def name(cls):
        return "kbroker_tuples"

    def schema(self):
        from kbroker.spark.source import kafka_schema
        return kafka_schema(False)

    def reader(self, schema):
        from kbroker.spark.options import read_config
        return TupleReader(read_config(self.options, streaming=False))


class TupleReader(DataSourceReader):
    def __init__(self, cfg):
        self.cfg = cfg

    def partitions(self):
        from kbroker.spark.kafka import plan_batch
        from kbroker.spark.options import split_ranges
        return [_Part(r.topic, r.partition, r.start, r.end) for r in split_ranges(plan_batch(self.cfg), None)]

    def read(self, part):
        import asyncio
        import datetime

        from kbroker.client import Consumer
        cfg = self.cfg.client
        loop = asyncio.new_event_loop()
        consumer = Consumer(cfg.bootstrap)
        utc = datetime.timezone.utc
        try:
            pos = part.start
            while pos < part.end:
                r = loop.run_until_complete(consumer.fetch(part.topic, part.partition, pos,
                                                           max_bytes=cfg.max_partition_fetch_bytes))
                for rec in r.records:
                    if rec.offset >= part.end:
                        break
                    yield (rec.key, rec.value, rec.topic, rec.partition, rec.offset,
                           datetime.datetime.fromtimestamp(rec.timestamp / 1000, utc), rec.timestamp_type)
                pos = max(r.next_offset, pos + (0 if r.records else 1))
        finally:
            loop.run_until_complete(consumer.close())
            loop.close()


# ---------------------------------------------------------------- helpers

def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _interleaved(fns: dict, rounds: int, skip: dict | None = None) -> dict:
    """Run each named query once per round, in the same order every round, so every variant
    sees the same machine load; -> {name: [seconds per round]}. ``skip``: {name: rounds to run}."""
    times: dict = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            if skip and r >= skip.get(name, rounds):
                continue
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def _ratios(num: list, den: list) -> dict:
    """Same-round ratios num/den (times): median and range."""
    import statistics
    rs = [n / d for n, d in zip(num, den)]
    return {"median": round(statistics.median(rs), 3), "min": round(min(rs), 3), "max": round(max(rs), 3),
            "rounds": [round(x, 3) for x in rs]}


def _confluent_writer(bootstrap, topic):
    def produce(batches):
        import pyarrow as pa
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1048576,
                      "queue.buffering.max.kbytes": 262144})
        n = 0
        for b in batches:
            for v, part in zip(b.column(0).to_pylist(), b.column(1).to_pylist()):
                while True:
                    try:
                        p.produce(topic, v, partition=part)
                        break
                    except BufferError:
                        p.poll(0.01)
                n += 1
            p.poll(0)
        assert p.flush(120) == 0
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])
    return produce


def run(a) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    root = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None, prefix="spark-bench-"))
    results = {"settings": vars(a), "sizes": {}}
    try:
        return _run_sizes(a, root, results)
    finally:
        import shutil
        shutil.rmtree(root, ignore_errors=True)


def _run_sizes(a, root, results) -> dict:
    from kbroker.spark import register
    from kbroker.spark.progress import session
    from kbroker.spark.throughput import create_topic
    from kbroker.testing import LocalCluster
    with LocalCluster(root, brokers=1) as cluster:
        bs = cluster.bootstrap
        broker_pid = next(iter(cluster.brokers.values())).pid
        spark = session("kbroker-spark-bench", "local[2]", {"spark.ui.enabled": "false",
                                                            "spark.sql.execution.arrow.maxRecordsPerBatch": "20000"})
        register(spark)
        spark.dataSource.register(SyntheticSource)
        spark.dataSource.register(TupleSource)
        spark.dataSource.register(ClientFetchSource)
        from pyspark.sql import functions as F
        # warm-up: Python workers started, modules imported, before anything is timed
        create_topic(bs, "bench-warmup", 2, 1)
        warm = spark.range(20000, numPartitions=2).select(F.expr("CAST(id AS STRING)").alias("value"))
        warm.write.format("kbroker").option("kafka.bootstrap.servers", bs).option("topic", "bench-warmup") \
            .mode("append").save()
        warm.select("value", F.lit(0).alias("partition")).mapInArrow(
            _confluent_writer(bs, "bench-warmup"), "n long").collect()
        spark.read.format("kbroker").option("kafka.bootstrap.servers", bs).option("subscribe", "bench-warmup") \
            .load().agg(F.sum(F.length("value"))).collect()
        for size in a.sizes:
            rows = int(a.mb * 1e6 // size)
            parts = 2
            res = {"rows": rows, "bytes": rows * size}
            # an explicit partition column keeps the topic's partitions (= read tasks) equal in size
            gen = spark.range(rows, numPartitions=parts).select(
                F.expr(f"CAST(repeat('x', {size}) AS BINARY)").alias("value"),
                (F.col("id") % parts).cast("int").alias("partition"))
            # write: kbroker sink vs confluent-kafka in the same tasks
            t_k, t_c = f"bench-k-{size}", f"bench-c-{size}"
            create_topic(bs, t_k, parts, 1)
            t0 = time.perf_counter()
            (gen.write.format("kbroker").option("kafka.bootstrap.servers", bs).option("topic", t_k)
             .option("kafka.batch.size", "1048576").mode("append").save())
            res["write_kbroker_s"] = time.perf_counter() - t0
            if a.only in ("all", "write"):
                create_topic(bs, t_c, parts, 1)
                t0 = time.perf_counter()
                gen.select("value", "partition").mapInArrow(_confluent_writer(bs, t_c), "n long") \
                    .agg(F.sum("n")).collect()
                res["write_confluent_s"] = time.perf_counter() - t0
                res["write_ratio"] = res["write_confluent_s"] / res["write_kbroker_s"]
                res["write_kbroker_MBps"] = rows * size / 1e6 / res["write_kbroker_s"]
            if a.only in ("all", "read"):
                src = {"kafka.bootstrap.servers": bs, "subscribe": t_k}
                synth = {"rows": str(rows // parts), "size": str(size), "partitions": str(parts)}
                want = {"kbroker": rows * size, "synthetic": (rows // parts) * parts * size,
                        "clientfetch": rows * size, "tuples": rows * size}

                def q(name, fmt, opts):
                    def run_query():
                        r = spark.read.format(fmt)
                        for k, v in opts.items():
                            r = r.option(k, v)
                        got = r.load().agg(F.sum(F.length("value"))).collect()[0][0]
                        assert got == want[name], (name, got, want[name])
                    return run_query

                fns = {"kbroker": q("kbroker", "kbroker", src),
                       "synthetic": q("synthetic", "kbroker_synthetic", synth),
                       "clientfetch": q("clientfetch", "kbroker_clientfetch", src)}
                if not a.no_tuples:
                    fns["tuples"] = q("tuples", "kbroker_tuples", src)
                for fn in fns.values():     # one untimed pass: warm page cache and workers
                    fn()
                cpu0 = _cpu_seconds(broker_pid)
                times = _interleaved(fns, a.rounds, skip={"tuples": max(1, a.rounds // 2)})
                # broker CPU of all reads of the round robin, per read of the topic
                nreads = sum(len(t) for n, t in times.items() if n != "synthetic")
                res["broker_cpu_s_per_read"] = (_cpu_seconds(broker_pid) - cpu0) / nreads
                res["read_s"] = {n: [round(x, 3) for x in t] for n, t in times.items()}
                res["read_kbroker_best_s"] = min(times["kbroker"])
                res["read_kbroker_MBps"] = rows * size / 1e6 / res["read_kbroker_best_s"]
                res["read_vs_synthetic"] = _ratios(times["synthetic"], times["kbroker"])
                res["read_clientfetch_vs_synthetic"] = _ratios(times["synthetic"], times["clientfetch"])
                res["read_vs_clientfetch"] = _ratios(times["clientfetch"], times["kbroker"])
                if "tuples" in times:
                    res["read_vs_tuples"] = _ratios(times["tuples"], times["kbroker"])
            results["sizes"][str(size)] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}
            print(json.dumps({size: results["sizes"][str(size)]}), flush=True)
        spark.stop()
    return results


def run_disk(a) -> dict:
    """One disk-bound run: the kbroker sink writes ``disk_gb`` GB of 1 KiB records to a broker whose
    log dir is on disk (``disk_dir``), beside perf.baselines.disk (os.write without and with
    fdatasync of 1 MiB buffers into the same filesystem)."""
    from pyspark.sql import functions as F

    from kbroker.perf.baselines import disk  # noqa: I001
    from kbroker.spark.progress import session
    from kbroker.spark.throughput import create_topic
    from kbroker.testing import LocalCluster

    root = Path(tempfile.mkdtemp(dir=a.disk_dir, prefix="spark-bench-disk-"))
    size, parts = 1024, 2
    rows = int(a.disk_gb * 1e9 // size)
    out = {"directory": str(root), "gb": a.disk_gb}
    with LocalCluster(root, brokers=1) as cluster:
        bs = cluster.bootstrap
        spark = session("kbroker-spark-bench-disk", "local[2]", {"spark.ui.enabled": "false"})
        create_topic(bs, "disk", parts, 1)
        gen = spark.range(rows, numPartitions=parts).select(
            F.expr(f"CAST(repeat('x', {size}) AS BINARY)").alias("value"),
            (F.col("id") % parts).cast("int").alias("partition"))
        t0 = time.perf_counter()
        (gen.write.format("kbroker").option("kafka.bootstrap.servers", bs).option("topic", "disk")
         .option("kafka.batch.size", "1048576").mode("append").save())
        out["write_s"] = time.perf_counter() - t0
        out["write_MBps"] = rows * size / 1e6 / out["write_s"]
        spark.stop()
    import shutil
    shutil.rmtree(root, ignore_errors=True)
    out["baseline"] = disk(a.disk_dir, 1 << 20, max_bytes=1 << 30, max_seconds=10.0)
    out["write_vs_os_write"] = out["write_MBps"] / out["baseline"]["write"]["mb_per_s"]
    out["write_vs_fdatasync"] = out["write_MBps"] / out["baseline"]["write_fdatasync"]["mb_per_s"]
    return out


def run_throughput(a) -> dict:
    """The throughput job (kbroker.spark.throughput) at each of ``throughput_gb`` sizes, in
    ``throughput_rounds`` rounds (sizes in alternating order per round) in one SparkSession against
    one broker: seconds per GB per phase and size (median of the rounds), the spread across sizes
    (max / min, target <= 1.15) and the marginal cost (least-squares slope of seconds over GB); the
    same for the CPU seconds of the local process tree (``cpu_*``: Spark, its Python workers and
    the broker), which other work on the machine does not stretch as it stretches wall time. Each
    run also records how long the tree's threads waited for a core (``*_runq``) and its phase
    timelines' fixed parts (``fixed_parts``: planning before the first job, waiting for the first
    task, the driver's time between and after jobs). ``throughput_probe_gb``: a tiny size run first
    in every round whose phase times measure the fixed cost directly (``probe``), not by the fit."""
    import shutil
    import statistics

    from kbroker.spark import throughput
    from kbroker.spark.progress import timeline_summary
    from kbroker.testing import LocalCluster

    root = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None, prefix="spark-bench-tp-"))
    runs: dict = {}
    try:
        with LocalCluster(root, brokers=1) as cluster:
            for r in range(a.throughput_rounds):
                sizes = a.throughput_gb if r % 2 == 0 else list(reversed(a.throughput_gb))
                # the probe (a size small enough to be all fixed cost) first in every round: what a
                # phase costs whatever the size, measured under the same load as the sizes
                for gb in ([a.throughput_probe_gb] if a.throughput_probe_gb else []) + sizes:
                    args = throughput.parse_args([
                        "--bootstrap-servers", cluster.bootstrap, "--gb", str(gb), "--partitions",
                        str(a.throughput_partitions), "--master", "local[2]", "--topic", f"tp-{r}-{gb}",
                        "--report", os.devnull])
                    rep = throughput.run(args)
                    assert rep["ok"], rep.get("verify")
                    runs.setdefault(str(gb), []).append(
                        {ph: v["seconds"] for ph, v in rep["phases"].items()} | {"warmup": rep.get("warmup_seconds")}
                        | {f"{ph}_cpu": v["cpu_seconds_local"] for ph, v in rep["phases"].items()}
                        | {f"{ph}_runq": v["run_queue_seconds_local"] for ph, v in rep["phases"].items()}
                        | {f"{ph}_{k}": x for ph, v in rep["phases"].items()
                           for k, x in timeline_summary(v.get("timeline")).items()})
                    print(json.dumps({"gb": gb, "round": r, **runs[str(gb)][-1]}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict = {"runs": runs}
    probe = runs.pop(str(a.throughput_probe_gb), None) if a.throughput_probe_gb else None
    gbs = [float(g) for g in runs]
    # wall seconds, and CPU seconds of the whole local process tree (Spark, Python workers, the
    # broker): the same linearity figures for a cost that the machine's other load does not stretch
    for key, suffix in (("", ""), ("_cpu", "cpu_")):
        for ph in ("write", "read", "expected"):
            if any(x.get(ph + key) is None for g in runs for x in runs[g]):
                continue
            med = {g: statistics.median(x[ph + key] for x in runs[g]) for g in runs}
            spg = {g: round(med[g] / float(g), 3) for g in runs}
            out.setdefault(f"{suffix}seconds_per_GB", {})[ph] = spg
            out.setdefault(f"{suffix}spread", {})[ph] = round(max(spg.values()) / min(spg.values()), 3)
            ys = [med[g] for g in runs]
            mx, my = statistics.mean(gbs), statistics.mean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(gbs, ys)) / sum((x - mx) ** 2 for x in gbs)
            out.setdefault(f"{suffix}marginal_s_per_GB", {})[ph] = round(slope, 3)
            out.setdefault(f"{suffix}fixed_s", {})[ph] = round(my - slope * mx, 3)
            out.setdefault(f"{suffix}seconds_per_GB_range", {})[ph] = {
                g: [round(min(x[ph + key] for x in runs[g]) / float(g), 3),
                    round(max(x[ph + key] for x in runs[g]) / float(g), 3)] for g in runs}
    if probe:
        # the probe's phases: median [min, max] wall and CPU seconds (the fixed cost measured, not fitted)
        out["probe"] = {"gb": a.throughput_probe_gb, "runs": probe}
        for ph in ("write", "read", "expected"):
            for key in ("", "_cpu", "_runq"):
                xs = [x[ph + key] for x in probe if x.get(ph + key) is not None]
                if xs:
                    out["probe"][ph + key] = [round(statistics.median(xs), 3), round(min(xs), 3), round(max(xs), 3)]
    if probe:
        out.update(marginal_over_probe(runs, probe))
    # the parts of each phase that do not grow with the data (from the phase timelines), over all
    # runs: median [min, max]
    for ph in ("write", "read", "expected"):
        for part in ("plan_s", "to_first_task_s", "between_jobs_s", "after_jobs_s"):
            xs = [x[f"{ph}_{part}"] for g in runs for x in runs[g] if x.get(f"{ph}_{part}") is not None]
            if xs:
                out.setdefault("fixed_parts", {}).setdefault(ph, {})[part] = \
                    [round(statistics.median(xs), 3), round(min(xs), 3), round(max(xs), 3)]
    return out


MARGINAL_GOAL_SPREAD = 1.15


def marginal_over_probe(runs: dict, probe: list, cores: int = 2) -> dict:
    """Per size and phase, (the phase's seconds - the probe's in the same round) / GB: the marginal cost
    with the fixed cost measured, not fitted; the same for the CPU seconds of the local process tree
    (``<phase>_cpu``: Spark, its Python workers and the broker), which other work on the machine
    stretches less than wall time. Round r of every size pairs with probe r (each round runs the probe
    first, then every size once). Median [min, max] over rounds, the spread of the medians across sizes
    (max / min) against MARGINAL_GOAL_SPREAD, and for 1 TB: the seconds on this ``cores``-core host
    (fixed + marginal x 1000), the MB/s per core the wall rate gives, and the core-seconds the CPU rate
    gives."""
    import statistics
    out: dict = {"marginal_s_per_GB_over_probe": {}, "marginal_spread_over_probe": {}, "model_1TB": {}}
    meds: dict = {}
    for ph in ("write", "read", "expected"):
        for key in (ph, ph + "_cpu"):
            per_size = {}
            for g, xs in runs.items():
                vals = [(x[key] - pr[key]) / float(g) for x, pr in zip(xs, probe)
                        if x.get(key) is not None and pr.get(key) is not None]
                if vals:
                    per_size[g] = [round(statistics.median(vals), 3), round(min(vals), 3), round(max(vals), 3)]
            if not per_size:
                continue
            m = [v[0] for v in per_size.values()]
            out["marginal_s_per_GB_over_probe"][key] = per_size
            spread = round(max(m) / min(m), 3) if min(m) > 0 else None
            out["marginal_spread_over_probe"][key] = {"spread": spread, "goal": f"<= {MARGINAL_GOAL_SPREAD}",
                                                      "met": spread is not None and spread <= MARGINAL_GOAL_SPREAD}
            meds[key] = statistics.median(m)
        if ph not in meds:
            continue
        m = meds[ph]
        fixed = statistics.median(pr[ph] for pr in probe if pr.get(ph) is not None)
        model = {"marginal_s_per_GB": round(m, 3), "fixed_s": round(fixed, 3),
                 "seconds_1TB_this_host": round(fixed + 1000 * m, 1),
                 "mb_per_s_per_core": round(1000 / (m * cores), 1) if m > 0 else None}
        if ph + "_cpu" in meds:
            model["cpu_s_per_GB_marginal"] = round(meds[ph + "_cpu"], 3)
            model["core_seconds_per_TB_cpu"] = round(1000 * meds[ph + "_cpu"], 1)
        out["model_1TB"][ph] = model
    return out


def run_client_fetch(a) -> dict:
    """kbroker's client fetching one partition of ``client_fetch_mb`` MB of 1 KiB records
    (Consumer.fetch(decode=False), 8 MiB per fetch, warm cache), in interleaved rounds with the
    current BrokerConnection and, when ``client_fetch_old`` names a file holding an older
    kbroker/client/connection.py (``git show REV:kbroker/client/connection.py > old.py``), with
    that one: client CPU-seconds and wall seconds per read of the partition, and old / new."""
    import asyncio
    import importlib.util
    import shutil
    import statistics

    import kbroker.client.cluster as cluster_mod
    from kbroker.client import Admin, Consumer, NewTopic, Producer
    from kbroker.record import iter_batches
    from kbroker.testing import LocalCluster

    variants = {"new": cluster_mod.BrokerConnection}
    if a.client_fetch_old:
        spec = importlib.util.spec_from_file_location("kbroker_old_connection", a.client_fetch_old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        variants = {"old": old.BrokerConnection, "new": cluster_mod.BrokerConnection}

    async def fill(bs, nbytes):
        async with Admin(bs) as admin:
            await admin.create_topics([NewTopic("cf", 1, 1)])
        async with Producer(bs, acks=1) as p:
            value, futs = b"x" * 1024, []
            for _ in range(nbytes // 1024):
                futs.append(await p.send("cf", value, partition=0))
                if len(futs) > 5000:
                    await asyncio.gather(*futs)
                    futs.clear()
            await asyncio.gather(*futs)

    async def read_all(bs):
        async with Consumer(bs) as c:
            end = await c.list_offsets("cf", 0, "latest")
            pos = total = 0
            while pos < end:
                r = await c.fetch("cf", 0, pos, max_bytes=8 << 20, decode=False)
                total += len(r.raw)
                for info in iter_batches(memoryview(r.raw), 0, False):
                    pos = max(pos, info.next_offset)
            return total

    root = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None, prefix="spark-bench-cf-"))
    res: dict = {name: {"cpu_s": [], "wall_s": []} for name in variants}
    try:
        with LocalCluster(root, brokers=1) as cluster:
            asyncio.run(fill(cluster.bootstrap, int(a.client_fetch_mb * 1e6)))
            for r in range(a.rounds + 1):
                order = list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))
                for name, cls in order:
                    cluster_mod.BrokerConnection = cls
                    c0, w0 = time.process_time(), time.perf_counter()
                    nbytes = asyncio.run(read_all(cluster.bootstrap))
                    if r:       # round 0 warms the page cache
                        res[name]["cpu_s"].append(round(time.process_time() - c0, 4))
                        res[name]["wall_s"].append(round(time.perf_counter() - w0, 4))
    finally:
        cluster_mod.BrokerConnection = variants["new"]
        shutil.rmtree(root, ignore_errors=True)
    out: dict = {"bytes": nbytes, "variants": res}
    for name, v in res.items():
        out[f"{name}_cpu_s_median"] = statistics.median(v["cpu_s"])
        out[f"{name}_wall_s_median"] = statistics.median(v["wall_s"])
    if "old" in res:
        out["cpu_old_over_new"] = _ratios(res["old"]["cpu_s"], res["new"]["cpu_s"])
        out["wall_old_over_new"] = _ratios(res["old"]["wall_s"], res["new"]["wall_s"])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="kbroker.perf.spark_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=200, help="MB of values per record size (default 200)")
    p.add_argument("--sizes", default="100,1024", help="record sizes in bytes (default 100,1024)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds of the reads (default 3)")
    p.add_argument("--only", choices=["all", "read", "write", "throughput", "clientfetch"], default="all",
                   help="read: skip the confluent-kafka write comparison; write: skip the reads; "
                        "throughput: only the --throughput-gb runs; clientfetch: only the --client-fetch-mb run")
    p.add_argument("--no-tuples", action="store_true", help="skip the (slow) tuple-yielding read")
    p.add_argument("--out", default="spark_bench.json")
    p.add_argument("--disk-gb", type=float, default=0, help="also a disk-bound write of this many GB (0 = skip)")
    p.add_argument("--disk-dir", default="/var/tmp", help="filesystem of the disk-bound run (default /var/tmp)")
    p.add_argument("--throughput-gb", default="", help="run the throughput job at these sizes, e.g. 0.5,1,2 "
                                                      "(with --only throughput: nothing else)")
    p.add_argument("--throughput-rounds", type=int, default=2, help="rounds of the throughput sizes (default 2)")
    p.add_argument("--throughput-partitions", type=int, default=4, help="topic partitions of the throughput job")
    p.add_argument("--throughput-probe-gb", type=float, default=0,
                   help="also run the job at this (tiny) size first in every round: its phase times are the "
                        "fixed cost per phase under the same load, kept out of the spread and fit (e.g. 0.004)")
    p.add_argument("--client-fetch-mb", type=float, default=0,
                   help="also time kbroker's client fetching this many MB of one partition (0 = skip)")
    p.add_argument("--client-fetch-old", default="",
                   help="with --client-fetch-mb: an older kbroker/client/connection.py to compare in the same rounds")
    a = p.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",")]
    a.throughput_gb = [float(g) for g in a.throughput_gb.split(",") if g]
    res = run(a) if a.only not in ("throughput", "clientfetch") else {"settings": vars(a)}
    if a.client_fetch_mb:
        res["client_fetch"] = run_client_fetch(a)
        print(json.dumps({"client_fetch": {k: v for k, v in res["client_fetch"].items() if k != "variants"}}),
              flush=True)
    if a.throughput_gb:
        res["throughput"] = run_throughput(a)
        print(json.dumps({"throughput": {k: (v if k != "probe" else {x: y for x, y in v.items() if x != "runs"})
                                         for k, v in res["throughput"].items() if k != "runs"}}), flush=True)
    if a.disk_gb:
        res["disk"] = run_disk(a)
        print(json.dumps({"disk": res["disk"]}, default=str), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"report: {a.out}")


if __name__ == "__main__":
    main()
