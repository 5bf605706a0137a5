"""Kafka's classic (ZooKeeper mode) znode paths and JSON payloads.

Pure functions, no I/O. Encoders write the newest version Kafka 3.9 writes, in
compact JSON (no spaces) so ZK-era tools (CMAK, zkCli, Kafka itself) read our
data; decoders accept older versions and missing optional keys.

Types that trip readers: ``timestamp`` fields, ``/cluster/id``'s ``version``
and the producer-id block bounds are JSON *strings*; ``/controller_epoch`` is a
bare decimal, not JSON; topic config values are strings.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from dataclasses import dataclass, field

# --- paths -----------------------------------------------------------------

BROKERS = "/brokers"
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
BROKER_SEQID = "/brokers/seqid"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
CONFIG = "/config"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "/config/changes/config_change_"
CONFIG_TOPICS = "/config/topics"
DELETE_TOPICS = "/admin/delete_topics"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
ISR_CHANGE_PREFIX = "/isr_change_notification/isr_change_"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
LOG_DIR_EVENT_PREFIX = "/log_dir_event_notification/log_dir_event_"
LOG_DIR_FAILURE = 1          # the event code of a log dir failure
CONSUMERS = "/consumers"

# What a Kafka broker ensures at start-up (empty persistent nodes).
PERSISTENT_PATHS = (
    CONSUMERS,
    BROKER_IDS,
    BROKER_TOPICS,
    CONFIG_CHANGES,
    DELETE_TOPICS,
    BROKER_SEQID,
    ISR_CHANGE_NOTIFICATION,
    LATEST_PRODUCER_ID_BLOCK,
    LOG_DIR_EVENT_NOTIFICATION,
    "/config/topics",
    "/config/clients",
    "/config/users",
    "/config/brokers",
    "/config/ips",
)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249


def validate_topic_name(topic: str) -> None:
    """Kafka's topic name rule; also keeps a name from escaping its znode (no '/')."""
    if not topic or topic in (".", ".."):
        raise ValueError(f"illegal topic name {topic!r}")
    if len(topic) > MAX_TOPIC_NAME_LENGTH:
        raise ValueError(f"topic name longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_TOPIC.match(topic):
        raise ValueError(f"illegal topic name {topic!r}: only ASCII alphanumerics, '.', '_' and '-'")


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{int(broker_id)}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def topic_partitions_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{int(partition)}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{int(partition)}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


CONFIG_BROKERS = "/config/brokers"
DEFAULT_BROKER_ENTITY = "<default>"


def broker_config_path(entity: str) -> str:
    """/config/brokers/<id> or /config/brokers/<default> (dynamic broker configs)."""
    entity = str(entity)
    if entity != DEFAULT_BROKER_ENTITY and not entity.isdigit():
        raise ValueError(f"broker config entity {entity!r}: a broker id or {DEFAULT_BROKER_ENTITY}")
    return f"{CONFIG_BROKERS}/{entity}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


# --- helpers ---------------------------------------------------------------

def dumps(obj) -> bytes:
    """Compact JSON as Kafka's Jackson writes it (no whitespace)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loads(data: bytes | None):
    if not data:
        return None
    return json.loads(data.decode("utf-8"))


def now_ms() -> int:
    return int(time.time() * 1000)


def uuid_to_base64(u: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding (22 chars)."""
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode("ascii")


def base64_to_uuid(s: str) -> uuid.UUID:
    if len(s) != 22:
        raise ValueError(f"not a 22-character base64 UUID: {s!r}")
    return uuid.UUID(bytes=base64.urlsafe_b64decode(s + "=="))


def new_uuid_base64() -> str:
    """A random id for cluster and topic ids.

    Like Kafka, skip the all-zero id and ids starting with '-' (which command
    line tools would take for a flag).
    """
    while True:
        s = uuid_to_base64(uuid.uuid4())
        if not s.startswith("-"):
            return s


# --- /brokers/ids/<id> -----------------------------------------------------

@dataclass(frozen=True)
class BrokerRegistration:
    broker_id: int
    host: str | None
    port: int
    endpoints: list[tuple[str, str, int]]          # (listener name, host, port)
    security_protocol_map: dict[str, str]
    rack: str | None = None
    jmx_port: int = -1
    timestamp_ms: int | None = None
    version: int = 5
    features: dict = field(default_factory=dict)


def _parse_endpoint(s: str) -> tuple[str, str, int]:
    listener, sep, hostport = s.partition("://")
    if not sep:
        raise ValueError(f"bad endpoint {s!r}")
    host, _, port = hostport.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return listener, host, int(port)


def _format_endpoint(listener: str, host: str, port: int) -> str:
    if ":" in host:
        host = f"[{host}]"
    return f"{listener}://{host}:{port}"


def encode_broker(host: str, port: int, rack: str | None = None, *, timestamp_ms: int | None = None,
                  endpoints: list[tuple[str, str, int]] | None = None,
                  security_protocol_map: dict[str, str] | None = None, jmx_port: int = -1) -> bytes:
    """v5 registration. ``endpoints`` defaults to one PLAINTEXT listener on host:port."""
    if endpoints is None:
        endpoints = [("PLAINTEXT", host, port)]
    if security_protocol_map is None:
        security_protocol_map = {name: name for name, _, _ in endpoints}
    # host/port: Kafka puts the first PLAINTEXT endpoint here (for old readers), else null/-1.
    plain = next(((h, p) for n, h, p in endpoints if security_protocol_map.get(n) == "PLAINTEXT"), None)
    obj = {
        "version": 5,
        "host": plain[0] if plain else None,
        "port": plain[1] if plain else -1,
        "jmx_port": jmx_port,
        "timestamp": str(now_ms() if timestamp_ms is None else timestamp_ms),
        "endpoints": [_format_endpoint(*e) for e in endpoints],
        "listener_security_protocol_map": security_protocol_map,
        "features": {},
    }
    if rack is not None:
        obj["rack"] = rack
    return dumps(obj)


def decode_broker(broker_id: int, data: bytes) -> BrokerRegistration:
    obj = loads(data)
    version = int(obj.get("version", 1))
    if "endpoints" in obj:
        endpoints = [_parse_endpoint(e) for e in obj["endpoints"]]
    else:  # v1/v2: host/port only
        endpoints = [("PLAINTEXT", obj["host"], int(obj["port"]))]
    proto_map = obj.get("listener_security_protocol_map") or {n: n for n, _, _ in endpoints}
    ts = obj.get("timestamp")
    return BrokerRegistration(
        broker_id=int(broker_id), host=obj.get("host"), port=int(obj.get("port", -1)),
        endpoints=endpoints, security_protocol_map=proto_map, rack=obj.get("rack"),
        jmx_port=int(obj.get("jmx_port", -1)), timestamp_ms=int(ts) if ts is not None else None,
        version=version, features=obj.get("features") or {})


# --- /controller, /controller_epoch ----------------------------------------

@dataclass(frozen=True)
class ControllerInfo:
    broker_id: int
    timestamp_ms: int | None
    kraft_controller_epoch: int = -1


def encode_controller(broker_id: int, timestamp_ms: int | None = None) -> bytes:
    return dumps({"version": 2, "brokerid": int(broker_id),
                  "timestamp": str(now_ms() if timestamp_ms is None else timestamp_ms),
                  "kraftControllerEpoch": -1})


def decode_controller(data: bytes) -> ControllerInfo:
    obj = loads(data)
    ts = obj.get("timestamp")
    return ControllerInfo(int(obj["brokerid"]), int(ts) if ts is not None else None,
                          int(obj.get("kraftControllerEpoch", -1)))


def encode_controller_epoch(epoch: int) -> bytes:
    return str(int(epoch)).encode("ascii")


def decode_controller_epoch(data: bytes) -> int:
    return int(data.decode("ascii").strip())


# --- /cluster/id ------------------------------------------------------------

def encode_cluster_id(cluster_id: str) -> bytes:
    return dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return loads(data)["id"]


# --- /brokers/topics/<t> ----------------------------------------------------

@dataclass(frozen=True)
class TopicAssignment:
    topic_id: str | None                      # None for topics written before topic ids (v1/v2)
    partitions: dict[int, list[int]]
    adding_replicas: dict[int, list[int]] = field(default_factory=dict)
    removing_replicas: dict[int, list[int]] = field(default_factory=dict)


def _int_keys(m: dict | None) -> dict[int, list[int]]:
    return {int(k): [int(r) for r in v] for k, v in (m or {}).items()}


def _str_keys(m: dict[int, list[int]]) -> dict[str, list[int]]:
    return {str(int(k)): [int(r) for r in m[k]] for k in sorted(m)}


def encode_topic(partitions: dict[int, list[int]], topic_id: str | None,
                 adding_replicas: dict[int, list[int]] | None = None,
                 removing_replicas: dict[int, list[int]] | None = None) -> bytes:
    obj = {"version": 3, "partitions": _str_keys(partitions),
           "adding_replicas": _str_keys(adding_replicas or {}),
           "removing_replicas": _str_keys(removing_replicas or {})}
    if topic_id is not None:
        obj["topic_id"] = topic_id
    return dumps(obj)


def decode_topic(data: bytes) -> TopicAssignment:
    obj = loads(data) or {}
    return TopicAssignment(obj.get("topic_id"), _int_keys(obj.get("partitions")),
                           _int_keys(obj.get("adding_replicas")), _int_keys(obj.get("removing_replicas")))


# --- /brokers/topics/<t>/partitions/<p>/state -------------------------------

LEADER_RECOVERY_RECOVERED = 0
LEADER_RECOVERY_RECOVERING = 1


@dataclass(frozen=True)
class PartitionState:
    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int
    leader_recovery_state: int = LEADER_RECOVERY_RECOVERED


def encode_partition_state(state: PartitionState) -> bytes:
    obj = {"version": 1, "leader": int(state.leader), "leader_epoch": int(state.leader_epoch),
           "controller_epoch": int(state.controller_epoch), "isr": [int(r) for r in state.isr]}
    # Kafka writes the key only when it differs from the default (RECOVERED).
    if state.leader_recovery_state != LEADER_RECOVERY_RECOVERED:
        obj["leader_recovery_state"] = int(state.leader_recovery_state)
    return dumps(obj)


def decode_partition_state(data: bytes) -> PartitionState:
    obj = loads(data)
    return PartitionState(int(obj["leader"]), int(obj["leader_epoch"]), [int(r) for r in obj["isr"]],
                          int(obj["controller_epoch"]),
                          int(obj.get("leader_recovery_state", LEADER_RECOVERY_RECOVERED)))


# --- /config/topics/<t>, /config/changes/config_change_<seq> -----------------

def encode_config(configs: dict[str, str]) -> bytes:
    for k, v in configs.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"config {k!r}={v!r}: keys and values must be strings (as Kafka stores them)")
    return dumps({"version": 1, "config": dict(configs)})


def decode_config(data: bytes | None) -> dict[str, str]:
    obj = loads(data)
    if not obj:
        return {}
    return {str(k): str(v) for k, v in (obj.get("config") or {}).items()}


def encode_config_change(entity_type: str, entity_name: str) -> bytes:
    """v2 notification; ``entity_type`` is the /config child, e.g. "topics"."""
    return dumps({"version": 2, "entity_path": f"{entity_type}/{entity_name}"})


def decode_config_change(data: bytes) -> tuple[str, str]:
    obj = loads(data)
    if int(obj.get("version", 1)) == 1:  # v1: {"version":1,"entity_type":..,"entity_name":..}
        return obj["entity_type"], obj["entity_name"]
    entity_type, _, entity_name = obj["entity_path"].partition("/")
    return entity_type, entity_name


# --- /latest_producer_id_block ----------------------------------------------

@dataclass(frozen=True)
class ProducerIdBlock:
    broker_id: int
    start: int        # first id of the block
    end: int          # last id of the block (inclusive)


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    return dumps({"version": 1, "broker": int(block.broker_id),
                  "block_start": str(block.start), "block_end": str(block.end)})


def decode_producer_id_block(data: bytes | None) -> ProducerIdBlock | None:
    obj = loads(data)
    if not obj:
        return None
    return ProducerIdBlock(int(obj["broker"]), int(obj["block_start"]), int(obj["block_end"]))


# --- /isr_change_notification/isr_change_<seq>, /admin/preferred_replica_election --------------

def encode_partition_list(partitions) -> bytes:
    """{"version":1,"partitions":[{"topic":t,"partition":p},...]} (ISR change notifications and
    preferred replica election requests share this shape)."""
    return dumps({"version": 1, "partitions": [{"topic": t, "partition": int(p)} for t, p in partitions]})


def decode_partition_list(data: bytes | None) -> list[tuple[str, int]]:
    obj = loads(data) or {}
    return [(str(e["topic"]), int(e["partition"])) for e in obj.get("partitions") or ()]


# --- /log_dir_event_notification/log_dir_event_<seq> -----------------------------------------------

def encode_log_dir_event(broker_id: int, event: int = LOG_DIR_FAILURE) -> bytes:
    """{"version":1,"broker":<id>,"event":1}: a broker tells the controller a log dir of it failed."""
    return dumps({"version": 1, "broker": int(broker_id), "event": int(event)})


def decode_log_dir_event(data: bytes | None) -> tuple[int, int]:
    """-> (broker id, event)."""
    obj = loads(data) or {}
    return int(obj["broker"]), int(obj.get("event", LOG_DIR_FAILURE))


# --- /admin/reassign_partitions --------------------------------------------------------------------

def encode_reassignment(entries) -> bytes:
    """entries: [(topic, partition, [replicas])] (kafka-reassign-partitions.sh's JSON)."""
    return dumps({"version": 1, "partitions": [{"topic": t, "partition": int(p), "replicas": [int(r) for r in rs]}
                                               for t, p, rs in entries]})


def decode_reassignment(data: bytes | None) -> list[tuple[str, int, list[int]]]:
    obj = loads(data) or {}
    return [(str(e["topic"]), int(e["partition"]), [int(r) for r in e["replicas"]])
            for e in obj.get("partitions") or ()]
