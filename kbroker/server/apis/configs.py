"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

Topic configs live in ZooKeeper (``/config/topics/<t>``, overrides only); a topic's effective value
is its override, else the broker's default for it (``server.properties`` synonyms, else Kafka's
default).

Broker configs as Kafka's ZooKeeper mode keeps them (kafka-configs.sh --entity-type brokers): a key's
value is /config/brokers/<id> (DYNAMIC_BROKER_CONFIG), else /config/brokers/<default>
(DYNAMIC_DEFAULT_BROKER_CONFIG), else server.properties (STATIC_BROKER_CONFIG), else Kafka's default.
Only the keys kbroker follows at runtime can be altered: DYNAMIC_BROKER_KEYS (the replication throttle
rates, replica/throttle.py's watcher; max.connection.creation.rate, followed by apis/quotas.py through
that watcher), listener.name.<l>.max.connection.creation.rate (per broker or the default, as Kafka) and, per broker only, the TLS keystore and truststore keys
(security/tlsreload.py: validated by building the new contexts, then new TLS connections use them); the resource name is this broker's id or "" for the
cluster-wide default, and another broker's id is refused with INVALID_REQUEST, as Kafka does (its
clients send a broker resource to that broker).
"""
from __future__ import annotations

import asyncio
import logging

from ...network.connection import EncodeOffLoop
from ...config import (BROKER_CONFIGS, TOPIC_CONFIGS, ConfigError, broker_synonym_value, format_value,
                       parse_topic_config)
from ...protocol.errors import Errors
from ...replica.throttle import FOLLOWER_RATE, LEADER_RATE
from ...security import tlsreload
from ...zk.layout import DEFAULT_BROKER_ENTITY
from ...zk.client import TopicNotFoundError
from ..metadata import topic_name_error
from .admin import AdminError, check_config_consistency
from .quotas import CONNECTION_RATE, is_listener_rate_key
from . import authz

log = logging.getLogger(__name__)

# Resource types (Kafka's ConfigResource.Type ids).
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
# DescribeConfigs config sources (Kafka's ConfigSource ids).
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
# Broker keys that AlterConfigs may set in /config/brokers: the ones kbroker applies while running
# (a key listed here must have a follower, or an altered value would be shown but never used).
DYNAMIC_BROKER_KEYS = frozenset({LEADER_RATE, FOLLOWER_RATE, CONNECTION_RATE})
# DescribeConfigs v3 config_type ids.
_CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7,
                 "class": 8, "password": 9}
# IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


# ---- DescribeConfigs (32) ------------------------------------------------------------------------

# A DescribeConfigs answer is built this many resources per event-loop turn: a topic resource is
# expensive (every topic key with its source and synonyms), so a request naming thousands of topics
# would otherwise hold the loop, and every other client, for seconds.
RESOURCES_PER_TURN = 20


def describe_configs(broker, conn, header, body):
    if len(body["resources"]) > RESOURCES_PER_TURN:
        return _describe_configs_sliced(broker, conn, header, body)
    return {"throttle_time_ms": 0, "results": [_describe_resource(broker, conn, header, body, r)
                                               for r in body["resources"]]}


async def _describe_configs_sliced(broker, conn, header, body):
    results = []
    for i, r in enumerate(body["resources"]):
        if i and i % RESOURCES_PER_TURN == 0:
            await asyncio.sleep(0)
        results.append(_describe_resource(broker, conn, header, body, r))
    return EncodeOffLoop({"throttle_time_ms": 0, "results": results})


def _authorize(broker, conn, rtype, name, op) -> None:
    """Kafka: a topic's configs need DescribeConfigs / AlterConfigs on the topic, a broker's on the cluster."""
    if rtype == TOPIC and not authz.allowed(broker, conn, op, authz.TOPIC, name):
        raise AdminError(Errors.TOPIC_AUTHORIZATION_FAILED, None)
    if rtype in (BROKER, BROKER_LOGGER) and not authz.cluster(broker, conn, op):
        raise AdminError(Errors.CLUSTER_AUTHORIZATION_FAILED, None)


def _describe_resource(broker, conn, header, body, r):
    version = header.api_version
    synonyms = bool(body.get("include_synonyms", False))
    docs = bool(body.get("include_documentation", False))
    rtype, name = r["resource_type"], r["resource_name"]
    res = {"error_code": 0, "error_message": None, "resource_type": rtype, "resource_name": name,
           "configs": []}
    try:
        _authorize(broker, conn, rtype, name, authz.DESCRIBE_CONFIGS)
        if rtype == TOPIC:
            entries = _topic_entries(broker, name)
        elif rtype == BROKER:
            entries = _broker_entries(broker, name)
        else:
            raise AdminError(Errors.INVALID_REQUEST, f"Unsupported resource type {rtype} for DescribeConfigs")
    except AdminError as e:
        res["error_code"], res["error_message"] = e.code, e.message
        return res
    wanted = r.get("configuration_keys")
    wanted = None if wanted is None else set(wanted)
    for e in entries:
        if wanted is not None and e["name"] not in wanted:
            continue
        e["is_default"] = e["config_source"] == DEFAULT_CONFIG   # v0's only notion of source
        if not synonyms or version < 1:
            # An empty tuple, not a new list: an entry holding only atomic values is untracked by the
            # garbage collector, so a 5,000-resource answer being built does not make full
            # collections scan ~200,000 entries on the loop (0.1-0.2 s pauses seen under load).
            e["synonyms"] = ()
        if not docs:
            e["documentation"] = None
        res["configs"].append(e)
    return res


def _entry(name, value, source, synonyms, type_, read_only=False, sensitive=False, doc=None):
    return {"name": name, "value": value, "read_only": read_only, "config_source": source,
            "is_sensitive": sensitive, "synonyms": synonyms, "config_type": _CONFIG_TYPES.get(type_, 0),
            "documentation": doc or None}


def _broker_synonyms(broker, keys) -> list[dict]:
    """Kafka's order: for each broker key in precedence order, its static value then its default."""
    cfg = broker.config
    out = []
    for key in keys:
        spec = BROKER_CONFIGS.get(key)
        if spec is None and is_listener_rate_key(key) and key in cfg.originals:
            listener = key[len("listener.name."):].partition(".")[0]
            out.append({"name": key, "value": format_value(cfg.listener_overrides(listener)[CONNECTION_RATE]),
                        "source": STATIC_BROKER_CONFIG})
        if spec is None:
            continue
        if cfg.is_set(key):
            out.append({"name": key, "value": format_value(cfg.get(key)), "source": STATIC_BROKER_CONFIG})
        if spec.default is not None:
            out.append({"name": key, "value": format_value(spec.default), "source": DEFAULT_CONFIG})
    return out


def topic_default(broker, key: str):
    """The typed value a topic without an override gets for ``key`` on this broker."""
    defaults = broker.config.topic_defaults()
    if key in defaults:
        return defaults[key]
    cfg = broker.config
    value = broker_synonym_value(key, lambda syn: cfg.get(syn) if syn in BROKER_CONFIGS and cfg.is_set(syn)
                                 else None)
    return TOPIC_CONFIGS[key].default if value is None else value


def _topic_entries(broker, name) -> list[dict]:
    bad = topic_name_error(name)
    if bad is not None:
        raise AdminError(Errors.INVALID_TOPIC_EXCEPTION, f"Topic name is illegal: {bad}")
    info = broker.metadata.topics.get(name)
    if info is None:
        raise AdminError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
    return topic_config_entries(broker, info.config)


def topic_config_entries(broker, overrides: dict[str, str]) -> list[dict]:
    """Every topic config of a topic with these overrides, as DescribeConfigs shows them."""
    out = []
    for key, spec in TOPIC_CONFIGS.items():
        syns = _broker_synonyms(broker, spec.synonyms)
        override = overrides.get(key)
        if override is not None:
            try:
                value = format_value(parse_topic_config(key, override))
            except ConfigError:
                value = override   # written by another tool; show it as stored
            syns.insert(0, {"name": key, "value": value, "source": DYNAMIC_TOPIC_CONFIG})
        else:
            value = format_value(topic_default(broker, key))
        source = syns[0]["source"] if syns else DEFAULT_CONFIG
        out.append(_entry(key, value, source, syns, spec.type))
    return out


def _broker_id_of(broker, name: str, describe: bool = True) -> None:
    try:
        bid = int(name)
    except ValueError:
        raise AdminError(Errors.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}") from None
    if bid != broker.broker_id:
        also = " or empty string" if describe else ""
        raise AdminError(Errors.INVALID_REQUEST,
                         f"Unexpected broker id, expected {broker.broker_id}{also}, but received {name}")


def _dynamic_configs(broker) -> tuple[dict[str, str], dict[str, str]]:
    """(/config/brokers/<id>, /config/brokers/<default>) as this broker last applied them."""
    rm = getattr(broker, "replica_manager", None)
    watcher = getattr(rm, "throttle_watcher", None)
    if watcher is None:
        return {}, {}
    return watcher.broker_configs, watcher.default_configs


def _shown(key: str, text: str) -> str:
    """A stored dynamic value as Kafka shows it (parsed and printed back; as stored if it is bad)."""
    spec = BROKER_CONFIGS.get(key)
    if spec is None:
        return text
    try:
        return format_value(spec.parse(text))
    except ConfigError:
        return text


def _broker_key_synonyms(broker, key, mine, default, per_broker: bool) -> list[dict]:
    """Kafka's synonym order for a broker key: per-broker dynamic, cluster default, static, default
    (the per-broker one left out when describing the cluster default)."""
    out = []
    if per_broker and key in mine:
        out.append({"name": key, "value": _shown(key, mine[key]), "source": DYNAMIC_BROKER_CONFIG})
    if key in default:
        out.append({"name": key, "value": _shown(key, default[key]), "source": DYNAMIC_DEFAULT_BROKER_CONFIG})
    return out + _broker_synonyms(broker, [key])


def _broker_entry(broker, key, mine, default, per_broker: bool) -> dict:
    spec = BROKER_CONFIGS.get(key)
    if spec is None and tlsreload.split(key) is not None:
        spec = BROKER_CONFIGS[tlsreload.split(key)[1]]   # listener.name.<l>.ssl.*: its base key's type
    elif spec is None and is_listener_rate_key(key):
        spec = BROKER_CONFIGS[CONNECTION_RATE]
    type_ = spec.type if spec is not None else "string"
    sensitive = type_ == "password"
    syns = _broker_key_synonyms(broker, key, mine, default, per_broker)
    if sensitive:
        for s in syns:
            s["value"] = None
    value = None if sensitive or not syns else syns[0]["value"]
    if value is None and not sensitive and spec is not None and spec.default is not None:
        value = format_value(spec.default)
    source = syns[0]["source"] if syns else DEFAULT_CONFIG
    return _entry(key, value, source, syns, type_,
                  read_only=not _dynamic_key(key),
                  sensitive=sensitive, doc=spec.doc if spec is not None else None)


def _broker_entries(broker, name) -> list[dict]:
    mine, default = _dynamic_configs(broker)
    if name == "":
        # The cluster-wide default resource lists only what /config/brokers/<default> sets.
        return [_broker_entry(broker, key, mine, default, per_broker=False) for key in sorted(default)]
    _broker_id_of(broker, name)
    # Kafka lists a broker's dynamic listener.name.<l>.* keys too (tools check them against this list), and
    # its static ones (originals)
    prefixed = sorted({k for k in mine if k not in BROKER_CONFIGS and tlsreload.split(k) is not None}
                      | {k for k in [*mine, *default, *_static_listener_rate_keys(broker)] if is_listener_rate_key(k)})
    return [_broker_entry(broker, key, mine, default, per_broker=True) for key in sorted(BROKER_CONFIGS) + prefixed]


def _dynamic_key(key: str) -> bool:
    return key in DYNAMIC_BROKER_KEYS or tlsreload.split(key) is not None or is_listener_rate_key(key)


def _static_listener_rate_keys(broker) -> list[str]:
    cfg = broker.config
    return [k for k in cfg.originals if is_listener_rate_key(k)]


# ---- AlterConfigs (33) and IncrementalAlterConfigs (44) ------------------------------------------

def _replace_plan(current: dict[str, str], entries: list[dict], kind: str) -> dict[str, str]:
    # Non-incremental: the request is the complete new override set (null values are dropped).
    return {c["name"]: c["value"] for c in entries if c["value"] is not None}


async def alter_configs(broker, conn, header, body):
    return await _alter(broker, conn, body, _replace_plan)


async def incremental_alter_configs(broker, conn, header, body):
    def plan(current: dict[str, str], entries: list[dict], kind: str) -> dict[str, str]:
        names = [c["name"] for c in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise AdminError(Errors.INVALID_REQUEST, f"Error due to duplicate config keys: {', '.join(dup)}")
        new = dict(current)
        for c in entries:
            key, op, value = c["name"], c["config_operation"], c["value"]
            if op not in (SET, DELETE, APPEND, SUBTRACT):
                raise AdminError(Errors.INVALID_REQUEST, f"Unknown config operation {op} for {key}")
            if op != DELETE and value is None:
                raise AdminError(Errors.INVALID_REQUEST, f"Null value not supported for : {key}")
            spec = TOPIC_CONFIGS.get(key) if kind == "topic" else BROKER_CONFIGS.get(key)
            if spec is None and (kind == "topic" or op in (APPEND, SUBTRACT)):
                raise AdminError(Errors.INVALID_CONFIG, f"Unknown {kind} config name: {key}")
            if op == SET:
                new[key] = value
            elif op == DELETE:
                new.pop(key, None)
            else:
                if spec.type != "list":
                    raise AdminError(Errors.INVALID_CONFIG,
                                     f"Config value {'append' if op == APPEND else 'subtract'} is not allowed "
                                     f"for config key: {key}")
                # Start from the effective list: the override, else what the topic gets by default.
                base = (spec.parse(new[key]) if key in new
                        else list(topic_default(broker, key) or []) if kind == "topic"
                        else list(broker.config.get(key) or []))
                items = [v.strip() for v in value.split(",") if v.strip()]
                if op == APPEND:
                    result = base + [v for v in items if v not in base]
                else:
                    result = [v for v in base if v not in items]
                new[key] = ",".join(result)
        return new
    return await _alter(broker, conn, body, plan)


async def _alter(broker, conn, body, plan):
    validate_only = bool(body.get("validate_only", False))
    responses = []
    names = [(r["resource_type"], r["resource_name"]) for r in body["resources"]]
    for r in body["resources"]:
        rtype, name = r["resource_type"], r["resource_name"]
        res = {"error_code": 0, "error_message": None, "resource_type": rtype, "resource_name": name}
        responses.append(res)
        try:
            if names.count((rtype, name)) > 1:
                raise AdminError(Errors.INVALID_REQUEST, f"Error due to duplicate resource {name} of type {rtype}")
            _authorize(broker, conn, rtype, name, authz.ALTER_CONFIGS)
            if rtype == BROKER:
                await _alter_broker(broker, name, r["configs"], plan, validate_only)
            elif rtype == TOPIC:
                await _alter_topic(broker, name, r["configs"], plan, validate_only)
            else:
                raise AdminError(Errors.INVALID_REQUEST, f"Unsupported resource type {rtype} for altering configs")
        except AdminError as e:
            res["error_code"], res["error_message"] = e.code, e.message
        except Exception as e:   # ZooKeeper trouble for one resource must not lose the others' answers
            log.exception("altering configs of %s failed", name)
            res["error_code"], res["error_message"] = Errors.UNKNOWN_SERVER_ERROR, f"Altering configs failed: {e}"
    return {"throttle_time_ms": 0, "responses": responses}


async def _alter_topic(broker, name, entries, plan, validate_only) -> None:
    bad = topic_name_error(name)
    if bad is not None:
        raise AdminError(Errors.INVALID_TOPIC_EXCEPTION, f"Topic name is illegal: {bad}")
    if name not in broker.metadata.topics:
        raise AdminError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
    # Read-modify-write against ZooKeeper itself, not the cache, so an incremental change applies
    # to the latest stored overrides.
    current = await asyncio.to_thread(broker.zk.get_topic_config, name)
    new = plan(current, entries, "topic")
    for key, value in new.items():
        try:
            parse_topic_config(key, value)
        except ConfigError as e:
            raise AdminError(Errors.INVALID_CONFIG, str(e)) from None
    check_config_consistency(new)
    if validate_only:
        return
    try:
        await asyncio.to_thread(broker.zk.set_topic_config, name, new)
    except TopicNotFoundError:
        raise AdminError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.") from None
    log.info("topic %s config overrides are now %s", name, new)
    # The refresh applies the new overrides to every open log of the topic (Broker.open_logs).
    await broker.refresh_metadata([name])


def _check_broker_configs(resource: str, new: dict[str, str], touched) -> None:
    """Kafka's DynamicBrokerConfig.validate for the keys a request sets: known, dynamically
    updatable, and a valid value. Kafka answers a ConfigException here with INVALID_REQUEST."""
    def refuse(why: str):
        raise AdminError(Errors.INVALID_REQUEST, f"Invalid config value for resource {resource}: {why}")
    keys = sorted(k for k in new if k in touched)
    unknown = [k for k in keys if k not in BROKER_CONFIGS and tlsreload.split(k) is None and not is_listener_rate_key(k)]
    if unknown:
        refuse(f"Unknown broker configs: {', '.join(unknown)}")
    static = [k for k in keys if not _dynamic_key(k)]
    if static:
        refuse(f"Cannot update these configs dynamically: {', '.join(static)} (kbroker updates only "
               f"{', '.join(sorted(DYNAMIC_BROKER_KEYS))} at runtime; set the others in server.properties "
               f"and restart the broker)")
    for k in keys:
        base = k if k in BROKER_CONFIGS else CONNECTION_RATE if is_listener_rate_key(k) else tlsreload.split(k)[1]
        try:
            BROKER_CONFIGS[base].parse(new[k])
        except ConfigError as e:
            refuse(str(e))


async def _alter_broker(broker, name, entries, plan, validate_only) -> None:
    if name != "":
        _broker_id_of(broker, name, describe=False)
    entity = DEFAULT_BROKER_ENTITY if name == "" else str(broker.broker_id)
    resource = f"ConfigResource(type=BROKER, name='{name}')"
    tls_keys = sorted({c["name"] for c in entries if tlsreload.split(c["name"]) is not None})
    if tls_keys and name == "":
        # Kafka: keystores are per broker (each broker's certificate is its own)
        raise AdminError(Errors.INVALID_REQUEST, f"Cannot update these configs at default cluster level, "
                                                 f"broker id must be specified: {', '.join(tls_keys)}")
    dynamic_tls = getattr(broker, "dynamic_tls", None)
    if tls_keys and dynamic_tls is not None:
        try:
            # passwords are stored encoded, so `current` and `new` hold them encoded throughout
            entries = [dict(c, value=dynamic_tls.encode(c["name"], c["value"])) if c["value"] is not None else c
                       for c in entries]
        except ConfigError as e:
            raise AdminError(Errors.INVALID_REQUEST, f"Invalid config value for resource {resource}: {e}") from None
    current = await asyncio.to_thread(broker.zk.get_broker_config, entity)
    new = plan(current, entries, "broker")
    _check_broker_configs(resource, new, {c["name"] for c in entries})
    # TLS keys set, or dropped (AlterConfigs replaces the whole set): the listeners follow either way
    changed = sorted(k for k in set(current) | set(new)
                     if tlsreload.split(k) is not None and current.get(k) != new.get(k))
    listeners = list(broker.server.listeners) if changed and dynamic_tls is not None else []
    if listeners:
        try:
            # the new keystore must load (file, type, passwords) before anything is stored
            await asyncio.to_thread(dynamic_tls.contexts, [(l.name, l.security_protocol) for l in listeners], new)
        except ConfigError as e:
            raise AdminError(Errors.INVALID_REQUEST,
                             f"Invalid config value for resource {resource}: {', '.join(changed)}: {e}") from None
    if validate_only:
        return
    # One multi-op: the CAS'd /config/brokers/<entity> and a "brokers/<entity>" change notification.
    removed = [k for k in current if k not in new]
    stored = await asyncio.to_thread(broker.zk.alter_broker_config, entity, new, removed)
    log.info("dynamic broker configs of %s are now %s", entity,
             {k: "[hidden]" if tlsreload.is_password(k) else v for k, v in stored.items()})
    if listeners:
        await asyncio.to_thread(dynamic_tls.apply, listeners, stored)
    # Every broker follows the znode through its watch; this one applies it before answering, so a
    # DescribeConfigs right after the answer shows the new value here.
    watcher = getattr(getattr(broker, "replica_manager", None), "throttle_watcher", None)
    if watcher is not None:
        await watcher.reload()
