"""One request channel per live broker (Kafka's ControllerChannelManager): a queue and a task that
sends the controller's requests in order over kbroker.client's BrokerConnection, one in flight,
retrying (reconnecting with backoff) until it is answered or the channel is stopped because the
broker left /brokers/ids. The controller's own broker is reached the same way, over the network."""
from __future__ import annotations

import asyncio
import logging
from collections import deque

from ..client.connection import BrokerConnection, KafkaError
from ..protocol.errors import Errors
from ..protocol.messages import API_NAMES
from .context import LiveBroker
from .requests import VERSIONS

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 1.0


class BrokerChannel:
    def __init__(self, target: LiveBroker, controller_id: int, request_timeout_ms: int = 30000, security=None):
        self.target = target
        self.security = security      # the inter-broker listener's TLS/SASL (client.security.ClientSecurity)
        self.controller_id = controller_id
        self.request_timeout_ms = request_timeout_ms
        self._queue: deque = deque()
        self._wakeup = asyncio.Event()
        self._conn: BrokerConnection | None = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"controller-channel-{target.broker_id}")

    def send(self, api_key: int, body: dict) -> asyncio.Future:
        """Queue a request; the future resolves to the response dict, or to None when the broker
        does not implement that API (an older broker: nothing to deliver)."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((api_key, body, fut))
        self._wakeup.set()
        return fut

    def stop(self) -> None:
        self._task.cancel()
        if self._conn is not None:
            self._conn.close()
        while self._queue:
            fut = self._queue.popleft()[2]
            if not fut.done():
                fut.cancel()

    async def _run(self) -> None:
        backoff = 0.05
        t = self.target
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            api_key, body, fut = self._queue[0]
            if fut.done():          # its sender gave up on it
                self._queue.popleft()
                continue
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await BrokerConnection.open(
                        t.host, t.port, node_id=t.broker_id, client_id=f"controller-{self.controller_id}",
                        request_timeout_ms=self.request_timeout_ms, security=self.security)
                if api_key not in self._conn.broker_versions:
                    log.debug("broker %d does not serve %s; skipped", t.broker_id, API_NAMES[api_key])
                    resp = None
                else:
                    _, resp = await self._conn.send(api_key, body, version=VERSIONS[api_key])
            except (KafkaError, OSError) as e:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                log.info("controller request %s to broker %d failed (%s); retrying in %.2fs",
                         API_NAMES[api_key], t.broker_id, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if not self._queue or self._queue[0][2] is not fut:
                return              # stopped meanwhile
            if resp is not None and resp.get("error_code") == Errors.STALE_BROKER_EPOCH:
                # This channel serves one incarnation (its epoch); a broker that registered a moment
                # ago may not have recorded its epoch yet. A restarted one gets a new channel.
                log.info("broker %d does not know its epoch %d yet; retrying", t.broker_id, t.epoch)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = 0.05
            self._queue.popleft()
            if not fut.done():
                fut.set_result(resp)
            if resp is not None and resp.get("error_code"):
                log.warning("broker %d answered %s with error %d", t.broker_id, API_NAMES[api_key],
                            resp["error_code"])
