"""``kbroker producer-perf-test`` / ``kbroker consumer-perf-test`` (kafka-*-perf-test.sh, Kafka 3.9
flags and output lines; see :mod:`kbroker.perf.producer_perf` and :mod:`kbroker.perf.consumer_perf`)."""
from __future__ import annotations

import argparse
import asyncio
import sys
import uuid

from kbroker.client import KafkaError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "producer-perf-test", help="producer throughput and latency (kafka-producer-perf-test.sh)",
        description="Produce --num-records records and print Kafka's ProducerPerformance lines. "
                    "Producer defaults are the Java 3.9 producer's (acks=all, enable.idempotence=true, "
                    "linger.ms=0, batch.size=16384); --producer-props overrides them by Kafka name.")
    p.add_argument("--topic", required=True, metavar="TOPIC")
    p.add_argument("--num-records", required=True, type=int, metavar="NUM-RECORDS", dest="num_records")
    payload = p.add_mutually_exclusive_group(required=True)
    payload.add_argument("--record-size", type=int, metavar="RECORD-SIZE", dest="record_size")
    payload.add_argument("--payload-file", metavar="PAYLOAD-FILE", dest="payload_file")
    payload.add_argument("--payload-monotonic", action="store_true", dest="payload_monotonic")
    p.add_argument("--payload-delimiter", default="\\n", metavar="PAYLOAD-DELIMITER", dest="payload_delimiter",
                   help="separator of payloads in --payload-file (default: new line)")
    p.add_argument("--throughput", required=True, type=float, metavar="THROUGHPUT",
                   help="records/sec to aim for; -1 = unthrottled")
    p.add_argument("--producer-props", nargs="+", metavar="PROP-NAME=PROP-VALUE", dest="producer_props")
    p.add_argument("--producer.config", metavar="CONFIG-FILE", dest="producer_config")
    p.add_argument("--print-metrics", action="store_true", dest="print_metrics")
    p.add_argument("--transactional-id", metavar="TRANSACTIONAL-ID", dest="transactional_id",
                   help="the transactional id (over transactional.id in the producer properties); with "
                        "--transaction-duration-ms alone: performance-producer- and a random uuid")
    p.add_argument("--transaction-duration-ms", type=int, metavar="TRANSACTION-DURATION",
                   dest="transaction_duration_ms",
                   help="commit a transaction after this many ms (default 3000 when a transactional id is set)")
    p.set_defaults(func=producer_main)

    c = subparsers.add_parser(
        "consumer-perf-test", help="consumer throughput (kafka-consumer-perf-test.sh)",
        description="Read --messages records and print Kafka's ConsumerPerformance lines. No consumer "
                    "group yet: every partition of the topic is assigned directly.")
    c.add_argument("--bootstrap-server", dest="bootstrap_server")
    c.add_argument("--broker-list", dest="broker_list", help="deprecated spelling of --bootstrap-server")
    c.add_argument("--topic", required=True)
    c.add_argument("--messages", required=True, type=int)
    c.add_argument("--group", help="accepted; no consumer group is joined (see stderr)")
    c.add_argument("--fetch-size", type=int, default=1024 * 1024, dest="fetch_size")
    c.add_argument("--from-latest", action="store_true", dest="from_latest")
    c.add_argument("--show-detailed-stats", action="store_true", dest="show_detailed_stats")
    c.add_argument("--reporting-interval", type=int, default=5000, dest="reporting_interval", metavar="INTERVAL_MS")
    c.add_argument("--timeout", type=int, default=10000, metavar="MS",
                   help="maximum time between returned records (default 10000)")
    c.add_argument("--consumer.config", dest="consumer_config")
    c.add_argument("--print-metrics", action="store_true", dest="print_metrics")
    c.add_argument("--date-format", default="yyyy-MM-dd HH:mm:ss:SSS", dest="date_format")
    c.add_argument("--hide-header", action="store_true", dest="hide_header")
    c.set_defaults(func=consumer_main)


def producer_main(args: argparse.Namespace) -> int:
    from kbroker.perf import producer_perf as pp

    try:
        if args.num_records <= 0:
            raise pp.PerfError("--num-records should be greater than zero")
        if args.record_size is not None and args.record_size <= 0:
            raise pp.PerfError("--record-size should be greater than zero")
        props = pp.read_props(args.producer_props, args.producer_config)
        duration = args.transaction_duration_ms
        if duration is not None and duration <= 0:
            raise pp.PerfError("--transaction-duration-ms should be greater than zero")
        # Kafka's rules: --transactional-id wins over the properties; a duration alone makes up an id;
        # an id alone commits every 3000 ms.
        if args.transactional_id is not None:
            props["transactional.id"] = args.transactional_id
        elif duration is not None and not props.get("transactional.id"):
            props["transactional.id"] = f"performance-producer-{uuid.uuid4()}"
        if props.get("transactional.id") and duration is None:
            duration = 3000
        settings = pp.settings_from(props)
        payloads = None
        if args.payload_file is not None:
            delim = "\n" if args.payload_delimiter == "\\n" else args.payload_delimiter
            payloads = pp.read_payload_file(args.payload_file, delim, sys.stdout)
        cfg = pp.RunConfig(topic=args.topic, num_records=args.num_records, throughput=args.throughput,
                           settings=settings, record_size=args.record_size, payloads=payloads,
                           monotonic=args.payload_monotonic, print_metrics=args.print_metrics,
                           transaction_duration_ms=duration or 0)
        asyncio.run(pp.run(cfg))
        return 0
    except pp.PerfError as e:
        print(f"producer-perf-test: {e}", file=sys.stderr)
        return 1
    except KafkaError as e:
        print(f"producer-perf-test: {e}", file=sys.stderr)
        return 1


def consumer_main(args: argparse.Namespace) -> int:
    from kbroker.perf import consumer_perf as cp

    try:
        asyncio.run(cp.run(cp.options_from(args)))
        return 0
    except cp.PerfError as e:
        print(f"consumer-perf-test: {e}", file=sys.stderr)
        return 1
    except KafkaError as e:
        print(f"consumer-perf-test: {e}", file=sys.stderr)
        return 1
