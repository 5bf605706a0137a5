"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

Topic configs live in ZooKeeper (``/config/topics/<t>``, overrides only); a topic's effective value
is its override, else the broker's default for it (``server.properties`` synonyms, else Kafka's
default). Broker configs are static: they are described but cannot be altered (kbroker has no
dynamic broker configs).
"""
from __future__ import annotations

import asyncio
import logging

from ...network.connection import EncodeOffLoop
from ...config import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigError, format_value, parse_topic_config
from ...protocol.errors import Errors
from ...zk.client import TopicNotFoundError
from ..metadata import topic_name_error
from .admin import AdminError, check_config_consistency

log = logging.getLogger(__name__)

# Resource types (Kafka's ConfigResource.Type ids).
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
# DescribeConfigs config sources (Kafka's ConfigSource ids).
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# DescribeConfigs v3 config_type ids.
_CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7,
                 "class": 8, "password": 9}
# IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# Broker keys with a coarser unit than the topic key they default (log.retention.hours → retention.ms).
_UNIT_MS = {".hours": 3_600_000, ".minutes": 60_000}


# ---- DescribeConfigs (32) ------------------------------------------------------------------------

# A DescribeConfigs answer is built this many resources per event-loop turn: a topic resource is
# expensive (every topic key with its source and synonyms; a 20,000-topic request took 13.6 s end to
# end), so a request naming thousands of topics would otherwise hold the loop, and every other client,
# for seconds.
RESOURCES_PER_TURN = 20


def describe_configs(broker, conn, header, body):
    if len(body["resources"]) > RESOURCES_PER_TURN:
        return _describe_configs_sliced(broker, header, body)
    return {"throttle_time_ms": 0, "results": [_describe_resource(broker, header, body, r)
                                               for r in body["resources"]]}


async def _describe_configs_sliced(broker, header, body):
    results = []
    for i, r in enumerate(body["resources"]):
        if i and i % RESOURCES_PER_TURN == 0:
            await asyncio.sleep(0)
        results.append(_describe_resource(broker, header, body, r))
    return EncodeOffLoop({"throttle_time_ms": 0, "results": results})


def _describe_resource(broker, header, body, r):
    version = header.api_version
    synonyms = bool(body.get("include_synonyms", False))
    docs = bool(body.get("include_documentation", False))
    rtype, name = r["resource_type"], r["resource_name"]
    res = {"error_code": 0, "error_message": None, "resource_type": rtype, "resource_name": name,
           "configs": []}
    try:
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
            e["synonyms"] = []
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
    spec = TOPIC_CONFIGS[key]
    for syn in spec.synonyms:
        if broker.config.is_set(syn) and syn in BROKER_CONFIGS:
            value = broker.config.get(syn)
            for suffix, factor in _UNIT_MS.items():
                if syn.endswith(suffix) and key.endswith(".ms") and value is not None:
                    return value * factor
            return value
    return spec.default


def _topic_entries(broker, name) -> list[dict]:
    bad = topic_name_error(name)
    if bad is not None:
        raise AdminError(Errors.INVALID_TOPIC_EXCEPTION, f"Topic name is illegal: {bad}")
    info = broker.metadata.topics.get(name)
    if info is None:
        raise AdminError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
    out = []
    for key, spec in TOPIC_CONFIGS.items():
        syns = _broker_synonyms(broker, spec.synonyms)
        override = info.config.get(key)
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


def _broker_id_of(broker, name: str) -> None:
    try:
        bid = int(name)
    except ValueError:
        raise AdminError(Errors.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}") from None
    if bid != broker.broker_id:
        raise AdminError(Errors.INVALID_REQUEST,
                         f"Unexpected broker id, expected {broker.broker_id} or empty string, but received {name}")


def _broker_entries(broker, name) -> list[dict]:
    if name == "":
        return []   # the cluster-wide dynamic defaults: kbroker has none
    _broker_id_of(broker, name)
    cfg = broker.config
    out = []
    for key in sorted(BROKER_CONFIGS):
        spec = BROKER_CONFIGS[key]
        sensitive = spec.type == "password"
        value = None if sensitive else format_value(cfg.get(key)) if cfg.get(key) is not None else None
        syns = _broker_synonyms(broker, [key])
        if sensitive:
            for s in syns:
                s["value"] = None
        source = STATIC_BROKER_CONFIG if cfg.is_set(key) else DEFAULT_CONFIG
        # read_only: nothing is dynamically updatable in kbroker.
        out.append(_entry(key, value, source, syns, spec.type, read_only=True, sensitive=sensitive,
                          doc=spec.doc))
    return out


# ---- AlterConfigs (33) and IncrementalAlterConfigs (44) ------------------------------------------

async def alter_configs(broker, conn, header, body):
    def plan(current: dict[str, str], entries: list[dict]) -> dict[str, str]:
        # Non-incremental: the request is the complete new override set (null values are dropped).
        new = {}
        for c in entries:
            if c["value"] is not None:
                new[c["name"]] = c["value"]
        return new
    return await _alter(broker, body, plan)


async def incremental_alter_configs(broker, conn, header, body):
    def plan(current: dict[str, str], entries: list[dict]) -> dict[str, str]:
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
            spec = TOPIC_CONFIGS.get(key)
            if spec is None:
                raise AdminError(Errors.INVALID_CONFIG, f"Unknown topic config name: {key}")
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
                base = (parse_topic_config(key, new[key]) if key in new
                        else list(topic_default(broker, key) or []))
                items = [v.strip() for v in value.split(",") if v.strip()]
                if op == APPEND:
                    result = base + [v for v in items if v not in base]
                else:
                    result = [v for v in base if v not in items]
                new[key] = ",".join(result)
        return new
    return await _alter(broker, body, plan)


async def _alter(broker, body, plan):
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
            if rtype == BROKER:
                if name != "":
                    _broker_id_of(broker, name)
                raise AdminError(Errors.INVALID_REQUEST,
                                 "Dynamic broker configs are not supported by kbroker: set broker configs in "
                                 "server.properties and restart the broker.")
            if rtype != TOPIC:
                raise AdminError(Errors.INVALID_REQUEST, f"Unsupported resource type {rtype} for altering configs")
            await _alter_topic(broker, name, r["configs"], plan, validate_only)
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
    new = plan(current, entries)
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
