"""The ``kbroker`` PySpark data source: Spark's Kafka source and sink, Arrow-native.

    spark.read.format("kbroker").option("kafka.bootstrap.servers", "h:9092").option("subscribe", "t").load()
    df.write.format("kbroker").option("kafka.bootstrap.servers", "h:9092").option("topic", "t").save()

Registered automatically when kbroker is installed (module ``pyspark_kbroker``), or by hand with
``spark.dataSource.register(KBrokerDataSource)``. Readers yield ``pyarrow.RecordBatch``es with
exactly Spark's Arrow schema; writers take Arrow batches. Offsets (streaming checkpoints) are
``{"topic": {"partition": next_offset}}`` like the Kafka source's.
"""
from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    DataSourceStreamReader, InputPartition, WriterCommitMessage)
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

try:   # 4.1+: Arrow batches in the streaming sink too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - 4.0
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase
try:   # 4.2+: read limits and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - 4.0/4.1
    ReadAllAvailable = ReadMaxRows = ReadLimit = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from .options import OffsetRange, OptionError, client_config, normalize, read_config, split_ranges

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def kafka_schema(include_headers: bool = False) -> StructType:
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


class KafkaRangePartition(InputPartition):
    """One task's work: offsets [start, end) of topic-partition; plain fields only (pickled)."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        super().__init__((topic, partition, start, end))


def _read(cfg, part: KafkaRangePartition):
    if not isinstance(part, KafkaRangePartition):
        # partitions() planned nothing (every range empty): Spark still runs one task with a
        # plain InputPartition, which has nothing to read.
        return
    from .kafka import read_range
    yield from read_range(cfg.client, part.topic, part.partition, part.start, part.end,
                          cfg.include_headers, cfg.fail_on_data_loss,
                          cfg.max_records_per_batch, cfg.max_bytes_per_batch)


class KBrokerDataSource(DataSource):
    """``format("kbroker")``: options and schema of Spark's Kafka source (see spark/README.md)."""

    @classmethod
    def name(cls) -> str:
        return "kbroker"

    def schema(self):
        opts = normalize(self.options)
        include = opts.get("includeheaders", "false").strip().lower() == "true"
        return kafka_schema(include)

    def reader(self, schema: StructType) -> "KBrokerReader":
        return KBrokerReader(read_config(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> "KBrokerStreamReader":
        return KBrokerStreamReader(read_config(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> "KBrokerWriter":
        return KBrokerWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> "KBrokerStreamWriter":
        return KBrokerStreamWriter(self.options, schema)


class KBrokerReader(DataSourceReader):
    def __init__(self, cfg):
        self.cfg = cfg

    def partitions(self):
        from .kafka import plan_batch
        ranges = split_ranges(plan_batch(self.cfg), self.cfg.min_partitions)
        return [KafkaRangePartition(r.topic, r.partition, r.start, r.end) for r in ranges]

    def read(self, partition):
        return _read(self.cfg, partition)


def _offsets_dict(offsets: dict) -> dict:
    """{(t, p): off} -> {"t": {"p": off}}: topics sorted, partitions in numeric order."""
    out: dict = {}
    for (t, p) in sorted(offsets):
        out.setdefault(t, {})[str(p)] = offsets[(t, p)]
    return out


def _offsets_tuples(d: dict) -> dict:
    return {(t, int(p)): int(off) for t, parts in d.items() for p, off in parts.items()}


def rate_limit(start: dict, latest: dict, max_rows: int) -> dict:
    """Spark's KafkaMicroBatchStream.rateLimit: split ``max_rows`` across partitions in proportion to
    their backlog (a share under 1 rounds up, others down), never past ``latest``."""
    import math
    sizes = {tp: latest[tp] - start.get(tp, latest[tp]) for tp in latest}
    total = sum(s for s in sizes.values() if s > 0)
    if total <= max_rows:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        size = sizes[tp]
        if size <= 0:
            out[tp] = end
            continue
        prorate = max_rows * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + step)
    return out


class KBrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offset ranges. The checkpoint (not a consumer group) holds progress;
    a partition that appears later is read from its earliest offset."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.target: dict | None = None     # Trigger.AvailableNow: latest offsets at query start

    def initialOffset(self) -> dict:
        from .kafka import starting_offsets
        return _offsets_dict(starting_offsets(self.cfg))

    def _latest(self, start: dict) -> dict:
        from .kafka import DataLossError, latest_offsets
        earliest, latest = latest_offsets(self.cfg)
        gone = [tp for tp in start if tp not in latest]
        if gone and self.cfg.fail_on_data_loss:
            raise DataLossError(f"partitions {gone} are gone (deleted topic?); set failOnDataLoss=false "
                                "to go on without them")
        for tp, off in earliest.items():
            if tp not in start:
                start[tp] = off       # new partition: from its beginning, as Spark's Kafka source does
        return latest

    def getDefaultReadLimit(self):
        if self.cfg.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.cfg.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        from .kafka import latest_offsets
        self.target = latest_offsets(self.cfg)[1]

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        start_t = _offsets_tuples(start or {})
        latest = self._latest(start_t)
        if self.target is not None:
            latest = {tp: min(off, self.target.get(tp, start_t.get(tp, off))) for tp, off in latest.items()}
        max_rows = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        elif limit is None and self.cfg.max_offsets_per_trigger:   # 4.0/4.1: no limit argument
            max_rows = self.cfg.max_offsets_per_trigger
        end = rate_limit(start_t, latest, max_rows) if max_rows else latest
        # never go backwards (a truncated partition is data loss, handled by read())
        for tp, off in start_t.items():
            if tp in end and end[tp] < off:
                end[tp] = off
        return _offsets_dict(end)

    def reportLatestOffset(self):
        from .kafka import latest_offsets
        return _offsets_dict(latest_offsets(self.cfg)[1])

    def partitions(self, start: dict, end: dict):
        s, e = _offsets_tuples(start), _offsets_tuples(end)
        if any(tp not in s for tp in e):
            from .kafka import latest_offsets
            earliest = latest_offsets(self.cfg)[0]
            for tp in e:
                s.setdefault(tp, earliest.get(tp, 0))   # a new partition: from its beginning
        ranges = [OffsetRange(t, p, s.get((t, p), 0), off) for (t, p), off in sorted(e.items())]
        ranges = split_ranges(ranges, self.cfg.min_partitions)
        return [KafkaRangePartition(r.topic, r.partition, r.start, r.end) for r in ranges]

    def read(self, partition):
        return _read(self.cfg, partition)

    def commit(self, end: dict) -> None:
        # Progress lives in the checkpoint; nothing to commit to the brokers.
        pass


# ---------------------------------------------------------------- sink


class KBrokerCommitMessage(WriterCommitMessage):
    def __init__(self, records: int, batches: int, nbytes: int):
        self.records, self.batches, self.bytes = records, batches, nbytes


def _check_write_schema(options, schema: StructType):
    opts = normalize(options)
    cfg = client_config(opts, write=True)
    names = {f.name.lower(): f for f in schema.fields}
    if "value" not in names:
        raise OptionError("the DataFrame to write needs a 'value' column (string or binary)")
    for col in ("key", "value"):
        f = names.get(col)
        if f is not None and not isinstance(f.dataType, (StringType, BinaryType)):
            raise OptionError(f"column '{col}' must be string or binary, not {f.dataType.simpleString()}")
    topic = opts.get("topic") or None
    if topic is None:
        f = names.get("topic")
        if f is None:
            raise OptionError("no topic: set the option 'topic' or give the DataFrame a 'topic' column")
        if not isinstance(f.dataType, StringType):
            raise OptionError(f"column 'topic' must be a string, not {f.dataType.simpleString()}")
    f = names.get("partition")
    if f is not None and not isinstance(f.dataType, IntegerType):
        raise OptionError(f"column 'partition' must be an int, not {f.dataType.simpleString()}")
    f = names.get("headers")
    if f is not None and f.dataType.simpleString() != HEADERS_TYPE.simpleString():
        raise OptionError("column 'headers' must be array<struct<key:string,value:binary>>, not "
                          f"{f.dataType.simpleString()}")
    return cfg, topic


def _write(cfg, topic, iterator) -> KBrokerCommitMessage:
    from .kafka import ArrowProducer
    producer = ArrowProducer(cfg, topic)
    try:
        for rb in iterator:
            # Spark's column names are case-insensitive; the sink reads lower-case ones.
            rb = rb.rename_columns([c.lower() for c in rb.schema.names])
            producer.write(rb)
        stats = producer.close()
    except BaseException:
        producer.abort()
        raise
    return KBrokerCommitMessage(stats["records"], stats["batches"], stats["bytes"])


class KBrokerWriter(DataSourceArrowWriter):
    """At-least-once, like Spark's Kafka sink: a retried task sends its rows again."""

    def __init__(self, options, schema):
        self.cfg, self.topic = _check_write_schema(options, schema)

    def write(self, iterator):
        return _write(self.cfg, self.topic, iterator)


class KBrokerStreamWriter(_StreamWriterBase):
    def __init__(self, options, schema):
        self.cfg, self.topic = _check_write_schema(options, schema)

    def write(self, iterator):
        return _write(self.cfg, self.topic, iterator)

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass
