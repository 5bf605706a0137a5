"""The broker's view of the cluster: brokers, topics, partition leadership and topic config overrides.

ZooKeeper is the source of truth (Kafka's znode layout); this cache is what request handlers read, so
nothing on the data path waits on ZooKeeper. It is refreshed from ZooKeeper on a worker thread and
swapped in on the loop thread.
"""
from __future__ import annotations

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


def topic_id_bytes(topic_id: str | None) -> bytes:
    """ZooKeeper keeps topic ids as 22-char base64url; the wire carries 16 raw bytes."""
    if not topic_id:
        return bytes(16)
    return base64.urlsafe_b64decode(topic_id + "==")


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
    host: str
    port: int
    rack: str | None = None


class MetadataCache:
    def __init__(self):
        self.topics: dict[str, TopicInfo] = {}
        self.brokers: dict[int, BrokerInfo] = {}
        self.controller_id: int = -1
        self.topic_ids: dict[bytes, str] = {}

    def replace_topics(self, topics: dict[str, TopicInfo]) -> None:
        self.topics = topics
        self.topic_ids = {t.topic_id: t.name for t in topics.values()}

    def put_topic(self, info: TopicInfo) -> None:
        self.topics[info.name] = info
        self.topic_ids[info.topic_id] = info.name

    def remove_topic(self, name: str) -> None:
        info = self.topics.pop(name, None)
        if info is not None:
            self.topic_ids.pop(info.topic_id, None)

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        t = self.topics.get(topic)
        return None if t is None else t.partitions.get(partition)
