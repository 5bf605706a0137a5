"""``kbroker console-producer`` / ``kbroker console-consumer`` (kafka-console-*.sh).

The producer sends one record per stdin line (``parse.key=true`` splits off a key at
``key.separator``, a tab by default), idempotent with acks=all as Kafka's console producer is since
3.0. The consumer prints records in Kafka's DefaultMessageFormatter layout (timestamp, partition,
offset, headers, key, value, each switched on by a ``print.*`` property) and ends with
``Processed a total of N messages`` on stderr. Without ``--group`` it reads all partitions (or
``--partition``), from the end, ``--from-beginning`` or ``--offset``; with ``--group`` it joins the
group (``kbroker.client.group.GroupConsumer``), shares the partitions with the other members and
commits what it printed.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time

from kbroker.cli.tool import add_command_config, command_security
from kbroker.client import Consumer, KafkaError, Producer

# A group member's commit and LeaveGroup on exit get this long before the process exits anyway
# (Kafka's consumer close timeout is 30 s; an operator's Ctrl-C should not wait that long).
CLOSE_TIMEOUT_MS = 10000


def _properties(items: list[str]) -> dict[str, str]:
    props = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"Invalid property {item!r}: expected key=value")
        props[k.strip()] = v
    return props


def _unescape(s: str) -> str:
    # Kafka accepts escaped separators on the command line, e.g. key.separator=\t
    return s.encode("utf-8").decode("unicode_escape")


def _true(v) -> bool:
    return str(v).strip().lower() == "true"


def register(subparsers) -> None:
    p = subparsers.add_parser("console-producer", help="send stdin lines to a topic (kafka-console-producer.sh)")
    p.add_argument("--bootstrap-server", required=True)
    add_command_config(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--property", action="append", default=[], metavar="key=value",
                   help="parse.key, key.separator, ignore.error")
    p.add_argument("--producer-property", action="append", default=[], metavar="key=value",
                   help="acks, linger.ms, batch.size, compression.type, enable.idempotence, "
                        "delivery.timeout.ms, retry.backoff.ms, allow.auto.create.topics")
    p.add_argument("--compression-codec", choices=["none", "gzip", "snappy", "lz4", "zstd"], default=None)
    p.add_argument("--request-required-acks", default=None)
    p.add_argument("--sync", action="store_true", help="wait for each record to be acknowledged")
    p.set_defaults(func=producer_main)

    c = subparsers.add_parser("console-consumer", help="print records of a topic (kafka-console-consumer.sh)")
    c.add_argument("--bootstrap-server", required=True)
    add_command_config(c)
    c.add_argument("--topic", required=True)
    c.add_argument("--from-beginning", action="store_true")
    c.add_argument("--partition", type=int)
    c.add_argument("--offset", default=None, help="earliest, latest or a number (needs --partition)")
    c.add_argument("--max-messages", type=int)
    c.add_argument("--timeout-ms", type=int, help="exit when no record arrives for this long")
    c.add_argument("--isolation-level", choices=["read_uncommitted", "read_committed"], default="read_uncommitted")
    c.add_argument("--group", help="the consumer group to join: partitions are shared with its other members "
                                   "and positions are committed (default: no group, read every partition)")
    c.add_argument("--consumer-property", action="append", default=[], metavar="key=value",
                   help="with --group: session.timeout.ms, heartbeat.interval.ms, max.poll.interval.ms, "
                        "partition.assignment.strategy (range, roundrobin), auto.offset.reset, "
                        "enable.auto.commit, auto.commit.interval.ms, group.instance.id, client.id")
    c.add_argument("--property", action="append", default=[], metavar="key=value",
                   help="print.key, print.timestamp, print.partition, print.offset, print.headers, print.value, "
                        "key.separator, line.separator, headers.separator, null.literal")
    c.set_defaults(func=consumer_main)


# ---- producer -------------------------------------------------------------------------------------

def producer_main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_produce(args, sys.stdin.buffer))
    except KafkaError as e:
        print(f"ERROR {e}", file=sys.stderr)
        return 1


async def _produce(args, stdin) -> int:
    props = _properties(args.property)
    pprops = _properties(args.producer_property)
    parse_key = _true(props.get("parse.key", "false"))
    key_sep = _unescape(props.get("key.separator", "\t")).encode()
    ignore_error = _true(props.get("ignore.error", "false"))
    acks = args.request_required_acks or pprops.get("acks", "-1")
    idempotent = _true(pprops.get("enable.idempotence", "true")) and str(acks) in ("-1", "all")
    producer = Producer(
        args.bootstrap_server, client_id="console-producer", acks=acks, security=command_security(args),
        linger_ms=float(pprops.get("linger.ms", 1000)), batch_size=int(pprops.get("batch.size", 16384)),
        compression_type=args.compression_codec or pprops.get("compression.type", "none"),
        enable_idempotence=idempotent,
        delivery_timeout_ms=int(pprops.get("delivery.timeout.ms", 120000)),
        retry_backoff_ms=int(pprops.get("retry.backoff.ms", 100)),
        allow_auto_create_topics=_true(pprops.get("allow.auto.create.topics", "true")))
    failures = 0

    def report(topic):
        def cb(err, md):
            nonlocal failures
            if err is not None:
                failures += 1
                print(f"ERROR Error when sending message to topic {topic}: {err}", file=sys.stderr)
        return cb

    await producer.start()
    loop = asyncio.get_running_loop()
    try:
        lineno = 0
        while True:
            raw = await loop.run_in_executor(None, stdin.readline)
            if not raw:
                break
            lineno += 1
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            key = None
            if parse_key:
                k, sep, v = line.partition(key_sep)
                if not sep:
                    if ignore_error:
                        key, line = None, line
                    else:
                        print(f"No key separator found on line number {lineno}: '{line.decode(errors='replace')}'",
                              file=sys.stderr)
                        return 1
                else:
                    key, line = k, v
            fut = await producer.send(args.topic, line, key=key, on_delivery=report(args.topic))
            if args.sync:
                await asyncio.gather(fut, return_exceptions=True)
        await producer.flush()
    finally:
        await producer.close()
    return 1 if failures else 0


# ---- consumer -------------------------------------------------------------------------------------

class Formatter:
    """Kafka's DefaultMessageFormatter layout."""

    def __init__(self, props: dict[str, str]):
        self.print_ts = _true(props.get("print.timestamp", "false"))
        self.print_key = _true(props.get("print.key", "false"))
        self.print_value = _true(props.get("print.value", "true"))
        self.print_partition = _true(props.get("print.partition", "false"))
        self.print_offset = _true(props.get("print.offset", "false"))
        self.print_headers = _true(props.get("print.headers", "false"))
        self.key_sep = _unescape(props.get("key.separator", "\t")).encode()
        self.line_sep = _unescape(props.get("line.separator", "\n")).encode()
        self.headers_sep = _unescape(props.get("headers.separator", ",")).encode()
        self.null = props.get("null.literal", "null").encode()

    def format(self, rec) -> bytes:
        out = bytearray()
        if self.print_ts:
            kind = "LogAppendTime" if rec.timestamp_type == 1 else "CreateTime"
            out += (f"{kind}:{rec.timestamp}" if rec.timestamp >= 0 else "NO_TIMESTAMP").encode() + self.key_sep
        if self.print_partition:
            out += f"Partition:{rec.partition}".encode() + self.key_sep
        if self.print_offset:
            out += f"Offset:{rec.offset}".encode() + self.key_sep
        if self.print_headers:
            if rec.headers:
                out += self.headers_sep.join(
                    k.encode() + b":" + (self.null if v is None else v) for k, v in rec.headers)
            else:
                out += b"NO_HEADERS"
            out += self.key_sep
        if self.print_key:
            out += (self.null if rec.key is None else rec.key) + self.key_sep
        if self.print_value:
            out += self.null if rec.value is None else rec.value
        out += self.line_sep
        return bytes(out)


def consumer_main(args: argparse.Namespace) -> int:
    count = 0

    def seen():
        nonlocal count
        count += 1

    try:
        code = asyncio.run(_consume(args, sys.stdout.buffer, seen))
    except KeyboardInterrupt:
        code = 0
    except KafkaError as e:
        print(f"ERROR {e}", file=sys.stderr)
        code = 1
    print(f"Processed a total of {count} messages", file=sys.stderr)
    return code


async def _consume_group(args, out, seen, fmt) -> int:
    from kbroker.client.group import GroupConsumer
    cp = _properties(args.consumer_property)
    strategy = cp.get("partition.assignment.strategy", "range").split(",")[0].strip()
    strategy = {"org.apache.kafka.clients.consumer.RangeAssignor": "range",
                "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin"}.get(strategy, strategy)
    consumer = GroupConsumer(
        args.bootstrap_server, args.group, [args.topic], client_id=cp.get("client.id", "console-consumer"),
        security=command_security(args),
        session_timeout_ms=int(cp.get("session.timeout.ms", 45000)),
        rebalance_timeout_ms=int(cp.get("max.poll.interval.ms", 300000)),
        heartbeat_interval_ms=int(cp.get("heartbeat.interval.ms", 3000)), assignor=strategy,
        # like kafka-console-consumer.sh: --from-beginning sets auto.offset.reset=earliest
        auto_offset_reset=cp.get("auto.offset.reset", "earliest" if args.from_beginning else "latest"),
        enable_auto_commit=_true(cp.get("enable.auto.commit", "true")),
        auto_commit_interval_ms=int(cp.get("auto.commit.interval.ms", 5000)),
        group_instance_id=cp.get("group.instance.id"), isolation_level=args.isolation_level)
    printed = 0
    last_data = time.monotonic()
    try:
        while args.max_messages is None or printed < args.max_messages:
            records = await consumer.poll(500)
            for rec in records:
                out.write(fmt.format(rec))
                printed += 1
                seen()
                if args.max_messages is not None and printed >= args.max_messages:
                    consumer.mark(rec)   # commit only what was printed
                    break
            if records:
                out.flush()
                last_data = time.monotonic()
            elif args.timeout_ms is not None and (time.monotonic() - last_data) * 1000 >= args.timeout_ms:
                break
        out.flush()
    finally:
        # kafka-console-consumer.sh exits on Ctrl-C even when the coordinator is slow to answer
        await consumer.close(timeout_ms=CLOSE_TIMEOUT_MS)
    return 0


async def _consume(args, out, seen) -> int:
    if args.group is not None:
        if args.partition is not None or args.offset is not None:
            print("Options group and partition/offset cannot be used together.", file=sys.stderr)
            return 1
        return await _consume_group(args, out, seen, Formatter(_properties(args.property)))
    if args.offset is not None and args.partition is None:
        print("The partition is required when offset is specified.", file=sys.stderr)
        return 1
    fmt = Formatter(_properties(args.property))
    start = args.offset if args.offset is not None else ("earliest" if args.from_beginning else "latest")
    if isinstance(start, str) and start.lstrip("-").isdigit():
        start = int(start)
    async with Consumer(args.bootstrap_server, client_id="console-consumer",
                        isolation_level=args.isolation_level, security=command_security(args)) as consumer:
        parts = [args.partition] if args.partition is not None else await consumer.partitions(args.topic)
        positions = {}
        for p in parts:
            positions[p] = start if isinstance(start, int) and start >= 0 else \
                await consumer.list_offsets(args.topic, p, start)
        printed = 0
        last_data = time.monotonic()
        # One partition at a time with short polls so every partition gets a turn.
        wait = 500 if len(parts) == 1 else 100
        while args.max_messages is None or printed < args.max_messages:
            got = False
            for p in parts:
                r = await consumer.fetch(args.topic, p, positions[p], max_wait_ms=wait)
                for rec in r.records:
                    out.write(fmt.format(rec))
                    printed += 1
                    seen()
                    if args.max_messages is not None and printed >= args.max_messages:
                        break
                if r.records:
                    got = True
                    positions[p] = r.records[-1].offset + 1 if args.max_messages is not None and \
                        printed >= args.max_messages else max(positions[p], r.next_offset)
                    out.flush()
                else:
                    positions[p] = max(positions[p], r.next_offset)
                if args.max_messages is not None and printed >= args.max_messages:
                    break
            if got:
                last_data = time.monotonic()
            elif args.timeout_ms is not None and (time.monotonic() - last_data) * 1000 >= args.timeout_ms:
                break
        out.flush()
    return 0
