"""Broker configuration: ``server.properties`` with Kafka 3.9's key names, types and defaults.

A config is a ``server.properties`` text plus ``--override key=value`` pairs (overrides win). Every
key is looked up in :data:`BROKER_CONFIGS`:

* a key kbroker implements is parsed, validated and used;
* a real Kafka key kbroker does not implement yet is parsed and validated too (a bad value is still a
  mistake) but only **warned** about, so an existing Kafka config file keeps loading;
* any other key raises :class:`ConfigError`. Kafka itself only logs "isn't a known config" for those;
  we refuse because a typo such as ``log.retention.hour`` would otherwise silently keep the default.

Error texts follow Kafka's ``ConfigException`` wording (``Invalid value abc for configuration
num.partitions: Not a number of type INT``) so people can search for them.

Our own keys carry a ``kbroker.`` prefix (``kbroker.metrics.port``) so they never collide with Kafka's.

Reading values::

    config = BrokerConfig.from_file("server.properties", overrides=["num.partitions=3"])
    config.get("num.partitions")        # typed value, Kafka's default when unset (3 here)
    config.get_int("num.partitions")    # the same, checked to be an int/long/short key
    config.broker_id, config.listeners, config.advertised_listeners, config.log_dirs,
    config.log_retention_ms, config.log_roll_ms, ...   # derived values (precedence rules applied)
    config.topic_defaults()             # {"retention.ms": 604800000, ...} with Kafka's topic key names

Topic-level configs (CreateTopics/AlterConfigs/DescribeConfigs) use :data:`TOPIC_CONFIGS` and
:func:`parse_topic_config`.
"""
from __future__ import annotations

import difflib
import logging
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import switches

log = logging.getLogger(__name__)

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
_LIMITS = {"int": (-(2**31), INT_MAX), "short": (-(2**15), 2**15 - 1), "long": (-(2**63), LONG_MAX)}

# Kafka's smallest legal segment: one v0 legacy record's overhead (14 bytes) in 3.9.
MIN_SEGMENT_BYTES = 14
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("compact", "delete")
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


class ConfigError(ValueError):
    """A config that cannot be used. ``key`` names the offending key (None for file-level errors)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


# --------------------------------------------------------------------------------------------------
# Validators. Each takes (key, typed value) and raises ConfigError with Kafka's wording.

Validator = Callable[[str, Any], None]


def _invalid(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"Invalid value {format_value(value)} for configuration {key}: {why}", key)


def at_least(lo: int | float) -> Validator:
    def check(key: str, value: Any) -> None:
        if value is None:
            raise _invalid(key, value, "Value must be non-null")
        if value < lo:
            raise _invalid(key, value, f"Value must be at least {lo}")
    check.__doc__ = f"[{lo},...]"
    return check


def between(lo: int | float, hi: int | float) -> Validator:
    def check(key: str, value: Any) -> None:
        if value is None:
            raise _invalid(key, value, "Value must be non-null")
        if value < lo:
            raise _invalid(key, value, f"Value must be at least {lo}")
        if value > hi:
            raise _invalid(key, value, f"Value must be no more than {hi}")
    check.__doc__ = f"[{lo},...,{hi}]"
    return check


def one_of(*allowed: str, case_sensitive: bool = True) -> Validator:
    def check(key: str, value: Any) -> None:
        ok = value in allowed if case_sensitive else (
            value is not None and value.lower() in {a.lower() for a in allowed})
        if not ok:
            raise _invalid(key, value, f"String must be one of: {', '.join(allowed)}")
    check.__doc__ = f"[{', '.join(allowed)}]"
    return check


def list_of(*allowed: str) -> Validator:
    def check(key: str, value: Any) -> None:
        for item in value or ():
            if item not in allowed:
                raise _invalid(key, value, f"String must be one of: {', '.join(allowed)}")
    check.__doc__ = f"[{', '.join(allowed)}]"
    return check


_REPLICA_ITEM = re.compile(r"([0-9]+:[0-9]+)?\Z")


def throttled_replicas(key: str, value: Any) -> None:
    """Kafka's ThrottledReplicaListValidator: the literal '*', or "partition:broker" items."""
    items = [str(v).strip() for v in value or ()]
    if "".join(items) == "*" or all(_REPLICA_ITEM.match(v) for v in items):
        return
    raise _invalid(key, value, f"{key} must be the literal '*' or a list of replicas in the following format: "
                               "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


throttled_replicas.__doc__ = "[partitionId]:[brokerId],[partitionId]:[brokerId],..."


# --------------------------------------------------------------------------------------------------
# Types: parse the (trimmed) text of a property the way Kafka's ConfigDef does.

_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_DOUBLE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[dDfF]?\Z")


def parse_value(key: str, type_: str, text: str) -> Any:
    text = text.strip()
    if type_ in _LIMITS:
        lo, hi = _LIMITS[type_]
        if not _INTEGER.match(text) or not lo <= int(text) <= hi:
            raise _invalid(key, text, f"Not a number of type {type_.upper()}")
        return int(text)
    if type_ == "double":
        if not _DOUBLE.match(text):
            raise _invalid(key, text, "Not a number of type DOUBLE")
        return float(text.rstrip("dDfF"))
    if type_ == "boolean":
        if text.lower() not in ("true", "false"):
            raise _invalid(key, text, "Expected value to be either true or false")
        return text.lower() == "true"
    if type_ == "list":
        return [] if not text else [item.strip() for item in text.split(",")]
    if type_ in ("string", "password", "class"):
        return text
    raise AssertionError(f"unknown config type {type_!r} for {key}")


def format_value(value: Any) -> str:
    """A typed value as Kafka prints it (DescribeConfigs values, error messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: str                   # int, short, long, double, boolean, string, list, password, class
    default: Any                # typed; None = Kafka has no default ("null")
    validator: Validator | None = None
    implemented: bool = False   # False: accepted with a warning, kbroker ignores it for now
    doc: str = ""
    why: str = ""               # for a key with no effect: why (else its family's reason, _why())

    def parse(self, text: str) -> Any:
        value = parse_value(self.name, self.type, text)
        if self.validator is not None:
            self.validator(self.name, value)
        return value


def _table(*keys: ConfigKey) -> dict[str, ConfigKey]:
    out: dict[str, ConfigKey] = {}
    for k in keys:
        assert k.name not in out, k.name
        out[k.name] = k
    return out


def _impl(name: str, type_: str, default: Any, validator: Validator | None = None, doc: str = "") -> ConfigKey:
    return ConfigKey(name, type_, default, validator, True, doc)


def _known(name: str, type_: str, default: Any, validator: Validator | None = None, why: str = "") -> ConfigKey:
    return ConfigKey(name, type_, default, validator, False, why=why)


ONE_LOOP = "one event loop per broker serves every connection, request and replica fetch; there is no thread pool to size"
SECURITY = "kbroker's security is TLS, SASL PLAIN / SCRAM and the AclAuthorizer; this option of it is not implemented"
TRANSACTIONS = "this transaction setting is not implemented in kbroker's transaction coordinator"
KRAFT = "a KRaft setting; kbroker runs in ZooKeeper mode"
TIERED = "tiered storage (KIP-405) is not implemented; all data stays in the local log dirs"
NEW_GROUPS = "the consumer group protocol of KIP-848 is not implemented; groups use the classic protocol"
SHARE_GROUPS = "share groups (KIP-932) are not implemented"
TOKENS = "delegation tokens are not implemented"
METRICS = "metrics are served by kbroker's Prometheus endpoint (kbroker.metrics.port); there is no JMX or reporter plugin"
PLUGINS = "kbroker runs no Java plugin classes"

# Reasons shared by a family of keys, by name prefix (the first match wins); a key's own `why` comes first.
_FAMILY_WHY = (
    (("ssl.", "sasl.", "security.", "listener.name.", "authorizer.", "super.users", "principal.",
      "zookeeper.ssl.", "zookeeper.set.acl", "allow.everyone.if.no.acl.found", "connections.max.reauth.ms",
      "connection.failed.authentication.delay.ms"), SECURITY),
    (("transaction.", "transactional.id."), TRANSACTIONS),
    (("client.quota.callback.class",), "client quotas follow Kafka's default callback (user/client-id entities); " + PLUGINS),
    (("num.network.threads", "num.io.threads", "background.threads", "num.recovery.threads.per.data.dir",
      "num.replica.fetchers", "num.replica.alter.log.dirs.threads", "group.coordinator.threads",
      "queued.max.requests"), ONE_LOOP),
    (("controller.quorum.", "metadata.", "process.roles", "node.id", "controller.listener.names",
      "broker.heartbeat.interval.ms", "broker.session.timeout.ms", "initial.broker.registration.timeout.ms",
      "eligible.leader.replicas.enable", "zookeeper.metadata.migration.", "server.max.startup.time.ms",
      "early.start.listeners", "unstable.feature.versions.enable"), KRAFT),
    (("remote.", "log.local.retention."), TIERED),
    (("group.share.",), SHARE_GROUPS),
    (("group.consumer.", "group.coordinator."), NEW_GROUPS),
    (("delegation.token.",), TOKENS),
    (("password.encoder.",), "dynamic password configs are encoded with AES/CBC/PKCS5Padding and a "
                              "PBKDF2WithHmacSHA512 key only, and the secret is not rotated"),
    (("metric.reporters", "metrics.", "kafka.metrics.", "auto.include.jmx.reporter", "telemetry.max.bytes"),
     METRICS),
    (("create.topic.policy.class.name", "alter.config.policy.class.name"), PLUGINS),
    (("fetch.purgatory.", "producer.purgatory.", "delete.records.purgatory."),
     "waiting requests are kept per partition and completed when they can, with no purgatory to purge"),
    (("compression.gzip.level", "compression.lz4.level", "compression.zstd.level"),
     "batches recompressed for compression.type use each codec's default level"),
)


def _why(spec: ConfigKey) -> str:
    """Why an accepted key has no effect in kbroker (logged once at start-up)."""
    if spec.why:
        return spec.why
    for prefixes, reason in _FAMILY_WHY:
        if spec.name.startswith(prefixes):
            return reason
    return ""


# kbroker's own key choosing the event-loop implementation; the environment variable
# lets test and benchmark runs pick it for every broker they start without editing configs.
EVENT_LOOP_KEY = "kbroker.event.loop"
EVENT_LOOP_ENV = "KBROKER_EVENT_LOOP"
EVENT_LOOPS = ("asyncio", "uvloop")      # the loops the setting names
DEFAULT_EVENT_LOOP = "uvloop"          # docs/perf/event-loop.md, "Choice"
UVLOOP_MISSING = "the uvloop package is not importable in this Python (install uvloop, or choose asyncio)"


def _event_loop(key: str, value: Any) -> None:
    """Known loop names in Kafka's wording; uvloop only where it can be imported, so a broker told to use
    a loop it cannot load fails at config time, naming the key, not at start."""
    if value not in EVENT_LOOPS:
        raise _invalid(key, value, f"String must be one of: {', '.join(EVENT_LOOPS)}")
    if value == "uvloop":
        import importlib.util
        try:
            found = importlib.util.find_spec("uvloop") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise _invalid(key, value, UVLOOP_MISSING)


_event_loop.__doc__ = "[asyncio, uvloop]"

_DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"

# Kafka 3.9 broker keys (ZooKeeper mode). Defaults and ranges are Kafka's.
BROKER_CONFIGS: dict[str, ConfigKey] = _table(
    # --- implemented --------------------------------------------------------------------------
    _impl("broker.id", "int", -1, doc="-1 = generated id (not yet implemented: set an id)"),
    _impl("broker.rack", "string", None),
    _impl("listeners", "string", "PLAINTEXT://:9092", doc="an empty host binds every interface"),
    _impl("advertised.listeners", "string", None, doc="falls back to listeners"),
    _impl("listener.security.protocol.map", "string", _DEFAULT_PROTOCOL_MAP),
    _impl("inter.broker.listener.name", "string", None, doc="the listener brokers use among themselves"),
    _impl("security.inter.broker.protocol", "string", "PLAINTEXT", one_of(*SECURITY_PROTOCOLS)),
    # --- security: listeners' TLS (kbroker/security/tls.py); per listener as listener.name.<l>.ssl.* ---
    _known("ssl.protocol", "string", "TLSv1.3"),
    _impl("ssl.enabled.protocols", "list", ["TLSv1.2", "TLSv1.3"]),
    _impl("ssl.cipher.suites", "list", []),
    _impl("ssl.client.auth", "string", "none", one_of("required", "requested", "none")),
    _impl("ssl.endpoint.identification.algorithm", "string", "https"),
    _impl("ssl.keystore.type", "string", "JKS"),
    _impl("ssl.keystore.location", "string", None),
    _impl("ssl.keystore.password", "password", None),
    _impl("ssl.key.password", "password", None),
    _impl("ssl.truststore.type", "string", "JKS"),
    _impl("ssl.truststore.location", "string", None),
    _impl("ssl.truststore.password", "password", None),
    _impl("sasl.enabled.mechanisms", "list", ["GSSAPI"], doc="kbroker serves PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    _impl("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI"),
    _impl("connection.failed.authentication.delay.ms", "int", 100, at_least(0)),
    _impl("connections.max.reauth.ms", "long", 0, at_least(0), doc="SASL session lifetime (KIP-368); 0 = unlimited"),
    _impl("ssl.principal.mapping.rules", "string", "DEFAULT", doc="mTLS principals: RULE:pattern/replacement/[LU], DEFAULT"),
    _impl("log.dirs", "string", None, doc="comma-separated; overrides log.dir"),
    _impl("log.dir", "string", "/tmp/kafka-logs"),
    _impl("num.partitions", "int", 1, at_least(1)),
    _impl("default.replication.factor", "int", 1),
    _impl("min.insync.replicas", "int", 1, at_least(1)),
    _impl("auto.create.topics.enable", "boolean", True),
    _impl("delete.topic.enable", "boolean", True),
    _impl("log.segment.bytes", "int", 1024**3, at_least(MIN_SEGMENT_BYTES)),
    _impl("log.roll.ms", "long", None, doc="wins over log.roll.hours"),
    _impl("log.roll.hours", "int", 168, at_least(1)),
    _impl("log.retention.ms", "long", None, doc="wins over minutes and hours; -1 = no time limit"),
    _impl("log.retention.minutes", "int", None, doc="wins over hours"),
    _impl("log.retention.hours", "int", 168),
    _impl("log.retention.bytes", "long", -1, doc="per partition; -1 = no size limit"),
    _impl("log.retention.check.interval.ms", "long", 300000, at_least(1)),
    _impl("log.index.interval.bytes", "int", 4096, at_least(0)),
    _impl("log.index.size.max.bytes", "int", 10 * 1024 * 1024, at_least(4)),
    _impl("log.flush.interval.messages", "long", LONG_MAX, at_least(1)),
    _impl("log.flush.interval.ms", "long", None, doc="falls back to log.flush.scheduler.interval.ms"),
    _impl("log.flush.offset.checkpoint.interval.ms", "int", 60000, at_least(0)),
    _impl("log.flush.scheduler.interval.ms", "long", LONG_MAX),
    _impl("log.message.timestamp.type", "string", "CreateTime", one_of(*TIMESTAMP_TYPES)),
    _impl("message.max.bytes", "int", 1024 * 1024 + 12, at_least(0)),
    _impl("socket.request.max.bytes", "int", 100 * 1024 * 1024, at_least(1)),
    _impl("socket.send.buffer.bytes", "int", 100 * 1024, doc="-1 = OS default"),
    _impl("socket.receive.buffer.bytes", "int", 100 * 1024, doc="-1 = OS default"),
    _impl("queued.max.request.bytes", "long", -1, doc="-1 = no limit"),
    _impl("connections.max.idle.ms", "long", 10 * 60 * 1000),
    _impl("zookeeper.connect", "string", None, doc="required: host:port[,host:port][/chroot]"),
    _impl("zookeeper.session.timeout.ms", "int", 18000),
    _impl("zookeeper.connection.timeout.ms", "int", None, doc="falls back to the session timeout"),
    _impl("offsets.topic.replication.factor", "short", 3, at_least(1)),
    _impl("transaction.state.log.replication.factor", "short", 3, at_least(1)),
    _impl("transaction.state.log.min.isr", "int", 2, at_least(1)),
    _impl("group.initial.rebalance.delay.ms", "int", 3000),
    _impl("replica.lag.time.max.ms", "long", 30000),
    # Replication throttle (kbroker/replica/throttle.py); dynamic in Kafka (/config/brokers/<id>), a
    # static value here is the fallback below the dynamic ones.
    _impl("leader.replication.throttled.rate", "long", LONG_MAX, at_least(0)),
    _impl("follower.replication.throttled.rate", "long", LONG_MAX, at_least(0)),
    _impl("replication.quota.window.num", "int", 11, at_least(1)),
    _impl("replication.quota.window.size.seconds", "int", 1, at_least(1)),
    # Client quotas (kbroker/security/quotas.py): the windows the rates are measured over.
    _impl("quota.window.num", "int", 11, at_least(1)),
    _impl("quota.window.size.seconds", "int", 1, at_least(1)),
    _impl("unclean.leader.election.enable", "boolean", False),
    _impl("auto.leader.rebalance.enable", "boolean", True),
    _impl("leader.imbalance.per.broker.percentage", "int", 10),
    _impl("leader.imbalance.check.interval.seconds", "long", 300, at_least(1)),
    _impl("controlled.shutdown.enable", "boolean", True),
    _impl("controlled.shutdown.max.retries", "int", 3),
    _impl("controlled.shutdown.retry.backoff.ms", "long", 5000),
    _impl("replica.fetch.max.bytes", "int", 1024 * 1024, at_least(0)),
    _impl("replica.fetch.min.bytes", "int", 1),
    _impl("replica.fetch.wait.max.ms", "int", 500),
    _impl("replica.fetch.backoff.ms", "int", 1000, at_least(0)),
    _impl("replica.fetch.response.max.bytes", "int", 10 * 1024 * 1024, at_least(0)),
    _impl("replica.socket.timeout.ms", "int", 30000),
    # kbroker's own keys.
    _impl("log.segment.delete.delay.ms", "long", 60000, at_least(0),
          doc="deleted segments and partitions keep their files this long (own timer, 200 ms resolution)"),
    _impl("fetch.max.bytes", "int", 55 * 1024 * 1024, at_least(1024),
          doc="caps a consumer Fetch answer's record data whatever its max_bytes (the first batch may exceed)"),
    _impl("max.connections", "int", INT_MAX, at_least(0),
          doc="at the limit new connections wait in the listen backlog until one closes"),
    _impl("max.connections.per.ip", "int", INT_MAX, at_least(0),
          doc="a connection over its address's limit is closed right after accept"),
    _impl("kbroker.socket.request.frame.timeout.ms", "int", 30000, at_least(0),
          doc="kbroker's own (Kafka has none): a request frame must arrive in full within this time of its "
              "first byte or the connection is closed; 0 = no deadline"),
    _impl("kbroker.metrics.port", "int", -1, between(-1, 65535),
          doc="Prometheus /metrics HTTP port on the listener host; -1 = off, 0 = any free port"),
    _impl("kbroker.log.validation.threads", "int", 2, at_least(0),
          doc="threads that decompress and check compressed producer batches off the event loop (the loop "
              "then appends them in arrival order per partition); 0 = check them on the loop"),
    _impl("kbroker.log.writer.offload.bytes", "int", 1 << 20, at_least(0),
          doc="a producer batch of at least this size is written by its log dir's writer thread while the "
              "loop goes on receiving; its offsets are visible (and acknowledged) once written. 0 = never"),
    _impl("kbroker.zookeeper.session.fencing.enable", "boolean", True,
          doc="kbroker's own (Kafka has none): a broker cut from ZooKeeper for about its session timeout "
              "stops leading its partitions (clients get NOT_LEADER_OR_FOLLOWER and find the new leader) until "
              "the controller's LeaderAndIsr; false = keep leading until the session is known lost"),
    _impl(EVENT_LOOP_KEY, "string", DEFAULT_EVENT_LOOP, _event_loop,
          doc="the broker's event loop: uvloop (the default; a dependency of kbroker) or asyncio (the "
              f"standard library's selector loop); the {EVENT_LOOP_ENV} environment variable sets it when the "
              "config does not. Both run the same network rules and sendfile; the figures behind the "
              "default are in docs/perf/event-loop.md"),
    # --- known Kafka keys, not implemented yet (warned about) ------------------------------------
    _known("broker.id.generation.enable", "boolean", True,
           why="broker ids are not generated: broker.id must be set"),
    _impl("reserved.broker.max.id", "int", 1000, at_least(0), doc="broker.id's upper bound"),
    _known("background.threads", "int", 10, at_least(1)),
    # One event loop serves every connection and request; there are no thread pools or request
    # queue of these sizes to configure.
    _known("num.network.threads", "int", 3, at_least(1)),
    _known("num.io.threads", "int", 8, at_least(1)),
    _known("queued.max.requests", "int", 500, at_least(1)),
    _impl("request.timeout.ms", "int", 30000, at_least(0),
          doc="how long a WriteTxnMarkers waits for its markers to be replicated"),
    _impl("compression.type", "string", "producer", one_of(*COMPRESSION_TYPES, case_sensitive=False),
          doc="producer keeps each batch as sent; another codec recompresses producer batches on the leader"),
    _known("compression.gzip.level", "int", -1),
    _known("compression.lz4.level", "int", 9),
    _known("compression.zstd.level", "int", 3),
    _known("num.recovery.threads.per.data.dir", "int", 1, at_least(1)),
    _known("num.replica.fetchers", "int", 1),
    _known("num.replica.alter.log.dirs.threads", "int", None),
    _known("controller.socket.timeout.ms", "int", 30000,
           why="the controller's requests to brokers use a fixed timeout"),
    _known("replica.socket.receive.buffer.bytes", "int", 64 * 1024,
           why="follower connections keep the OS's receive buffer size"),
    _known("replica.high.watermark.checkpoint.interval.ms", "long", 5000,
           why="high watermarks are checkpointed with the recovery points "
               "(log.flush.offset.checkpoint.interval.ms)"),
    _impl("replica.selector.class", "string", None, one_of("org.apache.kafka.common.replica.RackAwareReplicaSelector", ""),
          doc="KIP-392: Kafka's RackAwareReplicaSelector (the one selector kbroker has): a leader names an in-sync "
              "follower in a consumer's client.rack as its preferred read replica; unset = consumers read from "
              "the leader (followers serve Fetch v11+ consumers either way)"),
    _known("fetch.purgatory.purge.interval.requests", "int", 1000),
    _known("producer.purgatory.purge.interval.requests", "int", 1000),
    _known("delete.records.purgatory.purge.interval.requests", "int", 1),
    _known("inter.broker.protocol.version", "string", "3.9-IV0",
           why="brokers speak one inter-broker protocol version"),
    _known("control.plane.listener.name", "string", None,
           why="controller requests share the brokers' listener"),
    _known("socket.listen.backlog.size", "int", 50, at_least(1),
           why="the listen backlog is fixed (128)"),
    _known("max.connections.per.ip.overrides", "string", "",
           why="only the one max.connections.per.ip limit is applied"),
    _impl("log.cleanup.policy", "list", ["delete"], list_of(*CLEANUP_POLICIES)),
    _impl("log.cleaner.enable", "boolean", True),
    _impl("log.cleaner.threads", "int", 1, at_least(0)),
    _impl("log.cleaner.io.max.bytes.per.second", "double", 1.7976931348623157e308),
    _impl("log.cleaner.dedupe.buffer.size", "long", 128 * 1024 * 1024),
    _impl("log.cleaner.io.buffer.size", "int", 512 * 1024, at_least(0)),
    _impl("log.cleaner.io.buffer.load.factor", "double", 0.9),
    _impl("log.cleaner.backoff.ms", "long", 15000, at_least(0)),
    _impl("log.cleaner.min.cleanable.ratio", "double", 0.5, between(0, 1)),
    _impl("log.cleaner.delete.retention.ms", "long", 86400000, at_least(0)),
    _impl("log.cleaner.min.compaction.lag.ms", "long", 0, at_least(0)),
    _impl("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, at_least(1)),
    _known("log.roll.jitter.ms", "long", None,
           why="segments roll at segment.ms without jitter"),
    _known("log.roll.jitter.hours", "int", 0, at_least(0),
           why="segments roll at segment.ms without jitter"),
    _known("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, at_least(0),
           why="log start offsets are checkpointed with the recovery points"),
    _known("log.preallocate", "boolean", False,
           why="segment files grow as written (indexes are preallocated sparse)"),
    _known("log.message.format.version", "string", "3.0-IV1",
           why="kbroker writes RecordBatch v2 (magic 2) only"),
    _impl("log.message.timestamp.difference.max.ms", "long", LONG_MAX, at_least(0),
          doc="deprecated: the before/after bound when those keep their defaults"),
    _impl("log.message.timestamp.before.max.ms", "long", LONG_MAX, at_least(0)),
    _impl("log.message.timestamp.after.max.ms", "long", LONG_MAX, at_least(0)),
    _known("log.message.downconversion.enable", "boolean", True,
           why="kbroker writes RecordBatch v2 only and never down-converts"),
    _known("log.local.retention.ms", "long", -2),
    _known("log.local.retention.bytes", "long", -2),
    _known("log.initial.task.delay.ms", "long", 30000, at_least(0),
           why="retention and flush tasks start with the broker"),
    _known("remote.log.storage.system.enable", "boolean", False),
    # Kafka 3.9 keys of features kbroker has no counterpart for (KRaft, tiered storage, the KIP-848 and
    # share group protocols, delegation tokens, ...): accepted so a Kafka config file starts; the
    # reason logged for each is _why()'s.
    _known("alter.log.dirs.replication.quota.window.num", "int", 11, at_least(1),
           why="moves between log dirs are not throttled"),
    _known("alter.log.dirs.replication.quota.window.size.seconds", "int", 1, at_least(1),
           why="moves between log dirs are not throttled"),
    _known("broker.heartbeat.interval.ms", "int", 2000),
    _known("broker.session.timeout.ms", "int", 9000),
    _known("client.quota.callback.class", "class", None),
    _known("controller.quorum.append.linger.ms", "int", 25),
    _known("controller.quorum.bootstrap.servers", "list", []),
    _known("controller.quorum.election.backoff.max.ms", "int", 1000),
    _known("controller.quorum.election.timeout.ms", "int", 1000),
    _known("controller.quorum.fetch.timeout.ms", "int", 2000),
    _known("controller.quorum.request.timeout.ms", "int", 2000),
    _known("controller.quorum.retry.backoff.ms", "int", 20),
    _known("delegation.token.expiry.check.interval.ms", "long", 3600000, at_least(1)),
    _known("delegation.token.expiry.time.ms", "long", 86400000, at_least(1)),
    _known("delegation.token.master.key", "password", None),
    _known("delegation.token.max.lifetime.ms", "long", 604800000, at_least(1)),
    _known("delegation.token.secret.key", "password", None),
    _known("early.start.listeners", "string", None),
    _known("eligible.leader.replicas.enable", "boolean", False),
    _known("group.consumer.assignors", "list", ["org.apache.kafka.coordinator.group.assignor.UniformAssignor", "org.apache.kafka.coordinator.group.assignor.RangeAssignor"]),
    _known("group.consumer.heartbeat.interval.ms", "int", 5000, at_least(1)),
    _known("group.consumer.max.heartbeat.interval.ms", "int", 15000, at_least(1)),
    _known("group.consumer.max.session.timeout.ms", "int", 60000, at_least(1)),
    _known("group.consumer.max.size", "int", INT_MAX, at_least(1)),
    _known("group.consumer.migration.policy", "string", "disabled",
           one_of("disabled", "upgrade", "downgrade", "bidirectional", case_sensitive=False)),
    _known("group.consumer.min.heartbeat.interval.ms", "int", 5000, at_least(1)),
    _known("group.consumer.min.session.timeout.ms", "int", 45000, at_least(1)),
    _known("group.consumer.session.timeout.ms", "int", 45000, at_least(1)),
    _known("group.coordinator.append.linger.ms", "int", 10, at_least(0)),
    _known("group.coordinator.new.enable", "boolean", False),
    _known("group.coordinator.threads", "int", 1, at_least(1)),
    _known("group.share.delivery.count.limit", "int", 5, between(2, 10)),
    _known("group.share.enable", "boolean", False),
    _known("group.share.heartbeat.interval.ms", "int", 5000, at_least(1)),
    _known("group.share.max.groups", "short", 10, between(1, 100)),
    _known("group.share.max.heartbeat.interval.ms", "int", 15000, at_least(1)),
    _known("group.share.max.record.lock.duration.ms", "int", 60000, between(30000, 3600000)),
    _known("group.share.max.session.timeout.ms", "int", 60000, at_least(1)),
    _known("group.share.max.size", "short", 200, between(10, 1000)),
    _known("group.share.min.heartbeat.interval.ms", "int", 5000, at_least(1)),
    _known("group.share.min.record.lock.duration.ms", "int", 15000, between(1000, 30000)),
    _known("group.share.min.session.timeout.ms", "int", 45000, at_least(1)),
    _known("group.share.partition.max.record.locks", "int", 200, between(100, 10000)),
    _known("group.share.record.lock.duration.ms", "int", 30000, between(1000, 60000)),
    _known("group.share.session.timeout.ms", "int", 45000, at_least(1)),
    _known("initial.broker.registration.timeout.ms", "int", 60000),
    _known("log.dir.failure.timeout.ms", "long", 30000, at_least(1),
           why="a KRaft setting; kbroker runs in ZooKeeper mode"),
    _known("max.request.partition.size.limit", "int", 2000, at_least(1),
           why="a share-fetch setting; share groups (KIP-932) are not implemented"),
    _known("metadata.log.max.record.bytes.between.snapshots", "long", 20971520, at_least(1)),
    _known("metadata.log.max.snapshot.interval.ms", "long", 3600000, at_least(0)),
    _known("metadata.log.segment.bytes", "int", 1073741824, at_least(12)),
    _known("metadata.log.segment.min.bytes", "int", 8388608, at_least(12)),
    _known("metadata.log.segment.ms", "long", 604800000),
    _known("metadata.max.idle.interval.ms", "int", 500, at_least(0)),
    _known("metadata.max.retention.bytes", "long", 104857600),
    _known("metadata.max.retention.ms", "long", 604800000),
    _known("password.encoder.cipher.algorithm", "string", "AES/CBC/PKCS5Padding"),
    # --- dynamic password configs (kbroker/security/passwords.py): the keystore passwords of a reload ---
    _impl("password.encoder.iterations", "int", 4096, at_least(1024)),
    _impl("password.encoder.key.length", "int", 128, at_least(8)),
    _known("password.encoder.keyfactory.algorithm", "string", None),
    _known("password.encoder.old.secret", "password", None),
    _impl("password.encoder.secret", "password", None,
          doc="encrypts password configs stored in /config/brokers/<id> (a keystore password set by AlterConfigs)"),
    _known("remote.fetch.max.wait.ms", "int", 500, at_least(1)),
    _known("remote.log.index.file.cache.total.size.bytes", "long", 1073741824, at_least(1)),
    _known("remote.log.manager.copier.thread.pool.size", "int", -1),
    _known("remote.log.manager.copy.max.bytes.per.second", "long", LONG_MAX, at_least(1)),
    _known("remote.log.manager.copy.quota.window.num", "int", 11, at_least(1)),
    _known("remote.log.manager.copy.quota.window.size.seconds", "int", 1, at_least(1)),
    _known("remote.log.manager.expiration.thread.pool.size", "int", -1),
    _known("remote.log.manager.fetch.max.bytes.per.second", "long", LONG_MAX, at_least(1)),
    _known("remote.log.manager.fetch.quota.window.num", "int", 11, at_least(1)),
    _known("remote.log.manager.fetch.quota.window.size.seconds", "int", 1, at_least(1)),
    _known("remote.log.manager.task.interval.ms", "long", 30000, at_least(1)),
    _known("remote.log.manager.task.retry.backoff.max.ms", "long", 30000, at_least(1)),
    _known("remote.log.manager.task.retry.backoff.ms", "long", 500, at_least(1)),
    _known("remote.log.manager.task.retry.jitter", "double", 0.2, between(0, 0.5)),
    _known("remote.log.manager.thread.pool.size", "int", 10, at_least(1)),
    _known("remote.log.metadata.custom.metadata.max.bytes", "int", 128, at_least(0)),
    _known("remote.log.metadata.manager.class.name", "string", "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"),
    _known("remote.log.metadata.manager.class.path", "string", None),
    _known("remote.log.metadata.manager.impl.prefix", "string", "rlmm.config."),
    _known("remote.log.metadata.manager.listener.name", "string", None),
    _known("remote.log.reader.max.pending.tasks", "int", 100, at_least(1)),
    _known("remote.log.reader.threads", "int", 10, at_least(1)),
    _known("remote.log.storage.manager.class.name", "string", None),
    _known("remote.log.storage.manager.class.path", "string", None),
    _known("remote.log.storage.manager.impl.prefix", "string", "rsm.config."),
    _known("server.max.startup.time.ms", "long", LONG_MAX, at_least(0)),
    _known("socket.connection.setup.timeout.max.ms", "long", 30000,
           why="inter-broker connections use their own connect timeouts"),
    _known("socket.connection.setup.timeout.ms", "long", 10000,
           why="inter-broker connections use their own connect timeouts"),
    _known("telemetry.max.bytes", "int", 1048576, at_least(1)),
    _known("unclean.leader.election.interval.ms", "long", 300000, at_least(1),
           why="a KRaft controller setting; the ZooKeeper controller elects when a partition loses its leader"),
    _known("unstable.feature.versions.enable", "boolean", False),
    _known("zookeeper.metadata.migration.min.batch.size", "int", 200, at_least(1)),
    _impl("offsets.topic.num.partitions", "int", 50, at_least(1)),
    _impl("offsets.topic.segment.bytes", "int", 100 * 1024 * 1024, at_least(1)),
    _known("offsets.topic.compression.codec", "int", 0,
           why="offset commits are written uncompressed"),
    _impl("offsets.retention.minutes", "int", 7 * 24 * 60, at_least(1)),
    _impl("offsets.retention.check.interval.ms", "long", 600000, at_least(1)),
    _impl("offsets.commit.timeout.ms", "int", 5000, at_least(1)),
    _known("offsets.commit.required.acks", "short", -1,
           why="offset commits wait for every in-sync replica, as Kafka's default"),
    _impl("offsets.load.buffer.size", "int", 5 * 1024 * 1024, at_least(1)),
    _impl("offset.metadata.max.bytes", "int", 4096),
    _impl("group.min.session.timeout.ms", "int", 6000),
    _impl("group.max.session.timeout.ms", "int", 1800000),
    _impl("group.max.size", "int", INT_MAX, at_least(1)),
    _known("group.coordinator.rebalance.protocols", "list", ["classic"]),
    _impl("transaction.state.log.num.partitions", "int", 50, at_least(1)),
    _impl("transaction.state.log.segment.bytes", "int", 100 * 1024 * 1024, at_least(1)),
    _impl("transaction.state.log.load.buffer.size", "int", 5 * 1024 * 1024, at_least(1)),
    _impl("transactional.id.expiration.ms", "int", 604800000, at_least(1)),
    _impl("transaction.max.timeout.ms", "int", 900000, at_least(1)),
    _impl("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000, at_least(1)),
    _impl("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000, at_least(1)),
    _impl("transaction.partition.verification.enable", "boolean", True),
    _known("producer.id.expiration.ms", "int", 86400000, at_least(1),
           why="idempotent producers' state is kept until the log no longer holds their batches"),
    _known("producer.id.expiration.check.interval.ms", "int", 600000, at_least(1),
           why="idempotent producers' state is kept until the log no longer holds their batches"),
    # fetch sessions (KIP-227, server/fetch_sessions.py): how many the broker keeps at once
    _impl("max.incremental.fetch.session.cache.slots", "int", 1000, at_least(0)),
    _known("metric.reporters", "list", []),
    _known("metrics.num.samples", "int", 2, at_least(1)),
    _known("metrics.sample.window.ms", "long", 30000, at_least(1)),
    _known("metrics.recording.level", "string", "INFO"),
    _known("kafka.metrics.reporters", "list", []),
    _known("kafka.metrics.polling.interval.secs", "int", 10, at_least(1)),
    _known("auto.include.jmx.reporter", "boolean", True),
    # authorization (kbroker/security/authorizer.py): the AclAuthorizer, or none (empty)
    _impl("authorizer.class.name", "string", "",
          one_of("", "kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer")),
    _impl("super.users", "string", None),
    _impl("allow.everyone.if.no.acl.found", "boolean", False),
    _impl("zookeeper.set.acl", "boolean", False,
          doc="znodes a broker makes are changed only by its ZooKeeper identity: the TLS client certificate "
              "(zookeeper.ssl.keystore.location) or kbroker.zookeeper.digest.credentials"),
    # --- ZooKeeper client TLS (zk/client.py kazoo_tls): kazoo reads PEM files only ---
    _impl("zookeeper.ssl.client.enable", "boolean", False, doc="connect to ZooKeeper's secureClientPort over TLS"),
    _impl("zookeeper.clientCnxnSocket", "string", None,
          doc="org.apache.zookeeper.ClientCnxnSocketNetty (Kafka's required value with TLS) or unset"),
    _impl("zookeeper.ssl.keystore.location", "string", None, doc="PEM: the client's key and certificate chain"),
    _impl("zookeeper.ssl.keystore.password", "password", None, doc="decrypts the keystore's PEM key"),
    _impl("zookeeper.ssl.keystore.type", "string", None, doc="PEM (unset: from the file name)"),
    _impl("zookeeper.ssl.truststore.location", "string", None, doc="PEM: the CA certificates that verify ZooKeeper's"),
    _known("zookeeper.ssl.truststore.password", "password", None,
           why="kbroker's ZooKeeper truststore is a PEM file, which has no password"),
    _impl("zookeeper.ssl.truststore.type", "string", None, doc="PEM (unset: from the file name)"),
    # controller_mutation_rate (KIP-599, kbroker/security/quotas.py): the token bucket holds this many windows' worth
    _impl("controller.quota.window.num", "int", 11, at_least(1)),
    _impl("controller.quota.window.size.seconds", "int", 1, at_least(1)),
    # KIP-612 (kbroker/security/connection_quotas.py): new connections per second on every listener but the
    # inter-broker one (unless it is the only one); over it accepting waits (listen backlog)
    _impl("max.connection.creation.rate", "int", INT_MAX, at_least(0)),
    # a reloaded keystore's certificate against the one it replaces (kbroker/security/tlsreload.py)
    _impl("ssl.allow.dn.changes", "boolean", False,
          doc="a reloaded keystore may change the certificate's subject (per listener as the other ssl keys)"),
    _impl("ssl.allow.san.changes", "boolean", False,
          doc="a reloaded keystore may drop SubjectAltNames of the certificate it replaces"),
    _impl("zookeeper.ssl.endpoint.identification.algorithm", "string", "HTTPS",
          doc="HTTPS: ZooKeeper's TLS certificate must name the host connected to; empty: not checked"),
    # Kafka secures ZooKeeper through SASL (a JAAS Client section); Debian's ZooKeeper started by our
    # scripts has no SASL set up, so brokers authenticate with ZooKeeper's digest scheme instead.
    _impl("kbroker.zookeeper.digest.credentials", "password", None),
    _known("principal.builder.class", "class", None),
    _known("create.topic.policy.class.name", "class", None),
    _known("alter.config.policy.class.name", "class", None),
    _known("unstable.api.versions.enable", "boolean", False,
           why="kbroker offers only the API versions it implements"),
    _known("zookeeper.max.in.flight.requests", "int", 10, at_least(1),
           why="the ZooKeeper client does not limit requests in flight"),
    _known("zookeeper.sync.time.ms", "int", 2000,
           why="not used by Kafka 3.9 either"),
    _known("zookeeper.metadata.migration.enable", "boolean", False),
    _known("process.roles", "list", []),
    _known("node.id", "int", -1),
    _known("controller.quorum.voters", "list", []),
    _known("controller.listener.names", "string", None),
    _known("metadata.log.dir", "string", None),
    _known("sasl.kerberos.service.name", "string", None),
    _known("sasl.jaas.config", "password", None),
)


# --------------------------------------------------------------------------------------------------
# Topic-level configs: Kafka's topic key names, each with the broker key whose value is its default.

@dataclass(frozen=True)
class TopicConfigKey:
    name: str
    type: str
    default: Any            # Kafka's default for a broker with every default
    validator: Validator | None = None
    implemented: bool = False
    synonyms: tuple[str, ...] = ()   # broker keys in precedence order (DescribeConfigs synonyms)

    def parse(self, text: str) -> Any:
        value = parse_value(self.name, self.type, text)
        if self.validator is not None:
            self.validator(self.name, value)
        return value


def _topic(name, type_, default, validator=None, synonyms=(), implemented=True) -> TopicConfigKey:
    return TopicConfigKey(name, type_, default, validator, implemented, tuple(synonyms))


_WEEK_MS = 7 * 24 * 3600 * 1000

TOPIC_CONFIGS: dict[str, TopicConfigKey] = {k.name: k for k in (
    _topic("segment.bytes", "int", 1024**3, at_least(MIN_SEGMENT_BYTES), ["log.segment.bytes"]),
    _topic("segment.ms", "long", _WEEK_MS, at_least(1), ["log.roll.ms", "log.roll.hours"]),
    _topic("retention.ms", "long", _WEEK_MS, at_least(-1),
           ["log.retention.ms", "log.retention.minutes", "log.retention.hours"]),
    _topic("retention.bytes", "long", -1, None, ["log.retention.bytes"]),
    _topic("max.message.bytes", "int", 1024 * 1024 + 12, at_least(0), ["message.max.bytes"]),
    _topic("message.timestamp.type", "string", "CreateTime", one_of(*TIMESTAMP_TYPES),
           ["log.message.timestamp.type"]),
    _topic("index.interval.bytes", "int", 4096, at_least(0), ["log.index.interval.bytes"]),
    _topic("segment.index.bytes", "int", 10 * 1024 * 1024, at_least(4), ["log.index.size.max.bytes"]),
    _topic("flush.messages", "long", LONG_MAX, at_least(1), ["log.flush.interval.messages"]),
    _topic("flush.ms", "long", LONG_MAX, at_least(0),
           ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"]),
    _topic("min.insync.replicas", "int", 1, at_least(1), ["min.insync.replicas"]),
    _topic("cleanup.policy", "list", ["delete"], list_of(*CLEANUP_POLICIES), ["log.cleanup.policy"]),
    _topic("unclean.leader.election.enable", "boolean", False, None, ["unclean.leader.election.enable"]),
    _topic("leader.replication.throttled.replicas", "list", [], throttled_replicas),
    _topic("follower.replication.throttled.replicas", "list", [], throttled_replicas),
    # Known topic keys kbroker does not act on yet; accepted and stored so tools round-trip them.
    _topic("segment.jitter.ms", "long", 0, at_least(0), ["log.roll.jitter.ms", "log.roll.jitter.hours"], False),
    _topic("delete.retention.ms", "long", 86400000, at_least(0), ["log.cleaner.delete.retention.ms"]),
    _topic("min.compaction.lag.ms", "long", 0, at_least(0), ["log.cleaner.min.compaction.lag.ms"]),
    _topic("max.compaction.lag.ms", "long", LONG_MAX, at_least(1), ["log.cleaner.max.compaction.lag.ms"]),
    _topic("min.cleanable.dirty.ratio", "double", 0.5, between(0, 1), ["log.cleaner.min.cleanable.ratio"]),
    _topic("file.delete.delay.ms", "long", 60000, at_least(0), ["log.segment.delete.delay.ms"]),
    _topic("compression.type", "string", "producer", one_of(*COMPRESSION_TYPES, case_sensitive=False),
           ["compression.type"]),
    _topic("compression.gzip.level", "int", -1, None, ["compression.gzip.level"], False),
    _topic("compression.lz4.level", "int", 9, None, ["compression.lz4.level"], False),
    _topic("compression.zstd.level", "int", 3, None, ["compression.zstd.level"], False),
    _topic("preallocate", "boolean", False, None, ["log.preallocate"], False),
    _topic("message.format.version", "string", "3.0-IV1", None, ["log.message.format.version"], False),
    _topic("message.timestamp.difference.max.ms", "long", LONG_MAX, at_least(0),
           ["log.message.timestamp.difference.max.ms"]),
    _topic("message.timestamp.before.max.ms", "long", LONG_MAX, at_least(0),
           ["log.message.timestamp.before.max.ms"]),
    _topic("message.timestamp.after.max.ms", "long", LONG_MAX, at_least(0),
           ["log.message.timestamp.after.max.ms"]),
    _topic("message.downconversion.enable", "boolean", True, None, ["log.message.downconversion.enable"], False),
    _topic("local.retention.ms", "long", -2, None, ["log.local.retention.ms"], False),
    _topic("local.retention.bytes", "long", -2, None, ["log.local.retention.bytes"], False),
    _topic("remote.storage.enable", "boolean", False, None, (), False),
)}


# Broker synonyms of topic keys in another unit: the multiplier to the topic key's milliseconds.
SYNONYM_UNITS = {"log.roll.hours": 3600 * 1000, "log.retention.minutes": 60 * 1000,
                 "log.retention.hours": 3600 * 1000, "log.roll.jitter.hours": 3600 * 1000}


def broker_synonym_value(topic_key: str, lookup: Callable[[str], Any]) -> Any:
    """The value the broker keys give ``topic_key``, in the topic key's unit, or None.

    ``lookup(broker_key)`` returns the broker's value for a key or None when it has none. The
    synonyms are tried in precedence order (ms over minutes over hours, as Kafka) and the first
    present one wins; a value in a coarser unit (a number or its text) is scaled to milliseconds."""
    for syn in TOPIC_CONFIGS[topic_key].synonyms:
        value = lookup(syn)
        if value is not None:
            unit = SYNONYM_UNITS.get(syn, 1)
            return int(value) * unit if unit != 1 else value
    return None


def parse_topic_config(key: str, text: str) -> Any:
    """Validate one topic config (CreateTopics / AlterConfigs); ConfigError → INVALID_CONFIG."""
    spec = TOPIC_CONFIGS.get(key)
    if spec is None:
        raise ConfigError(f"Unknown topic config name: {key}", key)
    return spec.parse(text)


# --------------------------------------------------------------------------------------------------
# Listeners.

_ENDPOINT = re.compile(r"^([^:/]+)://\[?([0-9A-Za-z\-%._:]*?)\]?:(-?[0-9]+)$")


@dataclass(frozen=True)
class Endpoint:
    listener_name: str       # upper-cased, e.g. PLAINTEXT
    security_protocol: str
    host: str                # "" = every interface (listeners only)
    port: int                # 0 = any free port (listeners only)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


def _protocol_map(text: str) -> dict[str, str]:
    key = "listener.security.protocol.map"
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, proto = item.partition(":")
        name, proto = name.strip().upper(), proto.strip().upper()
        if not sep or not name:
            raise _invalid(key, text, f"Expected LISTENER_NAME:SECURITY_PROTOCOL, got '{item}'")
        if proto not in SECURITY_PROTOCOLS:
            raise _invalid(key, text, f"Unknown security protocol {proto} for listener {name}")
        out[name] = proto
    return out


def _parse_listeners(key: str, text: str, protocol_map: Mapping[str, str]) -> list[Endpoint]:
    endpoints: list[Endpoint] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        m = _ENDPOINT.match(item)
        if not m:
            raise _invalid(key, text, f"Unable to parse {item} to a broker endpoint")
        name, host, port = m.group(1).upper(), m.group(2), int(m.group(3))
        if not 0 <= port <= 65535:
            raise _invalid(key, text, f"Port {port} of {item} is not in [0, 65535]")
        proto = protocol_map.get(name)
        if proto is None:
            raise _invalid(key, text, f"No security protocol defined for listener {name} "
                                      f"(see listener.security.protocol.map)")
        if any(e.listener_name == name for e in endpoints):
            raise _invalid(key, text, f"Each listener must have a different name, {name} is repeated")
        endpoints.append(Endpoint(name, proto, host, port))
    if not endpoints:
        raise _invalid(key, text, "At least one listener is required")
    return endpoints


# --------------------------------------------------------------------------------------------------
# The .properties format (java.util.Properties): `k=v`, `k:v` or `k v`; `#`/`!` comments; a trailing
# backslash continues the line; backslash escapes (\t \n \uXXXX \= \: ...).

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, line = i + 1, lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        # An odd number of trailing backslashes continues onto the next line.
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            line = line[:-1] + (lines[i].lstrip() if i < len(lines) else "")
            i += 1
        yield start, line


def _unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", s[i + 2:i + 6]):
                out.append(chr(int(s[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """Parse java .properties text into {key: raw value}; a later duplicate wins, as in Java."""
    props: dict[str, str] = {}
    for _, line in _logical_lines(text):
        i, n = 0, len(line)
        while i < n and line[i] not in "=: \t\f":
            i += 2 if line[i] == "\\" else 1
        key, rest = line[:i], line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        props[_unescape(key)] = _unescape(rest)
    return props


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"Invalid override '{pair}': expected key=value")
        out[key.strip()] = value
    return out


# --------------------------------------------------------------------------------------------------

class BrokerConfig:
    """An immutable, validated broker config. Build with :meth:`from_file`/:meth:`from_text`/:meth:`from_dict`."""

    def __init__(self, props: Mapping[str, str], source: str = "<config>"):
        self.source = source
        self.originals: dict[str, str] = dict(props)   # what the user set, as text
        self.warnings: list[str] = []
        self._values: dict[str, Any] = {k: spec.default for k, spec in BROKER_CONFIGS.items()}
        self._listener_values: dict[tuple[str, str], Any] = {}   # (LISTENER, key) -> typed override
        for key, text in self.originals.items():
            spec = BROKER_CONFIGS.get(key)
            if spec is None and key.startswith(LISTENER_PREFIX):
                self._listener_override(key, text)
                continue
            if spec is None:
                raise ConfigError(_unknown_key_message(key), key)
            self._values[key] = spec.parse(text)
            if not spec.implemented:
                shown = "[hidden]" if spec.type == "password" else text.strip()
                msg = f"The configuration {key} = {shown} is accepted, no effect in kbroker: {_why(spec)}"
                self.warnings.append(msg)
                log.warning(msg)
        self._check_and_derive()

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, props: Mapping[str, Any], source: str = "<dict>") -> BrokerConfig:
        return cls({k: format_value(v) if not isinstance(v, str) else v for k, v in props.items()}, source)

    @classmethod
    def from_text(cls, text: str, overrides: Iterable[str] | Mapping[str, str] = (),
                  source: str = "<text>") -> BrokerConfig:
        props = parse_properties(text)
        props.update(overrides if isinstance(overrides, Mapping) else parse_overrides(overrides))
        return cls(props, source)

    @classmethod
    def from_file(cls, path: str | Path, overrides: Iterable[str] | Mapping[str, str] = ()) -> BrokerConfig:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"Cannot read config file {path}: {e.strerror}") from None
        return cls.from_text(text, overrides, source=str(path))

    # -- raw access ------------------------------------------------------------------------------
    @property
    def values(self) -> dict[str, Any]:
        """Every known key's typed value: the config's own dict, to read and never write (the native
        Fetch path holds it and reads fetch.max.bytes per request without a method call)."""
        return self._values

    def get(self, key: str) -> Any:
        """The typed value of a known broker key (Kafka's default when unset; None if Kafka has none)."""
        try:
            return self._values[key]
        except KeyError:
            raise KeyError(f"{key} is not a known broker config") from None

    def _typed(self, key: str, types: tuple[str, ...]) -> Any:
        spec = BROKER_CONFIGS[key]
        if spec.type not in types:
            raise TypeError(f"{key} is of type {spec.type.upper()}, not {'/'.join(types)}")
        return self._values[key]

    def get_int(self, key: str) -> int | None:
        return self._typed(key, ("int", "short", "long"))

    def get_bool(self, key: str) -> bool:
        return self._typed(key, ("boolean",))

    def get_str(self, key: str) -> str | None:
        return self._typed(key, ("string", "password", "class"))

    def get_list(self, key: str) -> list[str]:
        return self._typed(key, ("list",))

    def is_set(self, key: str) -> bool:
        """True when the user set the key (DescribeConfigs: STATIC_BROKER_CONFIG vs DEFAULT_CONFIG)."""
        return key in self.originals

    # -- per-listener values (listener.name.<listener>.<key>) -------------------------------------
    def _listener_override(self, key: str, text: str) -> None:
        listener, _, base = key[len(LISTENER_PREFIX):].partition(".")
        spec = BROKER_CONFIGS.get(base)
        if spec is None:
            # SASL keys per mechanism, as Kafka: listener.name.<l>.<mechanism>.sasl.jaas.config
            mech, _, rest = base.partition(".")
            spec = BROKER_CONFIGS.get(rest) if mech and rest.startswith("sasl.") else None
        if not listener or spec is None:
            raise ConfigError(_unknown_key_message(key), key)
        self._listener_values[(listener.upper(), base)] = ConfigKey(key, spec.type, None, spec.validator).parse(text)

    def listener_get(self, listener: str, key: str) -> Any:
        """``key`` for one listener: ``listener.name.<listener>.<key>`` when set (Kafka's per-listener
        override, the listener name in lower case), else the broker-wide value. ``key`` may also be
        ``<mechanism>.sasl.jaas.config``, which has no broker-wide value."""
        found = self._listener_values.get((listener.upper(), key), _MISSING)
        if found is not _MISSING:
            return found
        return self._values.get(key)

    def listener_overrides(self, listener: str) -> dict[str, Any]:
        """Every ``listener.name.<listener>.*`` key set, by its base key."""
        name = listener.upper()
        return {k: v for (l, k), v in self._listener_values.items() if l == name}

    @property
    def inter_broker_listener(self) -> Endpoint:
        """The advertised endpoint brokers use to reach this one (replication, controller channel)."""
        return self._inter_broker

    # -- derived values --------------------------------------------------------------------------
    @property
    def broker_id(self) -> int:
        return self._values["broker.id"]

    @property
    def log_dirs(self) -> list[str]:
        return self._log_dirs

    @property
    def listeners(self) -> list[Endpoint]:
        """Where to bind; host "" means every interface, port 0 any free port."""
        return self._listeners

    @property
    def advertised_listeners(self) -> list[Endpoint]:
        """What Metadata and the /brokers/ids registration publish."""
        return self._advertised

    @property
    def zookeeper_connect(self) -> str:
        return self._values["zookeeper.connect"]

    @property
    def zookeeper_session_timeout_ms(self) -> int:
        return self._values["zookeeper.session.timeout.ms"]

    @property
    def zookeeper_connection_timeout_ms(self) -> int:
        v = self._values["zookeeper.connection.timeout.ms"]
        return self.zookeeper_session_timeout_ms if v is None else v

    @property
    def log_retention_ms(self) -> int:
        """ms > minutes > hours, as Kafka; any negative result means no time limit (-1)."""
        ms = broker_synonym_value("retention.ms", self._values.get)
        return -1 if ms < 0 else ms

    @property
    def log_roll_ms(self) -> int:
        return broker_synonym_value("segment.ms", self._values.get)

    @property
    def log_flush_interval_ms(self) -> int:
        return broker_synonym_value("flush.ms", self._values.get)

    @property
    def metrics_port(self) -> int:
        return self._values["kbroker.metrics.port"]

    @property
    def event_loop(self) -> str:
        """The config's kbroker.event.loop, else $KBROKER_EVENT_LOOP, else the default ("uvloop")."""
        return self._values[EVENT_LOOP_KEY]

    def topic_defaults(self) -> dict[str, Any]:
        """The default topic config this broker applies, keyed by Kafka's topic key names."""
        v = self._values
        return {
            "segment.bytes": v["log.segment.bytes"],
            "segment.ms": self.log_roll_ms,
            "retention.ms": self.log_retention_ms,
            "retention.bytes": v["log.retention.bytes"],
            "max.message.bytes": v["message.max.bytes"],
            "message.timestamp.type": v["log.message.timestamp.type"],
            "index.interval.bytes": v["log.index.interval.bytes"],
            "segment.index.bytes": v["log.index.size.max.bytes"],
            "flush.messages": v["log.flush.interval.messages"],
            "flush.ms": self.log_flush_interval_ms,
            "min.insync.replicas": v["min.insync.replicas"],
            "cleanup.policy": list(v["log.cleanup.policy"]),
            "delete.retention.ms": v["log.cleaner.delete.retention.ms"],
            "min.compaction.lag.ms": v["log.cleaner.min.compaction.lag.ms"],
            "max.compaction.lag.ms": v["log.cleaner.max.compaction.lag.ms"],
            "min.cleanable.dirty.ratio": v["log.cleaner.min.cleanable.ratio"],
            "unclean.leader.election.enable": v["unclean.leader.election.enable"],
            "file.delete.delay.ms": v["log.segment.delete.delay.ms"],
            "compression.type": v["compression.type"].lower(),
            "message.timestamp.difference.max.ms": v["log.message.timestamp.difference.max.ms"],
            "message.timestamp.before.max.ms": v["log.message.timestamp.before.max.ms"],
            "message.timestamp.after.max.ms": v["log.message.timestamp.after.max.ms"],
            # No broker synonym: the throttle reads them per topic (replica/throttle.py).
            "leader.replication.throttled.replicas": [],
            "follower.replication.throttled.replicas": [],
        }

    def cleaner_config(self) -> dict[str, Any]:
        """The log cleaner's broker keys (LogManager's cleaner_config)."""
        return {k: self._values[k] for k in (
            "log.cleaner.enable", "log.cleaner.threads", "log.cleaner.dedupe.buffer.size",
            "log.cleaner.io.buffer.size", "log.cleaner.io.buffer.load.factor", "log.cleaner.backoff.ms",
            "log.cleaner.io.max.bytes.per.second")}

    def describe(self) -> list[str]:
        """`key = value` lines for every known key (passwords hidden), for the start-up log."""
        out = []
        for key in sorted(BROKER_CONFIGS):
            spec, value = BROKER_CONFIGS[key], self._values[key]
            shown = "[hidden]" if spec.type == "password" and value is not None else format_value(value)
            out.append(f"{key} = {shown}")
        return out

    # -- cross-key checks ------------------------------------------------------------------------
    def _check_and_derive(self) -> None:
        v = self._values
        env_loop = switches.current.event_loop
        if EVENT_LOOP_KEY not in self.originals and env_loop is not None:
            try:
                v[EVENT_LOOP_KEY] = BROKER_CONFIGS[EVENT_LOOP_KEY].parse(env_loop)
            except ConfigError as e:
                raise ConfigError(f"{e} (set by the environment variable {EVENT_LOOP_ENV})", EVENT_LOOP_KEY) from None
        if not v["zookeeper.connect"]:
            raise ConfigError("Missing required configuration zookeeper.connect which has no default value.",
                              "zookeeper.connect")
        max_id = v["reserved.broker.max.id"]
        if not -1 <= v["broker.id"] <= max_id:
            raise _invalid("broker.id", v["broker.id"],
                           f"broker.id must be at least -1 and not greater than reserved.broker.max.id ({max_id})")

        dirs_text = v["log.dirs"] if v["log.dirs"] is not None else v["log.dir"]
        self._log_dirs = [d.strip() for d in dirs_text.split(",") if d.strip()]
        if not self._log_dirs:
            raise _invalid("log.dirs", dirs_text, "At least one log directory is required")

        protocols = _protocol_map(v["listener.security.protocol.map"])
        self._listeners = _parse_listeners("listeners", v["listeners"], protocols)
        if v["advertised.listeners"] is not None:
            advertised = _parse_listeners("advertised.listeners", v["advertised.listeners"], protocols)
            bound = {e.listener_name for e in self._listeners}
            for e in advertised:
                if e.listener_name not in bound:
                    raise _invalid("advertised.listeners", v["advertised.listeners"],
                                   f"Listener {e.listener_name} is not defined in listeners")
                if e.host == "0.0.0.0":
                    raise _invalid("advertised.listeners", v["advertised.listeners"],
                                   "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. "
                                   "Use a routable IP address.")
            self._advertised = advertised
        else:
            # Like Kafka, an empty host is advertised as this machine's name. Kafka refuses a
            # 0.0.0.0 listener without advertised.listeners; we advertise the name there too, as an
            # unset advertised.listeners would otherwise make that a common start-up failure.
            fqdn = socket.getfqdn()
            self._advertised = [
                Endpoint(e.listener_name, e.security_protocol, fqdn, e.port) if e.host in ("", "0.0.0.0") else e
                for e in self._listeners
            ]
        self._inter_broker = _inter_broker_listener(self.originals, v, self._advertised)


LISTENER_PREFIX = "listener.name."
_MISSING = object()


def _inter_broker_listener(originals, v, advertised: list[Endpoint]) -> Endpoint:
    """Kafka's rule: inter.broker.listener.name, else the listener named as
    security.inter.broker.protocol; never both; it must be an advertised listener."""
    name = v["inter.broker.listener.name"]
    if name is not None and "security.inter.broker.protocol" in originals:
        raise ConfigError("Only one of inter.broker.listener.name and security.inter.broker.protocol "
                          "should be set.", "inter.broker.listener.name")
    key = "inter.broker.listener.name" if name is not None else "security.inter.broker.protocol"
    name = (name if name is not None else v["security.inter.broker.protocol"]).strip().upper()
    found = next((e for e in advertised if e.listener_name == name), None)
    if found is None:
        raise _invalid(key, name, f"{key} must be a listener name defined in advertised.listeners. "
                                  f"The valid options based on currently configured listeners are "
                                  f"{','.join(e.listener_name for e in advertised)}")
    return found


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, BROKER_CONFIGS, n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"Unknown configuration {key}: not a Kafka broker config known to kbroker{hint}"
