"""The broker's view of the cluster: brokers, topics, partition leadership and topic config overrides.

Filled by the controller's UpdateMetadata requests (brokers, leaders, ISR, replicas, topic ids,
controller id), as Kafka's ZooKeeper-mode brokers do; topic config overrides are read from ZooKeeper
when a topic first appears and on config changes. Request handlers read only this cache, so nothing
on the data path waits on ZooKeeper. Until the first UpdateMetadata it knows only this broker.
"""
from __future__ import annotations

import asyncio
import base64
import re
from dataclasses import dataclass, field

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


def topic_name_error(name) -> str | None:
    """Kafka's topic name rules; returns why a name is invalid, or None."""
    if not name:
        return "the empty string is not allowed"
    if name in (".", ".."):
        return f"'{name}' is not allowed"
    if len(name) > MAX_TOPIC_NAME:
        return f"the length of '{name[:40]}...' is longer than the max allowed length {MAX_TOPIC_NAME}"
    if not _LEGAL_TOPIC.match(name):
        return f"'{name}' contains a character other than ASCII alphanumerics, '.', '_' and '-'"
    return None


def topic_id_text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclass(slots=True)
class PartitionInfo:
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    zk_version: int = 0


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: bytes
    partitions: dict[int, PartitionInfo]
    config: dict[str, str] = field(default_factory=dict)   # overrides only, as stored in ZooKeeper


@dataclass(slots=True)
class BrokerInfo:
    broker_id: int
    host: str            # host and port of the inter-broker listener (replication, controller requests)
    port: int
    rack: str | None = None
    endpoints: dict[str, tuple[str, int]] = field(default_factory=dict)   # listener name -> (host, port)

    def address(self, listener: str | None) -> tuple[str, int] | None:
        """The endpoint of ``listener`` (None when this broker has no such listener); the inter-broker
        one when ``listener`` is None or the broker published no endpoint list."""
        if listener is None or not self.endpoints:
            return self.host, self.port
        return self.endpoints.get(listener)


class MetadataCache:
    def __init__(self):
        self.topics: dict[str, TopicInfo] = {}
        self.brokers: dict[int, BrokerInfo] = {}
        self.controller_id: int = -1
        self.controller_epoch: int = -1     # highest controller epoch seen (older requests are stale)
        self.controller_epoch_holder: int = -1   # the broker ZooKeeper named for that epoch
        self.topic_ids: dict[bytes, str] = {}
        self.inter_broker_listener = "PLAINTEXT"   # which of a broker's endpoints other brokers use
        self.updates = 0                    # UpdateMetadata requests applied
        self._waiters: list[asyncio.Future] = []

    def put_topic(self, info: TopicInfo) -> None:
        self.topics[info.name] = info
        self.topic_ids[info.topic_id] = info.name

    def remove_topic(self, name: str) -> None:
        info = self.topics.pop(name, None)
        if info is not None:
            self.topic_ids.pop(info.topic_id, None)

    def listener_brokers(self, listener: str | None) -> list[tuple[BrokerInfo, str, int]]:
        """(broker, host, port) of every live broker with an endpoint on ``listener`` (the one a request
        came in on), by id: as Kafka, a client is told only addresses of its own listener, and a broker
        without that listener is left out."""
        out = []
        for b in sorted(self.brokers.values(), key=lambda b: b.broker_id):
            addr = b.address(listener)
            if addr is not None:
                out.append((b, addr[0], addr[1]))
        return out

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        t = self.topics.get(topic)
        return None if t is None else t.partitions.get(partition)

    # ---- UpdateMetadata ------------------------------------------------------------------------
    def apply_update_metadata(self, body: dict, configs: dict[str, dict[str, str]]):
        """Apply an UpdateMetadata (v5+) body; ``configs``: overrides of topics new to the cache.

        Returns (changed topics, removed topics). Leader -2 (LeaderDuringDelete) removes the
        partition, and the topic with its last partition."""
        brokers = {}
        for b in body["live_brokers"]:
            eps = {e["listener"]: (e["host"], e["port"]) for e in b["endpoints"]}
            host, port = eps.get(self.inter_broker_listener) or next(iter(eps.values()))
            brokers[b["id"]] = BrokerInfo(b["id"], host, port, b.get("rack"), eps)
        self.brokers = brokers
        self.controller_id = body["controller_id"]
        changed: dict[str, TopicInfo] = {}
        removed: list[str] = []
        for ts in body["topic_states"]:
            name = ts["topic_name"]
            info = self.topics.get(name)
            topic_id = bytes(ts["topic_id"])
            if info is not None and topic_id != bytes(16) and info.topic_id != topic_id:
                # the topic was deleted and recreated while we missed the deletion
                self.remove_topic(name)
                removed.append(name)
                info = None
            for ps in ts["partition_states"]:
                p = ps["partition_index"]
                if ps["leader"] == LEADER_DURING_DELETE:
                    if info is not None:
                        info.partitions.pop(p, None)
                    continue
                if info is None:
                    info = TopicInfo(name, topic_id, {}, dict(configs.get(name, {})))
                    self.put_topic(info)
                info.partitions[p] = PartitionInfo(ps["leader"], ps["leader_epoch"], list(ps["replicas"]),
                                                   list(ps["isr"]), ps["zk_version"])
            if info is not None:
                if info.partitions:
                    changed[name] = info
                else:
                    self.remove_topic(name)
                    removed.append(name)
        self.updates += 1
        self._wake()
        return changed, removed

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_for(self, predicate, timeout_s: float | None) -> bool:
        """Wait (on the loop) until ``predicate()`` holds after some update; False at timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not predicate():
            fut = loop.create_future()
            self._waiters.append(fut)
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True


LEADER_DURING_DELETE = -2
