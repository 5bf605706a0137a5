"""BrokerConnection's receive path against a peer that chunks its answers arbitrarily: frames
coalesced, split byte by byte, length prefixes cut at the staging buffer's end, frames larger
than the staging buffer. Each answer is an ApiVersions v0 body whose entries encode the request's
number, so a frame matched to the wrong request or corrupted shows."""
import asyncio
import random
import struct

import pytest

from kbroker.client.connection import BrokerConnection, KafkaConnectionError, RequestTimedOut


def _answer(cid: int, n_entries: int, tag: int) -> bytes:
    body = struct.pack(">ih", cid, 0) + struct.pack(">i", n_entries) + b"".join(
        struct.pack(">hhh", tag & 0x7FFF, i & 0x7FFF, (tag + i) & 0x7FFF) for i in range(n_entries))
    return struct.pack(">i", len(body)) + body


async def _next_cid(reader) -> int:
    """The correlation id of the next request frame the peer reads."""
    head = await reader.readexactly(4)
    req = await reader.readexactly(struct.unpack(">i", head)[0])
    return struct.unpack_from(">i", req, 4)[0]


async def _serve(sizes, chunking, seed):
    rnd = random.Random(seed)

    async def handle(reader, writer):
        out = bytearray()
        for i, n in enumerate(sizes):
            cid = await _next_cid(reader)
            out += _answer(cid, n, i)
        # every answer at once, cut as ``chunking`` says
        pos = 0
        while pos < len(out):
            k = chunking(rnd, pos, len(out))
            writer.write(bytes(out[pos:pos + k]))
            await writer.drain()
            pos += k
            if rnd.random() < 0.3:
                await asyncio.sleep(0)
        await reader.read()   # until the client closes
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("name,chunking", [
    ("whole", lambda r, pos, n: n),
    ("bytes", lambda r, pos, n: 1),
    ("random", lambda r, pos, n: r.randint(1, 70000)),
    ("stage-edge", lambda r, pos, n: 65534 if pos == 0 else r.choice([1, 2, 3, 65536, 65537, 200000])),
])
def test_frames_any_chunking(name, chunking):
    rnd = random.Random(7)
    sizes = [rnd.choice([0, 1, 5, 100, 3000, 10922, 10923, 200000]) for _ in range(60)]
    if name == "bytes":
        sizes = [s for s in sizes if s < 3000][:20]

    async def go():
        server = await _serve(sizes, chunking, 1)
        port = server.sockets[0].getsockname()[1]
        conn = await BrokerConnection.open("127.0.0.1", port, negotiate=False)
        try:
            futs = [asyncio.ensure_future(conn.send(18, {}, version=0)) for _ in sizes]
            results = await asyncio.gather(*futs)
        finally:
            await conn.wait_closed()
            server.close()
            await server.wait_closed()
        for i, ((_, resp), n) in enumerate(zip(results, sizes)):
            keys = resp["api_keys"]
            assert len(keys) == n, (i, len(keys), n)
            for j, k in enumerate(keys):
                assert (k["api_key"], k["min_version"], k["max_version"]) == (i, j & 0x7FFF, (i + j) & 0x7FFF)
        assert conn.closed

    asyncio.run(go())


def test_wrong_correlation_id_fails_connection():
    async def go():
        async def handle(reader, writer):
            cid = await _next_cid(reader)
            writer.write(_answer(cid + 1, 0, 0))
            await writer.drain()
            await reader.read()
            writer.close()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = await BrokerConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], negotiate=False)
        with pytest.raises(KafkaConnectionError, match="correlation id"):
            await conn.send(18, {}, version=0)
        assert conn.closed
        await conn.wait_closed()
        server.close()
        await server.wait_closed()
    asyncio.run(go())


def test_peer_close_mid_frame_fails_pending():
    async def go():
        async def handle(reader, writer):
            cid = await _next_cid(reader)
            writer.write(_answer(cid, 100000, 0)[:300000])
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = await BrokerConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], negotiate=False)
        with pytest.raises(KafkaConnectionError, match="closed by the broker"):
            await conn.send(18, {}, version=0)
        await conn.wait_closed()
        server.close()
        await server.wait_closed()
    asyncio.run(go())


def test_an_unanswered_request_times_out_and_fails_the_connection():
    # A peer that answers the first request and then reads without answering: the second request's
    # deadline fails it and the connection, and the request still in flight behind it fails with it.
    async def go():
        async def handle(reader, writer):
            writer.write(_answer(await _next_cid(reader), 1, 0))
            await writer.drain()
            await reader.read()
            writer.close()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = await BrokerConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], negotiate=False)
        _v, first = await conn.send(18, {}, version=0)
        assert len(first["api_keys"]) == 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        slow = asyncio.ensure_future(conn.send(18, {}, version=0, timeout=0.3))
        behind = asyncio.ensure_future(conn.send(18, {}, version=0, timeout=30))
        with pytest.raises(RequestTimedOut, match="timed out"):
            await slow
        assert 0.25 <= loop.time() - t0 < 5
        with pytest.raises(RequestTimedOut):
            await behind
        assert conn.closed
        await conn.wait_closed()
        server.close()
        await server.wait_closed()
    asyncio.run(go())


def test_a_cancelled_request_leaves_the_answers_after_it_in_step():
    # The caller gives up on a request (its task cancelled): its answer, when it comes, is consumed
    # in its place and the next request gets its own answer.
    async def go():
        async def handle(reader, writer):
            cids = []
            for _ in range(2):
                cids.append(await _next_cid(reader))
            for i, cid in enumerate(cids):
                writer.write(_answer(cid, i + 1, i))
            await writer.drain()
            await reader.read()
            writer.close()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        conn = await BrokerConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], negotiate=False)
        first = asyncio.ensure_future(conn.send(18, {}, version=0))
        await asyncio.sleep(0)
        first.cancel()
        _v, second = await conn.send(18, {}, version=0)
        assert len(second["api_keys"]) == 2
        assert first.cancelled() and not conn.closed
        await conn.wait_closed()
        server.close()
        await server.wait_closed()
    asyncio.run(go())
