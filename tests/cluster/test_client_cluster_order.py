"""The client's connection cache hands out a broker's connection in call order.

Invariant: callers that write as soon as ``Cluster.connection()`` returns (the producer's sender does)
write in the order they asked, including callers that arrive while the connection is still opening and
callers that arrive just after it opened, while the earlier ones are still being woken. Violations
counted: callers that got the connection ahead of an earlier caller (0 of N expected).

And: callers queued behind a failed connection attempt share its error; they do not each repeat it.
"""
import asyncio
import socket
import threading

from kbroker.client.cluster import Cluster
from kbroker.client.connection import KafkaConnectionError


async def _order_of_arrival(bootstrap: str, callers: int) -> tuple[list[int], int]:
    """Start ``callers`` tasks one loop turn apart, each asking for broker 0's connection; -> the order
    in which they got it, and how many distinct connections they got."""
    cluster = Cluster(bootstrap)
    try:
        await cluster.refresh_metadata()   # learns the broker; its own connection is not opened yet
        node = min(cluster.brokers)
        got: list[int] = []
        conns = set()

        async def caller(i):
            conn = await cluster.connection(node)
            got.append(i)      # the producer writes here, before its next suspension
            conns.add(id(conn))

        tasks = []
        for i in range(callers):
            tasks.append(asyncio.create_task(caller(i)))
            await asyncio.sleep(0)     # one loop turn: some callers arrive during the open, some after
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return got, len(conns)
    finally:
        await cluster.close()


def test_callers_get_the_connection_in_call_order(bootstrap):
    got, distinct = asyncio.run(_order_of_arrival(bootstrap, 60))
    overtaken = sum(1 for a, b in zip(got, got[1:]) if b < a)
    assert len(got) == 60 and distinct == 1
    assert overtaken == 0, f"{overtaken} of 60 callers got the connection ahead of an earlier one: {got}"


class _HangUpServer:
    """Accepts connections and closes them at once (so the ApiVersions handshake fails); counts them."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            c.close()

    def close(self):
        self.sock.close()


def test_callers_behind_a_failed_attempt_share_its_error():
    server = _HangUpServer()

    async def main():
        cluster = Cluster(f"127.0.0.1:{server.port}")
        try:
            results = await asyncio.gather(*(cluster.any_connection() for _ in range(8)),
                                           return_exceptions=True)
        finally:
            await cluster.close()
        return results

    try:
        results = asyncio.run(main())
    finally:
        server.close()
    assert all(isinstance(r, KafkaConnectionError) for r in results), results
    # the eight callers queued during one attempt: one connection, not eight
    assert server.accepted == 1, f"{server.accepted} connection attempts for 8 queued callers"
