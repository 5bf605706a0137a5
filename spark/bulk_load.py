"""Bulk load: kbroker topic(s) -> Parquet (or any Spark file format), with progress and a final
count check.

    python -m kbroker.spark.bulk_load --bootstrap-servers h:9092 --subscribe orders --output /data/orders
    spark-submit --master yarn spark/bulk_load.py --bootstrap-servers h1:9092,h2:9092 \\
        --subscribe-pattern 'orders-.*' --output s3a://bucket/orders --format parquet

The offset ranges are fixed on the driver first (startingOffsets/endingOffsets as Spark's Kafka
source reads them), so the load is a consistent snapshot. After the write, the output is read back
and, per topic-partition, its row count and offset bounds are checked against that plan: a
partition whose log has gaps (compaction, transaction markers) loads fewer rows than its offset
span, which is reported, never more. Exit status 1 when the check fails.
"""
from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="kbroker.spark.bulk_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--subscribe", help="comma-separated topics")
    g.add_argument("--subscribe-pattern", help="topic regex (internal topics excluded)")
    g.add_argument("--assign", help='JSON {"topic":[0,1]}')
    p.add_argument("--starting-offsets", default="earliest", help="earliest (default) or JSON")
    p.add_argument("--ending-offsets", default="latest", help="latest (default) or JSON")
    p.add_argument("--output", required=True, help="output path")
    p.add_argument("--format", default="parquet", help="Spark output format (default parquet)")
    p.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite", "append"],
                   help="the count check reads the whole output: with append, use a path of its own")
    p.add_argument("--partition-by", default="", help="comma-separated output partition columns, e.g. topic")
    p.add_argument("--min-partitions", type=int, default=0, help="split large offset ranges into at least "
                                                                   "this many tasks")
    p.add_argument("--include-headers", action="store_true")
    p.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"])
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra source option, e.g. kafka.max.partition.fetch.bytes=16777216")
    p.add_argument("--master", default=None, help="Spark master with plain python (default local[*])")
    p.add_argument("--report", default=None, help="write a JSON report here")
    p.add_argument("--progress", action="store_true", help="progress bar even when not on a terminal")
    return p.parse_args(argv)


def source_options(a) -> dict:
    opts = {"kafka.bootstrap.servers": a.bootstrap_servers, "startingOffsets": a.starting_offsets,
            "endingOffsets": a.ending_offsets, "failOnDataLoss": a.fail_on_data_loss,
            "includeHeaders": "true" if a.include_headers else "false"}
    if a.subscribe:
        opts["subscribe"] = a.subscribe
    elif a.subscribe_pattern:
        opts["subscribePattern"] = a.subscribe_pattern
    else:
        opts["assign"] = a.assign
    if a.min_partitions:
        opts["minPartitions"] = str(a.min_partitions)
    for kv in a.option:
        k, sep, v = kv.partition("=")
        if not sep:
            raise SystemExit(f"--option {kv!r}: expected KEY=VALUE")
        opts[k] = v
    return opts


def run(a) -> dict:
    from pyspark.sql import functions as F

    from .kafka import plan_batch
    from .options import read_config
    from .progress import Progress, session
    opts = source_options(a)
    # Fix the ranges now (a snapshot): "latest" would otherwise move between planning and the check.
    plan = plan_batch(read_config(opts, streaming=False))
    pinned = dict(opts)
    starting, ending = {}, {}
    for r in plan:
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    if plan:
        pinned.pop("subscribePattern", None)
        pinned.pop("subscribe", None)
        pinned["assign"] = json.dumps({t: sorted(int(p) for p in parts) for t, parts in starting.items()})
        pinned["startingOffsets"] = json.dumps(starting)
        pinned["endingOffsets"] = json.dumps(ending)
    span = sum(r.size for r in plan)
    spark = session("kbroker-bulk-load", a.master)
    report = {"settings": vars(a), "offsets_planned": span, "partitions": len(plan)}
    if not plan:
        report.update(rows_written=0, ok=True, note="no topic-partitions matched")
        return report
    reader = spark.read.format("kbroker")
    for k, v in pinned.items():
        reader = reader.option(k, v)
    df = reader.load()
    writer = df.write.format(a.format).mode(a.mode)
    if a.partition_by:
        writer = writer.partitionBy(*[c.strip() for c in a.partition_by.split(",") if c.strip()])
    with Progress(spark, "load", force=a.progress, timeline=False) as pl:
        writer.save(a.output)
    report["load_seconds"] = round(pl.seconds, 3)
    # count check against the plan, per topic-partition
    with Progress(spark, "check", force=a.progress, timeline=False) as pc:
        out = spark.read.format(a.format).load(a.output)
        stats = {(r["topic"], int(r["partition"])): (int(r["n"]), int(r["lo"]), int(r["hi"]))
                 for r in out.groupBy("topic", "partition").agg(
                     F.count(F.lit(1)).alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi"))
                 .collect()}
    report["check_seconds"] = round(pc.seconds, 3)
    problems, gaps, rows = [], 0, 0
    for r in plan:
        n, lo, hi = stats.get((r.topic, r.partition), (0, r.start, r.end - 1))
        rows += n
        if r.size == 0:
            continue
        if n > r.size or lo < r.start or hi >= r.end:
            problems.append(f"{r.topic}-{r.partition}: {n} rows in offsets {lo}..{hi}, planned {r.start}..{r.end - 1}")
        gaps += r.size - n
    report.update(rows_written=rows, offsets_without_rows=gaps, problems=problems,
                  ok=not problems)
    return report


def main(argv=None) -> int:
    a = parse_args(argv)
    report = run(a)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(report, f, indent=2)
    print(f"loaded {report['rows_written']} rows from {report['partitions']} topic-partitions "
          f"({report['offsets_planned']} offsets planned, {report.get('offsets_without_rows', 0)} without a row: "
          f"compaction gaps or transaction markers) into {a.output}")
    for p in report.get("problems", []):
        print("count check FAILED:", p)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    if __package__ in (None, ""):
        from kbroker.spark.bulk_load import main as _main
        sys.exit(_main())
    sys.exit(main())
