"""Cluster view of a client: bootstrap, Metadata, leaders, one connection per broker.

Metadata is refreshed on demand (a caller saw NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE or a broken connection) with ``retry.backoff.ms`` between attempts, and at most
one refresh runs at a time: concurrent callers share it. Leaders move, so nothing caches a leader
beyond the current metadata snapshot.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from kbroker.protocol.errors import Errors

from .connection import (BrokerConnection, KafkaConnectionError, KafkaError, UnsupportedVersion,
                         raise_for_error)

log = logging.getLogger(__name__)

METADATA = 3
ZERO_UUID = bytes(16)


@dataclass(slots=True)
class BrokerMeta:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class PartitionMeta:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline: list[int]
    error_code: int = 0


@dataclass(slots=True)
class TopicMeta:
    name: str
    topic_id: bytes
    is_internal: bool
    error_code: int
    partitions: dict[int, PartitionMeta] = field(default_factory=dict)


def parse_bootstrap(servers) -> list[tuple[str, int]]:
    """'h1:9092,h2:9093' or a list of such -> [(host, port)]; '[::1]:9092' is accepted."""
    if isinstance(servers, str):
        servers = servers.split(",")
    out = []
    for s in servers:
        s = s.strip()
        if not s:
            continue
        if "://" in s:
            s = s.split("://", 1)[1]
        host, _, port = s.rpartition(":")
        if not host:
            host, port = port, "9092"
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no bootstrap servers given")
    return out


class Cluster:
    def __init__(self, bootstrap_servers, *, client_id: str = "kbroker", request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, metadata_max_age_ms: int = 300000,
                 allow_auto_topic_creation: bool = False, client_versions=None, security=None):
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security      # client.security.ClientSecurity (TLS, SASL); None: PLAINTEXT
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff = retry_backoff_ms / 1000
        self.metadata_max_age = metadata_max_age_ms / 1000
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.client_versions = client_versions
        self.brokers: dict[int, BrokerMeta] = {}
        self.topics: dict[str, TopicMeta] = {}
        self.cluster_id: str | None = None
        self.controller_id: int = -1
        self.last_refresh = 0.0
        self._wanted: set[str] = set()      # topics the client uses: kept in every refresh
        self._conns: dict[object, BrokerConnection] = {}
        self._connect_locks: dict[object, asyncio.Lock] = {}
        self._attempts: dict[object, tuple[int, BaseException | None]] = {}   # key -> (count, last failure)
        self._refresh: asyncio.Task | None = None
        self._closed = False

    # ---- connections ---------------------------------------------------------------------------

    async def connection(self, node_id: int) -> BrokerConnection:
        """The (negotiated) connection to broker ``node_id``, opened on first use or after a failure."""
        b = self.brokers.get(node_id)
        if b is None:
            await self.refresh_metadata()
            b = self.brokers.get(node_id)
            if b is None:
                raise KafkaError(Errors.BROKER_NOT_AVAILABLE, f"broker {node_id} not in metadata")
        return await self._connect(node_id, b.host, b.port)

    async def _connect(self, key, host, port) -> BrokerConnection:
        """The connection for ``key``, in call order: callers queue on a FIFO lock, so a caller that
        writes as soon as it has the connection (the producer's sender does) writes after every earlier
        caller, even those that waited for the connection to open. (Before, a caller arriving just after
        the open took a fast path ahead of the waiters still being woken, and an idempotent sequence
        could reach the broker out of order.) Callers queued behind a failed attempt share its error
        instead of each waiting out a connect timeout of its own."""
        if self._closed:
            raise KafkaConnectionError("client closed")
        lock = self._connect_locks.get(key)
        if lock is None:
            lock = self._connect_locks[key] = asyncio.Lock()
        seen = self._attempts.get(key, (0, None))[0]
        async with lock:   # uncontended: no suspension, so the open connection costs no loop turn
            conn = self._conns.get(key)
            if conn is not None and not conn.closed and (conn.host, conn.port) == (host, port):
                return conn
            count, failure = self._attempts.get(key, (0, None))
            if count > seen and failure is not None:
                raise failure   # an attempt made while we queued failed: do not repeat it at once
            if self._closed:
                raise KafkaConnectionError("client closed")
            try:
                conn = await BrokerConnection.open(
                    host, port, node_id=key if isinstance(key, int) else -1, client_id=self.client_id,
                    request_timeout_ms=self.request_timeout_ms, client_versions=self.client_versions,
                    security=self.security)
            except KafkaError as e:
                self._attempts[key] = (count + 1, e)
                raise   # (a cancelled opener records nothing: the next caller in line tries again)
            self._attempts[key] = (count + 1, None)
            self._conns[key] = conn
            return conn

    async def any_connection(self) -> BrokerConnection:
        """A connection to some live broker: known brokers first, then the bootstrap list."""
        for conn in self._conns.values():
            if not conn.closed:
                return conn
        errors = []
        candidates = [(nid, b.host, b.port) for nid, b in self.brokers.items()]
        candidates += [(("bootstrap", h, p), h, p) for h, p in self.bootstrap]
        for key, host, port in candidates:
            try:
                return await self._connect(key, host, port)
            except KafkaConnectionError as e:
                errors.append(str(e))
        raise KafkaConnectionError("no broker reachable: " + "; ".join(errors))

    async def bootstrap_connections(self) -> list[BrokerConnection]:
        """A connection to each bootstrap server that answers (the brokers the user named)."""
        out = []
        for host, port in self.bootstrap:
            try:
                out.append(await self._connect(("bootstrap", host, port), host, port))
            except KafkaConnectionError:
                continue
        return out

    async def controller_connection(self) -> BrokerConnection:
        if self.controller_id < 0 or self.controller_id not in self.brokers:
            await self.refresh_metadata()
        if self.controller_id >= 0 and self.controller_id in self.brokers:
            return await self.connection(self.controller_id)
        return await self.any_connection()

    async def send_any(self, api_key: int, body: dict):
        """Send to any broker, retrying once elsewhere if the connection breaks."""
        try:
            conn = await self.any_connection()
            return await conn.send(api_key, body)
        except KafkaConnectionError:
            await asyncio.sleep(self.retry_backoff)
            conn = await self.any_connection()
            return await conn.send(api_key, body)

    # ---- metadata ------------------------------------------------------------------------------

    async def fetch_metadata(self, topics: list[str] | None, allow_auto_topic_creation=None) -> dict:
        """One Metadata round trip. ``topics`` None = all topics, [] = brokers only (v1+ rules)."""
        conn = await self.any_connection()
        version = conn.version_for(METADATA)
        body = {
            "topics": None if topics is None else [{"name": t, "topic_id": ZERO_UUID} for t in topics],
            "allow_auto_topic_creation": (self.allow_auto_topic_creation
                                          if allow_auto_topic_creation is None else allow_auto_topic_creation),
        }
        try:
            _, resp = await conn.send(METADATA, body, version)
        except KafkaConnectionError:
            self._drop(conn)
            raise
        self._apply(resp, full=topics is None)
        return resp

    def _apply(self, resp: dict, full: bool) -> None:
        brokers = {b["node_id"]: BrokerMeta(b["node_id"], b["host"], b["port"], b.get("rack"))
                   for b in resp["brokers"]}
        if brokers:
            self.brokers = brokers
        self.cluster_id = resp.get("cluster_id")
        self.controller_id = resp.get("controller_id", -1)
        topics = {} if full else dict(self.topics)
        for t in resp["topics"]:
            name = t["name"]
            if name is None:
                continue
            tm = TopicMeta(name, t.get("topic_id", ZERO_UUID), t.get("is_internal", False), t["error_code"])
            for p in t["partitions"]:
                tm.partitions[p["partition_index"]] = PartitionMeta(
                    p["partition_index"], p["leader_id"], p.get("leader_epoch", -1), list(p["replica_nodes"]),
                    list(p["isr_nodes"]), list(p.get("offline_replicas", [])), p["error_code"])
            if t["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                topics.pop(name, None)
            else:
                topics[name] = tm
        self.topics = topics
        self.last_refresh = time.monotonic()

    async def refresh_metadata(self, topics: list[str] | None = None) -> None:
        """Refresh the topics this client uses (plus ``topics``); concurrent callers share one
        round trip. Connection failures are retried against other brokers with backoff."""
        if topics:
            self._wanted.update(topics)
        task = self._refresh
        if task is None or task.done():
            task = self._refresh = asyncio.get_running_loop().create_task(self._do_refresh())
        await asyncio.shield(task)

    async def _do_refresh(self):
        last = None
        for attempt in range(5):
            try:
                await self.fetch_metadata(sorted(self._wanted))
                return
            except KafkaConnectionError as e:
                last = e
                await asyncio.sleep(self.retry_backoff * (2 ** attempt))
        raise last

    def _drop(self, conn: BrokerConnection) -> None:
        for k, c in list(self._conns.items()):
            if c is conn:
                del self._conns[k]
        conn.close()

    def invalidate(self, node_id: int | None = None) -> None:
        """A request to ``node_id`` failed at the connection level: forget that connection."""
        if node_id is not None:
            conn = self._conns.pop(node_id, None)
            if conn is not None:
                conn.close()

    # ---- lookups -------------------------------------------------------------------------------

    def partitions_for(self, topic: str) -> list[int] | None:
        tm = self.topics.get(topic)
        return None if tm is None else sorted(tm.partitions)

    def available_partitions(self, topic: str) -> list[int]:
        tm = self.topics.get(topic)
        if tm is None:
            return []
        return sorted(p for p, pm in tm.partitions.items() if pm.leader >= 0)

    def leader_for(self, topic: str, partition: int) -> int:
        tm = self.topics.get(topic)
        if tm is None:
            return -1
        pm = tm.partitions.get(partition)
        return -1 if pm is None else pm.leader

    async def wait_for_topic(self, topic: str, timeout: float = 30.0) -> TopicMeta:
        """Metadata of ``topic``, refreshing with backoff while it is unknown or leaderless."""
        deadline = time.monotonic() + timeout
        backoff = self.retry_backoff
        first = True
        while True:
            tm = self.topics.get(topic)
            if tm is not None and tm.error_code == 0 and tm.partitions and \
                    all(pm.leader >= 0 for pm in tm.partitions.values()):
                return tm
            if time.monotonic() >= deadline:
                code = tm.error_code if tm is not None and tm.error_code else Errors.UNKNOWN_TOPIC_OR_PARTITION
                raise KafkaError(code, f"topic {topic!r} not available after {timeout:.1f}s")
            # Back off between metadata requests also while the topic is unknown (it may be
            # being auto-created): retry.backoff.ms doubling up to 1 s, as Kafka's clients do.
            if not first:
                await asyncio.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
                backoff = min(backoff * 2, 1.0)
            first = False
            await self.refresh_metadata([topic])

    async def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        leader = self.leader_for(topic, partition)
        if leader < 0:
            await self.wait_for_topic(topic)
            leader = self.leader_for(topic, partition)
            if leader < 0:
                raise KafkaError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
        return await self.connection(leader)

    async def close(self) -> None:
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for c in conns:
            await c.wait_closed()


__all__ = ["Cluster", "BrokerMeta", "PartitionMeta", "TopicMeta", "parse_bootstrap",
           "KafkaError", "UnsupportedVersion", "raise_for_error"]


class ClusterClient:
    """Base of Admin and Consumer: works through a given ``Cluster`` (shared, not closed here) or owns one
    built from ``bootstrap_servers``; ``start()``/``close()`` and ``async with`` for both."""

    def __init__(self, bootstrap_servers, cluster: "Cluster | None", client_id: str, request_timeout_ms: int,
                 retry_backoff_ms: int, security=None):
        self._own_cluster = cluster is None
        self.cluster = cluster or Cluster(bootstrap_servers, client_id=client_id, request_timeout_ms=request_timeout_ms,
                                          retry_backoff_ms=retry_backoff_ms, security=security)

    async def start(self):
        await self.cluster.any_connection()
        return self

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        if self._own_cluster:
            await self.cluster.close()
