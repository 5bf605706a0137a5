"""The kbroker Spark data source in batch mode against a real broker: reads equal confluent-kafka's
for the same ranges (every column, headers included), writes land where Kafka's partitioner puts
them, bad options fail naming the option. The SparkSession is the `spark` fixture of
tests/spark/conftest.py (local[2], task retries allowed)."""
from __future__ import annotations

import datetime
import json
import uuid

import pytest

from checkers import murmur2_partition
from spark_util import consume_all, create_topic, produce

pytestmark = pytest.mark.timeout(600)


def _topic(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _read(spark, bootstrap, **opts):
    r = spark.read.format("kbroker").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def _rows(df):
    out = []
    for r in df.collect():
        d = r.asDict(recursive=True)
        # collect() gives naive datetimes in the session time zone (UTC here)
        d["timestamp"] = d["timestamp"].replace(tzinfo=datetime.timezone.utc)
        out.append(d)
    return sorted(out, key=lambda d: (d["topic"], d["partition"], d["offset"]))


def _records(n, big_every=0):
    for i in range(n):
        key = None if i % 5 == 0 else b"key-%d" % i
        if i % 7 == 0:
            value = None
        elif big_every and i % big_every == 1:
            value = bytes([i % 251]) * (1024 * 1024)       # 1 MiB values
        else:
            value = b"v%d-" % i * (i % 40)
        headers = None if i % 3 == 0 else [("h1", b"x%d" % i), ("h2", None if i % 2 else b"")]
        yield i % 3, key, value, headers


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_batch_read_equals_confluent_kafka(spark, bootstrap, codec):
    topic = _topic(f"sread-{codec}")
    create_topic(bootstrap, topic, 3, {"max.message.bytes": str(4 * 1024 * 1024)})
    n = produce(bootstrap, topic, _records(900, big_every=300 if codec in ("none", "zstd") else 0), codec)
    df = _read(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert [f.name for f in df.schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp",
                                                 "timestampType", "headers"]
    got = _rows(df)
    expected = consume_all(bootstrap, topic, {p: (0, 300) for p in range(3)})
    assert len(got) == n == len(expected)
    mismatches = [(g, e) for g, e in zip(got, expected) if g != e]
    assert not mismatches, mismatches[:2]


def test_ranges_min_partitions_and_offsets_json(spark, bootstrap):
    topic = _topic("sranges")
    create_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, ((i % 3, None, b"%d" % i, None) for i in range(3000)))
    # minPartitions=8 splits each 1000-offset range into round(1000/3000*8) = 3 pieces: 9 tasks
    # (Spark's proportional rule; minPartitions is a hint, not an exact count)
    df = _read(spark, bootstrap, subscribe=topic, minPartitions="8")
    assert df.rdd.getNumPartitions() == 9
    assert len(_rows(df)) == 3000
    starting = json.dumps({topic: {"0": 10, "1": -2, "2": 995}})
    ending = json.dumps({topic: {"0": 20, "1": 5, "2": -1}})
    got = _rows(_read(spark, bootstrap, subscribe=topic, startingOffsets=starting, endingOffsets=ending,
                      includeHeaders="true"))
    expected = consume_all(bootstrap, topic, {0: (10, 20), 1: (0, 5), 2: (995, 1000)})
    assert [(r["partition"], r["offset"]) for r in got] == [(r["partition"], r["offset"]) for r in expected]
    assert got == expected
    # assign reads just the partitions named
    got = _rows(_read(spark, bootstrap, assign=json.dumps({topic: [1]})))
    assert {r["partition"] for r in got} == {1} and len(got) == 1000
    # subscribePattern
    got = _read(spark, bootstrap, subscribePattern=topic.replace("sranges", "sran.es")).count()
    assert got == 3000


def test_empty_topic_and_empty_ranges_read_nothing(spark, bootstrap):
    topic = _topic("sempty")
    create_topic(bootstrap, topic, 2)
    assert _read(spark, bootstrap, subscribe=topic).count() == 0
    produce(bootstrap, topic, ((0, None, b"x", None) for _ in range(3)))
    ending = json.dumps({topic: {"0": 0, "1": 0}})
    assert _read(spark, bootstrap, subscribe=topic, endingOffsets=ending).count() == 0
    assert _read(spark, bootstrap, subscribe=topic).count() == 3


def test_starting_by_timestamp(spark, bootstrap):
    topic = _topic("sts")
    create_topic(bootstrap, topic, 1)
    base = 1_700_000_000_000
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(100):
        p.produce(topic, value=b"%d" % i, partition=0, timestamp=base + i * 1000)
    assert p.flush(30) == 0
    rows = _rows(_read(spark, bootstrap, subscribe=topic, startingTimestamp=str(base + 40_000)))
    assert [r["offset"] for r in rows] == list(range(40, 100))
    rows = _rows(_read(spark, bootstrap, subscribe=topic,
                       startingOffsetsByTimestamp=json.dumps({topic: {"0": base + 90_500}}),
                       endingOffsetsByTimestamp=json.dumps({topic: {"0": base + 95_000}})))
    assert [r["offset"] for r in rows] == list(range(91, 95))


def test_write_then_read_back_keyed_partitions_and_headers(spark, bootstrap):
    from pyspark.sql import functions as F
    topic = _topic("swrite")
    create_topic(bootstrap, topic, 5)
    n = 4000
    src = (spark.range(n).select(
        F.when(F.col("id") % 4 == 0, F.lit(None)).otherwise(F.concat(F.lit("user-"), (F.col("id") % 97).cast("string")))
        .alias("key"),
        F.concat(F.lit("payload-"), F.col("id").cast("string")).alias("value"),
        F.when(F.col("id") % 2 == 0, F.array(F.struct(F.lit("src").alias("key"),
                                                         F.col("id").cast("string").cast("binary").alias("value"))))
        .alias("headers")))
    (src.write.format("kbroker").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kafka.compression.type", "zstd").option("kafka.batch.size", "65536").mode("append").save())
    got = _rows(_read(spark, bootstrap, subscribe=topic, includeHeaders="true"))
    assert len(got) == n
    values = sorted(r["value"] for r in got)
    assert values == sorted(b"payload-%d" % i for i in range(n))
    wrong = [r for r in got if r["key"] is not None and r["partition"] != murmur2_partition(r["key"], 5)]
    assert not wrong, f"{len(wrong)} keyed rows on the wrong partition, e.g. {wrong[0]}"
    # null keys spread (sticky per Arrow batch of 500 rows, 2000 null keys)
    assert len({r["partition"] for r in got if r["key"] is None}) > 1
    for r in got:
        i = int(r["value"].split(b"-")[1])
        assert r["headers"] == ([{"key": "src", "value": b"%d" % i}] if i % 2 == 0 else None)


def test_write_partition_and_topic_columns_idempotent(spark, bootstrap):
    from pyspark.sql import functions as F
    t1, t2 = _topic("scol1"), _topic("scol2")
    create_topic(bootstrap, t1, 2)
    create_topic(bootstrap, t2, 3)
    df = spark.range(600).select(
        F.when(F.col("id") % 2 == 0, F.lit(t1)).otherwise(F.lit(t2)).alias("topic"),
        (F.col("id") % 2).cast("int").alias("partition"),
        F.col("id").cast("string").cast("binary").alias("value"))
    (df.write.format("kbroker").option("kafka.bootstrap.servers", bootstrap)
     .option("kafka.enable.idempotence", "true").option("kafka.linger.ms", "50").mode("append").save())
    got = _rows(_read(spark, bootstrap, subscribe=f"{t1},{t2}"))
    assert len(got) == 600
    for r in got:
        i = int(r["value"])
        assert r["topic"] == (t1 if i % 2 == 0 else t2) and r["partition"] == i % 2


def test_forced_task_retry_loses_nothing(spark, bootstrap):
    """Invariant: after a task fails mid-write and Spark retries it, every row is in the topic
    (lost = 0); the retry re-sends what the failed attempt had sent, so duplicates > 0 are expected
    and reported (at-least-once)."""
    import pyarrow as pa
    topic = _topic("sretry")
    create_topic(bootstrap, topic, 2)
    n = 40000

    def fail_first_attempt(batches):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        for i, b in enumerate(batches):
            yield pa.RecordBatch.from_arrays([pa.compute.cast(b.column(0), pa.string()).cast(pa.binary())],
                                             names=["value"])
            if i == 30 and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
                raise RuntimeError("injected task failure after 31 batches")

    df = spark.range(n, numPartitions=2).mapInArrow(fail_first_attempt, "value binary")
    (df.write.format("kbroker").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .mode("append").save())
    values = [int(r["value"]) for r in _rows(_read(spark, bootstrap, subscribe=topic))]
    lost = set(range(n)) - set(values)
    duplicates = len(values) - len(set(values))
    print(f"forced retry: lost {len(lost)} of {n}, duplicates {duplicates}")
    assert not lost
    assert duplicates > 0, "the injected failure did not make the retry re-send (checker saw nothing)"


@pytest.mark.parametrize("opts, needle", [
    ({"subscribe": "x"}, "kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": "B", "subscribe": "x", "assign": '{"x":[0]}'}, "'assign', 'subscribe'"),
    ({"kafka.bootstrap.servers": "B"}, "'subscribePattern'"),
    ({"kafka.bootstrap.servers": "B", "subscribe": "T", "startingOffsets": '{"T": {"0": 1'}, "startingOffsets"),
    ({"kafka.bootstrap.servers": "B", "subscribe": "T", "endingOffsets": '{"T": {"0": -2}}'}, "endingOffsets"),
    ({"kafka.bootstrap.servers": "B", "subscribe": "no-such-topic-kbroker"}, "option 'subscribe': topic 'no-such"),
    ({"kafka.bootstrap.servers": "B", "assign": '{"T": [7]}'}, "option 'assign'"),
    ({"kafka.bootstrap.servers": "B", "subscribe": "T", "minPartitions": "zero"}, "minPartitions"),
    ({"kafka.bootstrap.servers": "B", "subscribe": "T", "kafka.auto.offset.reset": "earliest"},
     "kafka.auto.offset.reset"),
])
def test_bad_options_name_the_option(spark, bootstrap, opts, needle):
    topic = "sbad-topic"
    if not hasattr(test_bad_options_name_the_option, "made"):
        create_topic(bootstrap, topic, 1)
        test_bad_options_name_the_option.made = True
    opts = {k: v.replace("B", bootstrap).replace("T", topic) if k != "minPartitions" else v
            for k, v in opts.items()}
    r = spark.read.format("kbroker")
    for k, v in opts.items():
        r = r.option(k, v)
    with pytest.raises(Exception) as err:
        r.load().collect()
    assert needle.replace("T", topic) in str(err.value), str(err.value)[-2000:]


def test_metadata_never_creates_topics(spark, bootstrap):
    from confluent_kafka.admin import AdminClient
    name = _topic("snever")
    with pytest.raises(Exception):
        _read(spark, bootstrap, subscribe=name).collect()
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    assert name not in topics


def test_write_without_value_fails_clearly(spark, bootstrap):
    with pytest.raises(Exception) as err:
        (spark.range(3).selectExpr("CAST(id AS STRING) AS key").write.format("kbroker")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", "x").mode("append").save())
    assert "'value' column" in str(err.value)


def test_phase_timeline_holds_the_phase_jobs_only(spark, bootstrap):
    # The throughput job's per-phase timeline: the jobs and stages of the phase (not the job run
    # just before it), every stage inside the phase, its tasks counted, the parts adding up.
    from kbroker.spark.progress import Progress, format_timeline, timeline_summary
    topic = _topic("stl")
    create_topic(bootstrap, topic, 2)
    spark.range(10, numPartitions=1).collect()     # a job just before the phase
    with Progress(spark, "write") as pw:
        # both partitions get rows whatever the sticky choice for null keys (it is random per task)
        (spark.range(300, numPartitions=3).selectExpr("CAST(id AS STRING) AS value", "CAST(id % 2 AS INT) AS partition")
         .write.format("kbroker")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).mode("append").save())
    with Progress(spark, "read") as pr:
        got = _read(spark, bootstrap, subscribe=topic).groupBy("partition").count().collect()
    assert sorted((r["partition"], r["count"]) for r in got) == [(0, 150), (1, 150)]
    w, r = pw.timeline, pr.timeline
    assert w["complete"] and r["complete"]
    assert [s["tasks"] for j in w["jobs"] for s in j["stages"]] == [3]
    assert min(j["job"] for j in r["jobs"]) > max(j["job"] for j in w["jobs"])
    assert [s["tasks"] for j in r["jobs"] for s in j["stages"]][0] == 2      # one per topic partition
    for tl, prog in ((w, pw), (r, pr)):
        for j in tl["jobs"]:
            assert 0 <= j["submit_s"] <= j["end_s"] <= prog.seconds + 0.05
            for s in j["stages"]:
                assert j["submit_s"] <= s["submit_s"] <= s["first_task_s"] <= s["end_s"] <= j["end_s"] + 0.05
                assert sum(s["locality"].values()) == s["tasks"] and s["task_run_s"] > 0
        parts = timeline_summary(tl)
        assert parts["plan_s"] >= 0 and parts["after_jobs_s"] >= 0
        assert sum(parts[k] for k in ("plan_s", "stages_s", "between_jobs_s", "after_jobs_s")) <= prog.seconds + 0.05
    assert format_timeline("read", r).count("stage ") == sum(len(j["stages"]) for j in r["jobs"])


def test_split_ranges_matches_sparks_rule():
    from kbroker.spark.options import OffsetRange, split_ranges
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 0), OffsetRange("t", 2, 50, 60)]
    # fewer ranges than minPartitions: 100/110*5 = 4.5 -> 5 pieces, 10/110*5 = 0.45 -> 1; empty dropped
    out = split_ranges(ranges, 5)
    assert [(r.partition, r.start, r.end) for r in out] == [
        (0, 0, 20), (0, 20, 40), (0, 40, 60), (0, 60, 80), (0, 80, 100), (2, 50, 60)]
    assert split_ranges(ranges, 2) == [ranges[0], ranges[2]]
    assert split_ranges(ranges, None) == [ranges[0], ranges[2]]


def test_stream_read_to_kbroker_stream_sink_available_now(spark, bootstrap, tmp_path):
    """readStream -> writeStream, both kbroker: Trigger.AvailableNow with maxOffsetsPerTrigger=400
    runs several micro-batches (ReadMaxRows) and copies every record once."""
    src, dst = _topic("sstr-src"), _topic("sstr-dst")
    create_topic(bootstrap, src, 3)
    create_topic(bootstrap, dst, 3)
    n = produce(bootstrap, src, ((i % 3, b"k%d" % i, b"v%d" % i, None) for i in range(1500)))
    q = (spark.readStream.format("kbroker").option("kafka.bootstrap.servers", bootstrap).option("subscribe", src)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "400").load()
         .selectExpr("key", "value")
         .writeStream.format("kbroker").option("kafka.bootstrap.servers", bootstrap).option("topic", dst)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert not q.isActive and q.exception() is None
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) == 4 and all(p["numInputRows"] <= 400 for p in batches), \
        [p["numInputRows"] for p in q.recentProgress]
    got = _rows(_read(spark, bootstrap, subscribe=dst))
    assert sorted(r["value"] for r in got) == sorted(b"v%d" % i for i in range(n))
    assert all(r["partition"] == murmur2_partition(r["key"], 3) for r in got)


def test_stream_waits_for_a_subscribed_topic_that_does_not_exist_yet(spark, bootstrap):
    """Spark's Kafka source behaviour: a streaming query subscribed to a missing topic keeps running
    (empty triggers) and reads the topic from its beginning once it appears; a batch read of the
    same missing topic still fails naming the option (test_bad_options_name_the_option)."""
    from kbroker.testing import wait_until
    topic, name = _topic("slate"), f"slate_{uuid.uuid4().hex[:8]}"
    q = (spark.readStream.format("kbroker").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
         .option("startingOffsets", "latest").load().selectExpr("partition", "offset", "value")
         .writeStream.format("memory").queryName(name).trigger(processingTime="300 milliseconds").start())
    try:
        # triggers without the topic: the query is alive and has read nothing
        wait_until(lambda: len(q.recentProgress) >= 2 or q.exception() is not None, timeout=120,
                   what="two triggers of the query", interval=0.3)
        assert q.isActive and q.exception() is None, q.exception()
        assert spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0] == 0
        create_topic(bootstrap, topic, 2)
        n = produce(bootstrap, topic, ((i % 2, None, b"late-%d" % i, None) for i in range(60)))

        def seen():
            if q.exception() is not None:
                raise AssertionError(q.exception())
            return spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0] >= n
        wait_until(seen, timeout=120, what="the records of the late topic", interval=0.5)
        rows = spark.sql(f"SELECT partition, offset, value FROM {name}").collect()
        assert sorted((r["partition"], r["offset"]) for r in rows) == \
            sorted((p, o) for p in range(2) for o in range(n // 2))
        assert sorted(bytes(r["value"]) for r in rows) == sorted(b"late-%d" % i for i in range(n))
    finally:
        q.stop()
