"""Option parsing and offset planning for the ``kbroker`` data source, with the meaning Spark's
Kafka source gives the same option names (docs: structured-streaming-kafka-integration).

Everything here runs on the driver and returns plain picklable values. Errors are
``OptionError`` (a ValueError) and name the option at fault.
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field

EARLIEST, LATEST = -2, -1

# Consumer settings Spark's Kafka source refuses (it manages them itself).
REFUSED_READ = {
    "kafka.auto.offset.reset": "set the source option 'startingOffsets' instead",
    "kafka.key.deserializer": "keys are always read as bytes (cast the 'key' column)",
    "kafka.value.deserializer": "values are always read as bytes (cast the 'value' column)",
    "kafka.enable.auto.commit": "the source does not commit offsets (the checkpoint holds them)",
    "kafka.interceptor.classes": "interceptors are not supported",
}
REFUSED_WRITE = {
    "kafka.key.serializer": "keys are written as bytes (cast the 'key' column to binary or string)",
    "kafka.value.serializer": "values are written as bytes (cast the 'value' column to binary or string)",
}
STRATEGIES = ("assign", "subscribe", "subscribepattern")
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class OptionError(ValueError):
    """A data source option is missing, malformed or contradicts another one."""


def _bool(opts, name, default):
    raw = opts.get(name.lower())
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false, got {raw!r}")
    return v == "true"


def _int(opts, name, default, minimum=None):
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if minimum is not None and v < minimum:
        raise OptionError(f"option '{name}' must be >= {minimum}, got {v}")
    return v


@dataclass
class ClientConfig:
    """What executors need to reach the cluster (plain, picklable)."""
    bootstrap: str
    client_id: str = "kbroker-spark"
    request_timeout_ms: int = 30000
    retry_backoff_ms: int = 100
    max_partition_fetch_bytes: int = 8 * 1024 * 1024
    fetch_max_wait_ms: int = 500
    isolation_level: str = "read_uncommitted"
    check_crcs: bool = False
    retries: int = 10
    producer: dict = field(default_factory=dict)
    # security.protocol, ssl.*, sasl.* (the kafka.* options without the prefix), turned into a TLS
    # context and SASL credentials where the connections are made (an SSLContext does not pickle)
    security: dict = field(default_factory=dict)


# the kafka.* options the source reads, and the ones only the sink reads; security options pass
# through (kbroker.client.security); any other kafka.* option is refused rather than ignored
READ_KEYS = {"kafka.bootstrap.servers", "kafka.client.id", "kafka.request.timeout.ms", "kafka.retry.backoff.ms",
             "kafka.max.partition.fetch.bytes", "kafka.fetch.max.wait.ms", "kafka.isolation.level", "kafka.check.crcs"}
WRITE_KEYS = {"kafka.compression.type", "kafka.acks", "kafka.batch.size", "kafka.linger.ms",
              "kafka.enable.idempotence", "kafka.max.in.flight.requests.per.connection", "kafka.delivery.timeout.ms"}


def normalize(options) -> dict:
    return {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}


def client_config(opts: dict, write: bool = False) -> ClientConfig:
    bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' is required (host:port[,host:port...])")
    for k, why in (REFUSED_WRITE if write else REFUSED_READ).items():
        if k in opts:
            raise OptionError(f"option '{k}' is not supported: {why}")
    from kbroker.client.security import is_security_key, security_from
    known = READ_KEYS | (WRITE_KEYS if write else set())
    security = {k[6:]: v for k, v in opts.items() if k.startswith("kafka.") and is_security_key(k[6:])}
    for k in sorted(opts):
        if k.startswith("kafka.") and k not in known and k[6:] not in security:
            raise OptionError(f"option '{k}' is not supported by the kbroker source and sink (it would be "
                              f"ignored); the kafka.* options they take: {', '.join(sorted(known))}, "
                              f"kafka.security.protocol, kafka.ssl.*, kafka.sasl.*")
    security_from(security, OptionError)      # a bad protocol or missing credentials fail at planning
    cfg = ClientConfig(
        bootstrap=bootstrap,
        client_id=opts.get("kafka.client.id", "kbroker-spark"),
        request_timeout_ms=_int(opts, "kafka.request.timeout.ms", 30000, 1),
        retry_backoff_ms=_int(opts, "kafka.retry.backoff.ms", 100, 0),
        max_partition_fetch_bytes=_int(opts, "kafka.max.partition.fetch.bytes", 8 * 1024 * 1024, 1024),
        fetch_max_wait_ms=_int(opts, "kafka.fetch.max.wait.ms", 500, 0),
        isolation_level=opts.get("kafka.isolation.level", "read_uncommitted"),
        check_crcs=_bool(opts, "kafka.check.crcs", False),
        retries=_int(opts, "fetchoffset.numretries", 10, 0),
        security=security,
    )
    if cfg.isolation_level not in ("read_uncommitted", "read_committed"):
        raise OptionError("option 'kafka.isolation.level' must be read_uncommitted or read_committed")
    if write:
        codec = opts.get("kafka.compression.type", "none").lower()
        if codec not in CODECS:
            raise OptionError(f"option 'kafka.compression.type' must be one of {sorted(CODECS)}, got {codec!r}")
        acks = opts.get("kafka.acks", "all").lower()
        if acks not in ("all", "-1", "1", "0"):
            raise OptionError(f"option 'kafka.acks' must be all, -1, 0 or 1, got {acks!r}")
        idem = _bool(opts, "kafka.enable.idempotence", False)
        if idem and acks not in ("all", "-1"):
            raise OptionError("option 'kafka.enable.idempotence' requires 'kafka.acks' = all")
        cfg.producer = {
            "codec": CODECS[codec],
            "acks": -1 if acks in ("all", "-1") else int(acks),
            "batch_size": _int(opts, "kafka.batch.size", 16384, 1),
            "linger_ms": _int(opts, "kafka.linger.ms", 0, 0),
            "idempotence": idem,
            "max_in_flight": _int(opts, "kafka.max.in.flight.requests.per.connection", 5, 1),
            "delivery_timeout_ms": _int(opts, "kafka.delivery.timeout.ms", 120000, 1),
        }
    return cfg


@dataclass
class ReadConfig:
    client: ClientConfig
    strategy: str                 # assign | subscribe | subscribepattern
    target: object                # {topic: [partitions]} | [topics] | pattern string
    starting: object              # "earliest" | "latest" | {topic: {partition: offset}} | ("ts", spec)
    ending: object
    min_partitions: int | None
    include_headers: bool
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    max_records_per_batch: int
    max_bytes_per_batch: int
    timestamp_strategy: str
    streaming: bool = False       # a subscribed topic that does not exist yet is waited for


def _offsets_json(opts, name, allow_earliest=True):
    raw = opts[name.lower()]
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise OptionError(f"option '{name}' is not valid JSON ({e}): {raw!r}") from None
    if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
        raise OptionError(f"option '{name}' must be a JSON object like "
                          f'{{"topic":{{"0":23,"1":-2}}}}, got {raw!r}')
    out = {}
    for t, parts in obj.items():
        for p, off in parts.items():
            try:
                pi = int(p)
            except ValueError:
                raise OptionError(f"option '{name}': partition {p!r} of topic {t!r} is not an integer") from None
            if not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
                raise OptionError(f"option '{name}': offset of {t}-{p} must be an integer >= -2, got {off!r}")
            if off == EARLIEST and not allow_earliest:
                raise OptionError(f"option '{name}': -2 (earliest) is not allowed as an ending offset ({t}-{p})")
            out.setdefault(t, {})[pi] = off
    return out


def _timestamps_json(opts, name):
    raw = opts[name.lower()]
    try:
        obj = json.loads(raw)
        return {t: {int(p): int(ts) for p, ts in parts.items()} for t, parts in obj.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option '{name}' must be a JSON object like "
                          f'{{"topic":{{"0":1700000000000}}}}, got {raw!r}') from None


def _offset_spec(opts, prefix, streaming, allow_earliest):
    """startingOffsets/endingOffsets and their by-timestamp variants -> a spec."""
    cap = prefix.capitalize()
    by_ts_global = f"{prefix}timestamp"
    by_ts = f"{prefix}offsetsbytimestamp"
    plain = f"{prefix}offsets"
    given = [k for k in (by_ts_global, by_ts, plain) if k in opts]
    if len(given) > 1:
        names = {by_ts_global: f"{prefix}Timestamp", by_ts: f"{prefix}OffsetsByTimestamp", plain: f"{prefix}Offsets"}
        raise OptionError(f"options {', '.join(repr(names[g]) for g in given)} are exclusive: give one")
    if by_ts_global in opts:
        return ("ts", _int(opts, f"{prefix}Timestamp", None, 0))
    if by_ts in opts:
        return ("ts", _timestamps_json(opts, f"{prefix}OffsetsByTimestamp"))
    if plain not in opts:
        if prefix == "starting":
            return "latest" if streaming else "earliest"
        return "latest"
    raw = opts[plain].strip()
    if raw.lower() in ("earliest", "latest"):
        if raw.lower() == "earliest" and not allow_earliest:
            raise OptionError(f"option '{prefix}Offsets' cannot be earliest for {prefix} offsets")
        return raw.lower()
    if not raw.startswith("{"):
        raise OptionError(f"option '{prefix}Offsets' must be earliest, latest or JSON, got {raw!r}")
    return _offsets_json(opts, f"{cap[0].lower()}{cap[1:]}Offsets", allow_earliest)


def read_config(options, streaming: bool) -> ReadConfig:
    opts = normalize(options)
    client = client_config(opts)
    chosen = [s for s in STRATEGIES if s in opts]
    if len(chosen) != 1:
        raise OptionError("exactly one of the options 'assign', 'subscribe' or 'subscribePattern' must be "
                          f"given, got {len(chosen)}" + (f" ({', '.join(chosen)})" if chosen else ""))
    strategy = chosen[0]
    raw = opts[strategy]
    if strategy == "subscribe":
        target = [t.strip() for t in raw.split(",") if t.strip()]
        if not target:
            raise OptionError("option 'subscribe' needs a comma-separated list of topics")
    elif strategy == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as e:
            raise OptionError(f"option 'subscribePattern' is not a valid pattern: {e}") from None
        target = raw
    else:
        try:
            obj = json.loads(raw)
            target = {t: sorted(int(p) for p in parts) for t, parts in obj.items()}
        except (ValueError, AttributeError, TypeError):
            raise OptionError(f'option \'assign\' must be JSON like {{"topicA":[0,1]}}, got {raw!r}') from None
        if not target:
            raise OptionError("option 'assign' names no partitions")
    if not streaming:
        for k in ("maxoffsetspertrigger", "minoffsetspertrigger"):
            if k in opts:
                pass  # accepted and ignored for batch queries, as Spark's Kafka source does
    ts_strategy = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if ts_strategy not in ("error", "latest"):
        raise OptionError("option 'startingOffsetsByTimestampStrategy' must be error or latest")
    starting = _offset_spec(opts, "starting", streaming, True)
    ending = _offset_spec(opts, "ending", streaming, False)
    if streaming and any(k in opts for k in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp")):
        raise OptionError("option 'endingOffsets' is for batch queries only")
    if not streaming and starting == "latest":
        raise OptionError("option 'startingOffsets' cannot be latest for batch queries")
    min_parts = _int(opts, "minPartitions", None, 1)
    return ReadConfig(
        client=client, strategy=strategy, target=target, starting=starting, ending=ending,
        min_partitions=min_parts,
        include_headers=_bool(opts, "includeHeaders", False),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, 1),
        max_records_per_batch=_int(opts, "maxRecordsPerBatch", 65536, 1),
        max_bytes_per_batch=_int(opts, "maxBytesPerBatch", 32 * 1024 * 1024, 1024),
        timestamp_strategy=ts_strategy,
        streaming=streaming,
    )


# ---------------------------------------------------------------- offset ranges


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator: drop empty ranges; when there are fewer ranges than
    ``min_partitions``, split each in proportion to its size (round(size / total * min), at
    least 1 piece), the last piece of a range absorbing the rounding."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = float(sum(r.size for r in ranges))
    out = []
    for r in ranges:
        parts = max(int(_round_half_up(r.size / total * min_partitions)), 1)
        remaining, start = r.size, r.start
        for part in range(parts):
            this = remaining // (parts - part)
            remaining -= this
            end = min(start + this, r.end)
            if end > start:
                out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


def _round_half_up(x: float) -> int:
    # Scala's math.round rounds half up (Python's round() is banker's rounding).
    import math
    return int(math.floor(x + 0.5))


def run(coro):
    """Run a coroutine on a fresh event loop (driver-side planning calls are short)."""
    return asyncio.run(coro)
