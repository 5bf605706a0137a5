"""A leader that has just lost a partition answers Produce with NOT_LEADER_OR_FOLLOWER. Invariant: an
idempotent producer (kbroker's client, and librdkafka) refreshes its metadata, retries the batch with the
same sequence numbers, and every record ends up in the log exactly once, even though the broker had in
fact appended the batch whose answer was turned into an error.

A relay in front of a real kbroker broker (which advertises the relay's port, so every client connection
goes through it) rewrites the first Produce response into that error."""
import asyncio
import struct
import threading
import uuid

import confluent_kafka as ck
import pytest

from kbroker.client import Admin, NewTopic, Producer
from kbroker.protocol import api
from kbroker.protocol.errors import Errors
from kbroker.testing import LocalCluster, free_port

PRODUCE, METADATA = 0, 3


class LeaderErrorRelay:
    """Forwards frames both ways; the first Produce response gets NOT_LEADER_OR_FOLLOWER on every
    partition. Records what the client asked afterwards."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.injected = False
        self.after_injection: list[int] = []      # api keys the client sent after the injected answer
        self.loop = None
        self._server = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, port: int):
        self.port = port
        self._thread.start()
        assert self._ready.wait(10), "relay did not start"

    def _run(self):
        self.loop = asyncio.new_event_loop()
        self._server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port))
        self._ready.set()
        self.loop.run_forever()

    def stop(self):
        async def close():
            self._server.close()
            await self._server.wait_closed()
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _client(self, creader, cwriter):
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        versions: dict[int, tuple[int, int]] = {}   # correlation id -> (api key, version)

        async def up():
            while True:
                head = await creader.readexactly(4)
                frame = await creader.readexactly(struct.unpack(">i", head)[0])
                key, version, corr = struct.unpack_from(">hhi", frame, 0)
                versions[corr] = (key, version)
                if self.injected:
                    self.after_injection.append(key)
                uwriter.write(head + frame)
                await uwriter.drain()

        async def down():
            while True:
                head = await ureader.readexactly(4)
                frame = await ureader.readexactly(struct.unpack(">i", head)[0])
                corr = struct.unpack_from(">i", frame, 0)[0]
                key, version = versions.pop(corr, (None, None))
                if key == PRODUCE and not self.injected:
                    _, body = api.decode_response(PRODUCE, version, memoryview(frame))
                    for t in body["responses"]:
                        for p in t["partition_responses"]:
                            p["error_code"], p["base_offset"] = int(Errors.NOT_LEADER_OR_FOLLOWER), -1
                    self.injected = True
                    out = b"".join(api.encode_response(PRODUCE, version, corr, body))
                    cwriter.write(out)
                else:
                    cwriter.write(head + frame)
                await cwriter.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            cwriter.close()
            uwriter.close()


@pytest.fixture
def relayed(tmp_path):
    relay_port = free_port()
    c = LocalCluster(tmp_path, overrides={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{relay_port}"})
    # The relay runs before the broker starts: the controller reaches its broker at the advertised
    # (relay) address too, so the broker is not ready until the relay forwards.
    relay = LeaderErrorRelay(c.brokers[0].port)
    relay.start(relay_port)
    try:
        with c:
            yield c, relay, f"127.0.0.1:{relay_port}"
    finally:
        relay.stop()


def _read_all(bootstrap, topic, n):
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + topic, "enable.auto.commit": False})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got = []
    try:
        for _ in range(60):
            got += [m.value() for m in c.consume(100, timeout=0.5) if not m.error()]
            if len(got) >= n:
                break
        # anything beyond n would be a duplicate: give it a moment to show up
        got += [m.value() for m in c.consume(100, timeout=1.0) if not m.error()]
    finally:
        c.close()
    return got


def _assert_retried_once(relay, got, expected):
    assert relay.injected
    assert METADATA in relay.after_injection, relay.after_injection   # it looked for the new leader
    assert relay.after_injection.count(PRODUCE) >= 1                    # and sent the batch again
    assert got == expected, (len(got), len(expected))                   # exactly once, in order


def test_kbroker_client_retries_after_not_leader(relayed):
    cluster, relay, bootstrap = relayed
    topic = f"moved-{uuid.uuid4().hex[:8]}"
    expected = [b"r%d" % i for i in range(30)]

    async def go():
        async with Admin(bootstrap) as admin:
            await admin.create_topics([NewTopic(topic, 1, 1)])
        async with Producer(bootstrap, enable_idempotence=True, linger_ms=0, retry_backoff_ms=50) as p:
            first = await p.send_and_wait(topic, expected[0], partition=0)
            futs = [await p.send(topic, v, partition=0) for v in expected[1:]]
            rest = await asyncio.gather(*futs)
        return first, rest

    first, rest = asyncio.run(asyncio.wait_for(go(), 60))
    assert first.offset == 0 and [m.offset for m in rest] == list(range(1, 30))
    _assert_retried_once(relay, _read_all(bootstrap, topic, 30), expected)


def test_librdkafka_retries_after_not_leader(relayed):
    cluster, relay, bootstrap = relayed
    topic = f"moved-{uuid.uuid4().hex[:8]}"
    expected = [b"c%d" % i for i in range(30)]
    errors = []
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0,
                     "retry.backoff.ms": 50})
    for v in expected:
        p.produce(topic, v, partition=0, on_delivery=lambda err, msg: err and errors.append(err))
    assert p.flush(60) == 0
    assert errors == []
    _assert_retried_once(relay, _read_all(bootstrap, topic, 30), expected)


def test_without_idempotence_the_retry_duplicates(relayed):
    """Control: the injected error really followed an append, so a producer without idempotence
    writes the retried batch twice, and the exactly-once check above would have caught it."""
    cluster, relay, bootstrap = relayed
    topic = f"moved-{uuid.uuid4().hex[:8]}"
    expected = [b"d%d" % i for i in range(30)]
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "acks": 1, "linger.ms": 0,
                     "retry.backoff.ms": 50, "max.in.flight": 1})
    for v in expected:
        p.produce(topic, v, partition=0)
    assert p.flush(60) == 0
    got = _read_all(bootstrap, topic, 31)
    assert relay.injected
    assert got != expected and len(got) > len(expected) and set(got) == set(expected)
