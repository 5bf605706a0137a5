"""Produce-then-consume round trips of the four real clients against a secured listener, shared by
the TLS and SASL tests: each gets its client's own settings (confluent/librdkafka config, kafka-python
or aiokafka keyword arguments, kcat -X options), sends ``want`` to partition 0 of ``topic`` with
acks=all and returns what it reads back from the start."""
from __future__ import annotations

import asyncio
import subprocess
import time

TIMEOUT_S = 30


def confluent_round_trip(conf: dict, topic: str, want: list[bytes]) -> list[bytes]:
    from confluent_kafka import Consumer, Producer
    p = Producer(conf | {"acks": "all"})
    for v in want:
        p.produce(topic, v, partition=0)
    assert p.flush(TIMEOUT_S) == 0
    cons = Consumer(conf | {"group.id": topic, "auto.offset.reset": "earliest"})
    cons.subscribe([topic])
    got, end = [], time.monotonic() + TIMEOUT_S
    while len(got) < len(want) and time.monotonic() < end:
        m = cons.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    cons.close()
    return got


def kafka_python_round_trip(kw: dict, topic: str, want: list[bytes]) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    p = KafkaProducer(acks="all", **kw)
    for v in want:
        p.send(topic, v, partition=0)
    p.flush(TIMEOUT_S)
    p.close()
    cons = KafkaConsumer(consumer_timeout_ms=5000, auto_offset_reset="earliest", **kw)
    cons.assign([TopicPartition(topic, 0)])
    got = [m.value for m in cons]
    cons.close()
    return got


def aiokafka_round_trip(kw: dict, topic: str, want: list[bytes]) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def go():
        p = AIOKafkaProducer(acks="all", **kw)
        await p.start()
        try:
            for v in want:
                await p.send(topic, v, partition=0)
            await p.flush()
        finally:
            await p.stop()
        cons = AIOKafkaConsumer(auto_offset_reset="earliest", **kw)
        await cons.start()
        got = []
        try:
            cons.assign([TopicPartition(topic, 0)])
            end = time.monotonic() + TIMEOUT_S
            while len(got) < len(want) and time.monotonic() < end:
                for msgs in (await cons.getmany(timeout_ms=500)).values():
                    got.extend(m.value for m in msgs)
        finally:
            await cons.stop()
        return got
    return asyncio.run(go())


def kcat_round_trip(bootstrap: str, x: list[str], topic: str, want: list[bytes]) -> list[bytes]:
    subprocess.run(["kcat", "-b", bootstrap, *x, "-P", "-t", topic, "-p", "0", "-X", "acks=all"],
                   input=b"\n".join(want) + b"\n", check=True, timeout=TIMEOUT_S)
    out = subprocess.run(["kcat", "-b", bootstrap, *x, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q"],
                         capture_output=True, check=True, timeout=TIMEOUT_S).stdout
    return out.splitlines()
