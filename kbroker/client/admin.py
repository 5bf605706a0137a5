"""Admin operations: topics, partitions, configs (Kafka's AdminClient subset the CLI needs).

Topic creation/deletion/partition changes go to the controller (in ZooKeeper mode only it may
write the topic znodes; another broker answers NOT_CONTROLLER, and we then refresh metadata and
retry). Config reads/writes of a topic go to any broker; of a broker, to that broker.
Per-resource errors come back as :class:`KafkaError` (``.code``, ``.name``, ``.message``).
"""
from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

from kbroker.protocol.errors import Errors

from .cluster import Cluster, ClusterClient, PartitionMeta
from .connection import KafkaError, raise_for_error

SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}    # Kafka's ScramMechanism ids

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, ALTER_CONFIGS = 19, 20, 32, 33
CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 37, 44
DELETE_RECORDS, ALTER_REPLICA_LOG_DIRS, DESCRIBE_LOG_DIRS, DESCRIBE_CLUSTER = 21, 34, 35, 60
ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS = 45, 46

TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# DescribeConfigs config_source values
CONFIG_SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
                  3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
                  6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}


def uuid_str(raw: bytes) -> str:
    """Kafka's Uuid.toString: URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


@dataclass(slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1           # -1: the broker's num.partitions
    replication_factor: int = -1       # -1: the broker's default.replication.factor
    configs: dict[str, str | None] = field(default_factory=dict)
    assignments: dict[int, list[int]] | None = None


@dataclass(frozen=True, slots=True)
class ConfigResource:
    type: int
    name: str

    @classmethod
    def topic(cls, name: str) -> "ConfigResource":
        return cls(TOPIC, name)

    @classmethod
    def broker(cls, broker_id) -> "ConfigResource":
        return cls(BROKER, str(broker_id))


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    read_only: bool
    is_sensitive: bool
    is_default: bool


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    size: int
    offset_lag: int
    is_future: bool


@dataclass(slots=True)
class LogDirDescription:
    error: KafkaError | None
    replicas: dict[tuple[str, int], ReplicaInfo]
    total_bytes: int = -1
    usable_bytes: int = -1


@dataclass(slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    brokers: dict[int, tuple[str, int, str | None]]    # id -> (host, port, rack)
    fenced: set[int] = field(default_factory=set)     # brokers that report themselves fenced (v2)


@dataclass(slots=True)
class TopicDescription:
    name: str
    topic_id: bytes
    is_internal: bool
    partitions: list[PartitionMeta]

    @property
    def topic_id_str(self) -> str:
        return uuid_str(self.topic_id)


class Admin(ClusterClient):
    def __init__(self, bootstrap_servers=None, *, cluster: Cluster | None = None, client_id: str = "kbroker-admin",
                 request_timeout_ms: int = 30000, retry_backoff_ms: int = 100, security=None):
        super().__init__(bootstrap_servers, cluster, client_id, request_timeout_ms, retry_backoff_ms, security)
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff = retry_backoff_ms / 1000

    async def _to_controller(self, api_key: int, make_body, results_key: str, name_key: str = "name"):
        """Send to the controller; names whose result is NOT_CONTROLLER are retried after a
        metadata refresh. -> {name: result dict}."""
        out = {}
        for attempt in range(5):
            conn = await self.cluster.controller_connection()
            version = conn.version_for(api_key)
            _, resp = await conn.send(api_key, make_body(version))
            retry = False
            for r in resp[results_key]:
                out[r[name_key]] = r
                if r["error_code"] == Errors.NOT_CONTROLLER:
                    retry = True
            if not retry:
                return out
            await asyncio.sleep(self.retry_backoff * (2 ** attempt))
            await self.cluster.fetch_metadata([])
        return out

    @staticmethod
    def _results(results: dict, raise_on_error: bool, context: str) -> dict:
        errors = {}
        for name, r in results.items():
            code = r["error_code"]
            errors[name] = KafkaError(code, r.get("error_message"), f"{context} {name}") if code else None
        if raise_on_error:
            for err in errors.values():
                if err is not None:
                    raise err
        return errors

    # ---- topics --------------------------------------------------------------------------------

    async def create_topics(self, topics: list[NewTopic], validate_only: bool = False, timeout_ms: int = 60000,
                            raise_on_error: bool = True) -> dict[str, KafkaError | None]:
        def body(version):
            ts = []
            for t in topics:
                if version < 4 and (t.num_partitions < 0 or t.replication_factor < 0) and not t.assignments:
                    raise KafkaError(Errors.UNSUPPORTED_VERSION,
                                     "broker defaults for partitions/replication need CreateTopics v4+")
                ts.append({
                    "name": t.name, "num_partitions": t.num_partitions if not t.assignments else -1,
                    "replication_factor": t.replication_factor if not t.assignments else -1,
                    "assignments": [{"partition_index": p, "broker_ids": list(b)}
                                    for p, b in sorted((t.assignments or {}).items())],
                    "configs": [{"name": k, "value": None if v is None else str(v)} for k, v in t.configs.items()],
                })
            return {"topics": ts, "timeout_ms": timeout_ms, "validate_only": validate_only}
        res = await self._to_controller(CREATE_TOPICS, body, "topics")
        return self._results(res, raise_on_error, "create topic")

    async def delete_topics(self, names: list[str], timeout_ms: int = 60000,
                            raise_on_error: bool = True) -> dict[str, KafkaError | None]:
        def body(version):
            return {"topic_names": list(names), "timeout_ms": timeout_ms,
                    "topics": [{"name": n, "topic_id": bytes(16)} for n in names]}
        res = await self._to_controller(DELETE_TOPICS, body, "responses")
        return self._results(res, raise_on_error, "delete topic")

    async def create_partitions(self, new_counts: dict[str, int], validate_only: bool = False,
                                timeout_ms: int = 60000, raise_on_error: bool = True) -> dict[str, KafkaError | None]:
        """``new_counts``: topic -> the new total partition count."""
        def body(version):
            return {"topics": [{"name": t, "count": n, "assignments": None} for t, n in new_counts.items()],
                    "timeout_ms": timeout_ms, "validate_only": validate_only}
        res = await self._to_controller(CREATE_PARTITIONS, body, "results")
        return self._results(res, raise_on_error, "create partitions")

    async def list_topics(self, include_internal: bool = False) -> list[str]:
        await self.cluster.fetch_metadata(None, allow_auto_topic_creation=False)
        return sorted(n for n, t in self.cluster.topics.items() if include_internal or not t.is_internal)

    async def describe_topics(self, names: list[str] | None = None, raise_on_error: bool = True
                              ) -> dict[str, TopicDescription | KafkaError]:
        """Via Metadata (``names`` None = all topics)."""
        resp = await self.cluster.fetch_metadata(None if names is None else list(names),
                                                 allow_auto_topic_creation=False)
        out: dict[str, TopicDescription | KafkaError] = {}
        for t in resp["topics"]:
            name = t["name"]
            if t["error_code"]:
                err = KafkaError(t["error_code"], None, f"describe topic {name}")
                if raise_on_error:
                    raise err
                out[name] = err
                continue
            tm = self.cluster.topics[name]
            out[name] = TopicDescription(name, tm.topic_id, tm.is_internal,
                                         [tm.partitions[p] for p in sorted(tm.partitions)])
        return out

    # ---- SCRAM credentials ---------------------------------------------------------------------

    async def describe_user_scram_credentials(self, users: list[str] | None = None) -> dict[str, dict[str, int]]:
        """{user: {mechanism: iterations}}; every user with credentials when ``users`` is None.
        KafkaError for a named user without credentials."""
        conn = await self.cluster.any_connection()
        _, resp = await conn.send(50, {"users": None if users is None else [{"name": u} for u in users]}, 0)
        raise_for_error(resp["error_code"], resp["error_message"], "describe SCRAM credentials")
        out = {}
        for r in resp["results"]:
            raise_for_error(r["error_code"], r["error_message"], f"SCRAM credentials of {r['user']}")
            out[r["user"]] = {SCRAM_MECHANISMS[i["mechanism"]]: i["iterations"] for i in r["credential_infos"]}
        return out

    async def alter_user_scram_credentials(self, upsertions: list[tuple[str, str, str, int]] = (),
                                           deletions: list[tuple[str, str]] = ()) -> None:
        """``upsertions``: (user, mechanism, password, iterations); the salted password is computed here,
        as Kafka's admin client does, so the password never travels. ``deletions``: (user, mechanism)."""
        import os
        from ..security.sasl.scram import MECHANISMS, salted_password
        ids = {m: i for i, m in SCRAM_MECHANISMS.items()}
        ups = []
        for user, mechanism, password, iterations in upsertions:
            salt = os.urandom(32)
            ups.append({"name": user, "mechanism": ids.get(mechanism, 0), "iterations": iterations, "salt": salt,
                        "salted_password": salted_password(MECHANISMS[mechanism], password, salt, iterations)
                        if mechanism in MECHANISMS else b""})
        dels = [{"name": u, "mechanism": ids.get(m, 0)} for u, m in deletions]
        conn = await self.cluster.any_connection()
        _, resp = await conn.send(51, {"deletions": dels, "upsertions": ups}, 0)
        for r in resp["results"]:
            raise_for_error(r["error_code"], r["error_message"], f"alter SCRAM credentials of {r['user']}")

    # ---- configs -------------------------------------------------------------------------------

    async def _for_resource(self, res: ConfigResource):
        if res.type in (BROKER, BROKER_LOGGER) and res.name:
            return await self.cluster.connection(int(res.name))
        return await self.cluster.any_connection()

    async def describe_configs(self, resources: list[ConfigResource], keys: list[str] | None = None,
                               raise_on_error: bool = True) -> dict[ConfigResource, dict[str, ConfigEntry] | KafkaError]:
        out = {}
        for res in resources:
            conn = await self._for_resource(res)
            version = conn.version_for(DESCRIBE_CONFIGS)
            _, resp = await conn.send(DESCRIBE_CONFIGS, {
                "resources": [{"resource_type": res.type, "resource_name": res.name, "configuration_keys": keys}],
                "include_synonyms": False, "include_documentation": False}, version)
            r = resp["results"][0]
            if r["error_code"]:
                err = KafkaError(r["error_code"], r.get("error_message"), f"describe configs {res.name}")
                if raise_on_error:
                    raise err
                out[res] = err
                continue
            entries = {}
            for c in r["configs"]:
                source = c.get("config_source", -1)
                if version == 0:   # v0 has is_default instead of a source
                    source = 5 if c.get("is_default") else (1 if res.type == TOPIC else 4)
                entries[c["name"]] = ConfigEntry(c["name"], c["value"], source, c["read_only"],
                                                 c["is_sensitive"], source == 5)
            out[res] = entries
        return out

    async def incremental_alter_configs(self, changes: dict[ConfigResource, dict[str, tuple[int, str | None]]],
                                        validate_only: bool = False, raise_on_error: bool = True):
        """``changes``: resource -> {name: (SET|DELETE|APPEND|SUBTRACT, value)}."""
        return await self._alter(INCREMENTAL_ALTER_CONFIGS, changes, validate_only, raise_on_error,
                                 lambda ops: [{"name": k, "config_operation": op, "value": v}
                                              for k, (op, v) in ops.items()])

    async def alter_configs(self, configs: dict[ConfigResource, dict[str, str | None]],
                            validate_only: bool = False, raise_on_error: bool = True):
        """Replace the whole dynamic config of each resource (the legacy, non-incremental API)."""
        return await self._alter(ALTER_CONFIGS, configs, validate_only, raise_on_error,
                                 lambda entries: [{"name": k, "value": v} for k, v in entries.items()])

    async def _alter(self, api_key: int, per_resource: dict, validate_only: bool, raise_on_error: bool,
                     config_entries):
        """One request per resource (each goes to the broker that owns it); -> {resource: KafkaError|None}."""
        out = {}
        for res, entries in per_resource.items():
            conn = await self._for_resource(res)
            _, resp = await conn.send(api_key, {"resources": [{
                "resource_type": res.type, "resource_name": res.name, "configs": config_entries(entries)}],
                "validate_only": validate_only})
            r = resp["responses"][0]
            out[res] = KafkaError(r["error_code"], r.get("error_message"), f"alter configs {res.name}") \
                if r["error_code"] else None
        if raise_on_error:
            for e in out.values():
                if e is not None:
                    raise e
        return out

    # ---- records -------------------------------------------------------------------------------

    async def delete_records(self, offsets: dict[tuple[str, int], int], timeout_ms: int = 30000
                             ) -> dict[tuple[str, int], int | KafkaError]:
        """Move each partition's log start to its offset (-1: the high watermark), one request per
        leader. -> {(topic, partition): new low watermark, or the partition's KafkaError}; partitions
        whose leader moved are retried after a metadata refresh."""
        out: dict[tuple[str, int], int | KafkaError] = {}
        pending = dict(offsets)
        await self.cluster.fetch_metadata(sorted({t for t, _ in pending}), allow_auto_topic_creation=False)
        for attempt in range(5):
            by_leader: dict[int, dict[str, list]] = {}
            for (t, p), off in pending.items():
                leader = self.cluster.leader_for(t, p)
                if leader < 0:
                    known = self.cluster.partitions_for(t) or ()
                    out[(t, p)] = KafkaError(Errors.LEADER_NOT_AVAILABLE if p in known
                                             else Errors.UNKNOWN_TOPIC_OR_PARTITION, None, f"delete records {t}-{p}")
                    continue
                by_leader.setdefault(leader, {}).setdefault(t, []).append(
                    {"partition_index": p, "offset": off})
            retry = {}
            for leader, topics in by_leader.items():
                conn = await self.cluster.connection(leader)
                _, resp = await conn.send(DELETE_RECORDS, {
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()], "timeout_ms": timeout_ms})
                for t in resp["topics"]:
                    for r in t["partitions"]:
                        tp = (t["name"], r["partition_index"])
                        code = r["error_code"]
                        if code == 0:
                            out[tp] = r["low_watermark"]
                            continue
                        err = KafkaError(code, None, f"delete records {tp[0]}-{tp[1]}")
                        out[tp] = err
                        if err.invalidates_metadata:
                            retry[tp] = pending[tp]
            if not retry:
                break
            pending = retry
            await asyncio.sleep(self.retry_backoff * (2 ** attempt))
            await self.cluster.fetch_metadata(sorted({t for t, _ in pending}), allow_auto_topic_creation=False)
        return out

    # ---- cluster and log dirs ------------------------------------------------------------------

    async def describe_cluster(self, conn=None) -> ClusterDescription:
        """The cluster as one broker (``conn``, default any) sees it, fenced brokers included (v2)."""
        conn = conn or await self.cluster.any_connection()
        _, resp = await conn.send(DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": False,
                                                     "endpoint_type": 1, "include_fenced_brokers": True})
        if resp["error_code"]:
            raise KafkaError(resp["error_code"], resp["error_message"], "describe cluster")
        brokers = resp["brokers"]
        return ClusterDescription(resp["cluster_id"], resp["controller_id"],
                                  {b["broker_id"]: (b["host"], b["port"], b["rack"])
                                   for b in brokers if not b.get("is_fenced")},
                                  {b["broker_id"] for b in brokers if b.get("is_fenced")})

    async def self_fenced_brokers(self) -> set[int]:
        """The brokers among the bootstrap servers that say they fenced themselves: only such a broker
        knows it (the others list it as live until ZooKeeper expires its session)."""
        out = set()
        for conn in await self.cluster.bootstrap_connections():
            if conn.version_for(DESCRIBE_CLUSTER) >= 2:
                out |= (await self.describe_cluster(conn)).fenced
        return out

    async def describe_log_dirs(self, broker_ids: list[int]) -> dict[int, dict[str, LogDirDescription]]:
        """Every log dir of each broker with all its partitions (DescribeLogDirs to each broker)."""
        await self.cluster.fetch_metadata([])
        out = {}
        for bid in broker_ids:
            conn = await self.cluster.connection(bid)
            _, resp = await conn.send(DESCRIBE_LOG_DIRS, {"topics": None})
            if resp.get("error_code"):
                raise KafkaError(resp["error_code"], None, f"describe log dirs of broker {bid}")
            dirs = {}
            for r in resp["results"]:
                replicas = {(t["name"], p["partition_index"]): ReplicaInfo(p["partition_size"], p["offset_lag"],
                                                                           p["is_future_key"])
                            for t in r["topics"] for p in t["partitions"]}
                err = KafkaError(r["error_code"], None, f"log dir {r['log_dir']}") if r["error_code"] else None
                dirs[r["log_dir"]] = LogDirDescription(err, replicas, r["total_bytes"], r["usable_bytes"])
            out[bid] = dirs
        return out

    async def alter_replica_log_dirs(self, moves: dict[tuple[str, int, int], str]
                                     ) -> dict[tuple[str, int, int], KafkaError | None]:
        """``moves``: (topic, partition, broker id) -> absolute log dir on that broker
        (AlterReplicaLogDirs to each broker). -> per replica its error, or None when the move started."""
        await self.cluster.fetch_metadata([])
        by_broker: dict[int, dict[str, dict[str, list[int]]]] = {}
        for (t, p, b), d in moves.items():
            by_broker.setdefault(b, {}).setdefault(d, {}).setdefault(t, []).append(p)
        out = {}
        for b, dirs in by_broker.items():
            conn = await self.cluster.connection(b)
            _, resp = await conn.send(ALTER_REPLICA_LOG_DIRS, {"dirs": [
                {"path": d, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
                for d, topics in dirs.items()]})
            for r in resp["results"]:
                for p in r["partitions"]:
                    code = p["error_code"]
                    key = (r["topic_name"], p["partition_index"], b)
                    out[key] = KafkaError(code, None, f"move {key[0]}-{key[1]} on broker {b}") if code else None
        return out

    # ---- reassignments (controller) ------------------------------------------------------------

    async def _controller_call(self, api_key: int, body: dict, context: str) -> dict:
        """One request to the controller, retried after a metadata refresh while the answer is a
        top-level NOT_CONTROLLER; another top-level error raises."""
        for attempt in range(5):
            conn = await self.cluster.controller_connection()
            _, resp = await conn.send(api_key, body)
            if resp["error_code"] != Errors.NOT_CONTROLLER or attempt == 4:
                break
            await asyncio.sleep(self.retry_backoff * (2 ** attempt))
            await self.cluster.fetch_metadata([])
        if resp["error_code"]:
            raise KafkaError(resp["error_code"], resp.get("error_message"), context)
        return resp

    async def alter_partition_reassignments(self, targets: dict[tuple[str, int], list[int] | None],
                                            timeout_ms: int = 60000) -> dict[tuple[str, int], KafkaError | None]:
        """``targets``: (topic, partition) -> new replicas, or None to cancel its reassignment."""
        topics: dict[str, list] = {}
        for (t, p), replicas in targets.items():
            topics.setdefault(t, []).append({"partition_index": p, "replicas": replicas})
        resp = await self._controller_call(ALTER_PARTITION_REASSIGNMENTS, {
            "timeout_ms": timeout_ms, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
            "alter partition reassignments")
        return {(t["name"], r["partition_index"]):
                KafkaError(r["error_code"], r["error_message"], f"reassign {t['name']}-{r['partition_index']}")
                if r["error_code"] else None
                for t in resp["responses"] for r in t["partitions"]}

    async def list_partition_reassignments(self, parts: list[tuple[str, int]] | None = None, timeout_ms: int = 60000
                                           ) -> dict[tuple[str, int], tuple[list[int], list[int], list[int]]]:
        """-> {(topic, partition): (replicas, adding, removing)} of the ongoing reassignments."""
        topics = None
        if parts is not None:
            by_topic: dict[str, list[int]] = {}
            for t, p in parts:
                by_topic.setdefault(t, []).append(p)
            topics = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
        resp = await self._controller_call(LIST_PARTITION_REASSIGNMENTS, {"timeout_ms": timeout_ms, "topics": topics},
                                           "list partition reassignments")
        return {(t["name"], r["partition_index"]): (r["replicas"], r["adding_replicas"], r["removing_replicas"])
                for t in resp["topics"] for r in t["partitions"]}
