"""Requests from this broker's transaction side to other brokers: WriteTxnMarkers from the coordinator
to partition leaders, and AddPartitionsToTxn v4 (verify only, KIP-890) from a partition leader to the
coordinator.

One pipelined kbroker.client BrokerConnection per destination broker, opened on first use and
dropped on any failure (the next request reconnects). The controller's channels stay the controller's:
this shares only the client connection class with them. What to retry, and when, is the caller's
business; this module only sends and reports.
"""
from __future__ import annotations

import asyncio
import logging

from ...client.connection import BrokerConnection, KafkaError
from ...protocol.api import ApiKey

log = logging.getLogger(__name__)


class PeerRequests:
    def __init__(self, broker):
        self.broker = broker
        self._conns: dict[int, BrokerConnection] = {}
        self._opening: dict[int, asyncio.Lock] = {}

    async def _conn(self, node_id: int) -> BrokerConnection:
        lock = self._opening.setdefault(node_id, asyncio.Lock())
        async with lock:
            conn = self._conns.get(node_id)
            if conn is not None and not conn.closed:
                return conn
            node = self.broker.metadata.brokers.get(node_id)
            if node is None:
                raise KafkaError(8, f"broker {node_id} is not live")   # BROKER_NOT_AVAILABLE
            conn = await BrokerConnection.open(node.host, node.port, node_id=node_id,
                                               client_id=f"txn-broker-{self.broker.broker_id}",
                                               request_timeout_ms=self.broker.config.get("request.timeout.ms"),
                                               security=getattr(self.broker, "inter_broker_security", None))
            self._conns[node_id] = conn
            return conn

    async def request(self, node_id: int, api_key: int, body: dict, version: int | None = None) -> dict | None:
        """One request to broker ``node_id`` (at ``version``, else the highest common one); None without
        an answer."""
        try:
            conn = await self._conn(node_id)
            _, resp = await conn.send(api_key, body, version=version)
            return resp
        except (KafkaError, OSError) as e:
            log.info("%s to broker %d failed: %s", ApiKey(api_key).name, node_id, e)
            self._drop(node_id)
            return None

    async def send_markers(self, node_id: int, markers: list[dict]) -> dict[tuple[int, str, int], int] | None:
        """Send ``markers`` (WriteTxnMarkers request entries) to broker ``node_id``; -> {(producer id,
        topic, partition): error code}, or None when the request did not get an answer."""
        resp = await self.request(node_id, ApiKey.WRITE_TXN_MARKERS, {"markers": markers})
        if resp is None:
            return None
        out = {}
        for m in resp["markers"]:
            for t in m["topics"]:
                for p in t["partitions"]:
                    out[(m["producer_id"], t["name"], p["partition_index"])] = p["error_code"]
        return out

    def _drop(self, node_id: int) -> None:
        conn = self._conns.pop(node_id, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for node_id in list(self._conns):
            self._drop(node_id)
