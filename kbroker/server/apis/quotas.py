"""Client quotas in the request path, and DescribeClientQuotas (48) / AlterClientQuotas (49).

``Throttling`` is what the network server asks (``KafkaServer.quotas``, kbroker/network/connection.py):

- ``lookup(principal, client_id)``: the connection's ``ClientQuota`` (kbroker/security/quotas.py) or
  None. A connection with one takes the reference path for Produce and Fetch (its native handlers
  are unset), so every byte is counted; one without keeps the native path. Until the client-id of a
  connection is known (its first request, ApiVersions for every real client) it takes the reference
  path whenever any quota exists.
- ``request_in``: a Produce's request bytes are recorded as it arrives (Kafka counts the request size).
- ``answer_out``: as the answer leaves, the Fetch answer's size and the request's handling time
  (percent of one thread, Kafka's request quota) are recorded. The handling time is the handler's call,
  then, for a handler that awaits, each later step of it on the loop (``timed``: a sliced answer is built
  over many turns), and the decoding and encoding done on the server's heavy thread for large requests
  and answers (``offloop``, recorded as it ends); the answer carries the largest throttle
  time of the client's quotas in ``throttle_time_ms`` (every answer that has the field), and the
  connection is muted that long (KIP-219: the broker stops reading it; the answer itself goes out at
  once). A throttled Fetch answers no data (a full one no fetch session: fetch.throttled_answer), its bytes
  un-recorded, as Kafka does. Follower fetches and
  the inter-broker, ApiVersions and SASL requests are exempt, as in Kafka.

``connections`` (kbroker/security/connection_quotas.py) are the KIP-612 connection creation rates the
network server applies at accept: ``max.connection.creation.rate``, ``listener.name.<l>.max.connection.
creation.rate`` and the ``ips`` entities. The first two are dynamic broker configs (AlterConfigs of this
broker or ``<default>``): ``apply_broker_configs`` follows /config/brokers as the broker's dynamic-config
watcher reads it; per-broker value, else the cluster default, else server.properties.

Quota configs are ZooKeeper's (zk/quotas.py): loaded at start, re-read for every ``users/...``,
``clients/...`` or ``ips/...`` change notification under /config/changes (the broker's config-change
watch), so every broker applies a change within a second.

Threads: the event loop; ZooKeeper on worker threads.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import time

from ...config import BROKER_CONFIGS, LISTENER_PREFIX, ConfigError
from ...protocol import api
from ...protocol.errors import Errors
from ...security import connection_quotas as CQ
from ...security import quotas as Q
from ...zk import quotas as ZQ
from . import authz, fetch

log = logging.getLogger(__name__)

_PRODUCE, _FETCH = 0, 1
# Kafka answers these without throttling (inter-broker actions, the handshake and authentication).
_EXEMPT = frozenset((4, 5, 6, 7, 17, 18, 27, 36))
_ENTITY_TYPES = {"user": 0, "client-id": 1, "ip": 2}
CONNECTION_RATE = "max.connection.creation.rate"


def listener_rate_key(listener: str) -> str:
    """Kafka's per-listener key of the connection creation rate (the listener name in lower case)."""
    return f"{LISTENER_PREFIX}{listener.lower()}.{CONNECTION_RATE}"


def is_listener_rate_key(key: str) -> bool:
    if not key.startswith(LISTENER_PREFIX):
        return False
    listener, _, base = key[len(LISTENER_PREFIX):].partition(".")
    return bool(listener) and base == CONNECTION_RATE


def _fetch_size(chunks, version: int) -> int:
    """What Kafka counts of a Fetch answer: the whole response after its size prefix, less the
    flexible header's tag buffer (Kafka sizes the correlation id and the body)."""
    size = sum(len(c) for c in chunks) - 4
    return size - 1 if api.RESPONSES[_FETCH].is_flexible(version) else size


class _TimedSteps:
    """Awaiting it runs the wrapped awaitable, its time between suspensions recorded in the quota."""

    __slots__ = ("awaitable", "quota")

    def __init__(self, awaitable, quota: Q.ClientQuota):
        self.awaitable = awaitable
        self.quota = quota

    def __await__(self):
        steps = self.awaitable.__await__()
        send, error = None, None
        while True:
            t0 = time.perf_counter()
            try:
                out = steps.send(send) if error is None else steps.throw(error)
            except StopIteration as done:
                self.quota.record(Q.REQUEST, (time.perf_counter() - t0) * 100.0)
                return done.value
            except BaseException:
                self.quota.record(Q.REQUEST, (time.perf_counter() - t0) * 100.0)
                raise
            self.quota.record(Q.REQUEST, (time.perf_counter() - t0) * 100.0)
            try:
                send, error = (yield out), None
            except BaseException as e:     # noqa: BLE001 - thrown in (a cancellation): passed on to the steps
                send, error = None, e


class Throttling:
    def __init__(self, broker, manager: Q.QuotaManager):
        self.broker = broker
        self.manager = manager
        self.connections = CQ.ConnectionQuotas.from_config(broker.config.get)
        self.apply_broker_configs({}, {})
        # as Kafka: the inter-broker listener is exempt from the broker-wide rate when it is not the only one
        cfg = broker.config
        self.protected_listener = cfg.inter_broker_listener.listener_name if len(cfg.listeners) > 1 else None

    # ---- what the connection asks --------------------------------------------------------------
    def any(self) -> bool:
        return self.manager.any()

    def lookup(self, principal: str, client_id) -> Q.ClientQuota | None:
        return self.manager.lookup(principal, client_id)

    @staticmethod
    def request_in(quota: Q.ClientQuota, key: int, size: int) -> None:
        if key == _PRODUCE:
            quota.record(Q.PRODUCE, size)

    @staticmethod
    def timed(quota: Q.ClientQuota, slot, awaitable):
        """``awaitable`` (a handler's answer to wait on) with the loop time of each of its steps
        recorded in the request quota as it runs; the handler's first call is ``slot.local``."""
        if slot.api_key in _EXEMPT or slot.follower or not quota.has(Q.REQUEST):
            return awaitable
        return _TimedSteps(awaitable, quota)

    @staticmethod
    def offloop(quota: Q.ClientQuota, slot, seconds: float) -> None:
        """``seconds`` of decoding or encoding the request of ``slot`` on the heavy thread."""
        if slot.api_key not in _EXEMPT and not slot.follower:
            quota.record(Q.REQUEST, seconds * 100.0)

    def answer_out(self, conn, quota: Q.ClientQuota, slot, result):
        """The answer of ``slot`` (a response dict, NO_RESPONSE or CLOSE) with the throttle applied.

        A Fetch under a consumer_byte_rate is sized by encoding it: when it goes out unthrottled its
        encoded chunks are returned (a list), so it is not encoded twice."""
        key = slot.api_key
        if key in _EXEMPT or slot.follower:
            return result
        ms = 0
        if quota.has(Q.REQUEST):
            quota.record(Q.REQUEST, slot.local * 100.0)    # seconds of handling -> percent-seconds
            ms = quota.throttle_ms(Q.REQUEST)
        is_dict = type(result) is dict
        if key == _PRODUCE:
            ms = max(ms, quota.throttle_ms(Q.PRODUCE))
        elif key == _FETCH and is_dict:
            if quota.has(Q.FETCH):
                h = slot.header
                try:
                    chunks = api.encode_response(key, h.api_version, h.correlation_id, result)
                except Exception:       # noqa: BLE001 - unencodable: the connection's own encode reports it
                    return result
                size = _fetch_size(chunks, h.api_version)
                quota.record(Q.FETCH, size)
                fetch_ms = quota.throttle_ms(Q.FETCH)
                if max(ms, fetch_ms) == 0:
                    return chunks       # throttle_time_ms stays 0, as encoded
                quota.record(Q.FETCH, -size)    # a throttled answer's bytes are not counted
                ms = max(ms, fetch_ms)
            if ms > 0:
                # throttled, whichever quota throttles: answered empty (a full fetch with no session), as Kafka
                result = fetch.throttled_answer(self.broker, result)
        if ms > 0:
            if is_dict:
                result["throttle_time_ms"] = max(result.get("throttle_time_ms") or 0, ms)
            conn.throttle(ms)
        return result

    # ---- configs ---------------------------------------------------------------------------------
    def apply_broker_configs(self, mine: dict[str, str], default: dict[str, str]) -> None:
        """The connection creation rates of /config/brokers/<id> (``mine``) and <default> over the static
        config; a value that does not parse keeps the one below it (logged)."""
        cfg = self.broker.config
        spec = BROKER_CONFIGS[CONNECTION_RATE]

        def value(key, static):
            text = mine.get(key, default.get(key))
            if text is None:
                return static
            try:
                return spec.parse(text)
            except ConfigError as e:
                log.warning("ignoring dynamic %s=%r: %s", key, text, e)
                return static
        listeners = {}
        for e in cfg.listeners:
            rate = value(listener_rate_key(e.listener_name),
                         cfg.listener_overrides(e.listener_name).get(CONNECTION_RATE))
            if rate is not None:
                listeners[e.listener_name] = rate
        self.connections.set_rates(value(CONNECTION_RATE, cfg.get(CONNECTION_RATE)), listeners)

    def start(self) -> None:
        """Every quota entity from ZooKeeper (worker thread; applied on the loop before it returns
        control to clients: the broker calls this before its listeners open)."""
        for (user, client), config in ZQ.read_all(self.broker.zk.kazoo).items():
            self.manager.set_entity(user, client, config)
        for ip, config in ZQ.read_ips(self.broker.zk.kazoo).items():
            self.connections.set_ip(ip, config)

    async def reload_all(self) -> None:
        kazoo = self.broker.zk.kazoo
        try:
            got, ips = await asyncio.to_thread(lambda: (ZQ.read_all(kazoo), ZQ.read_ips(kazoo)))
        except Exception:
            log.exception("reading the client quotas failed")
            return
        known = {e: {} for e in self.manager.entities}      # entities gone from ZooKeeper: no bounds
        self.apply({**known, **got})
        self.apply_ips({**{ip: {} for ip in self.connections.ips}, **ips})

    async def reload(self, paths) -> None:
        """Re-read the entities named by change notifications (``users/alice/clients/app``, ...)."""
        entities, ips = set(), set()
        for path in paths:
            ip = ZQ.ip_entity(path)
            if ip is not None:
                ips.add(ip)
                continue
            try:
                entities.add(ZQ.parse_entity_path(path))
            except ValueError:
                continue        # a user's SCRAM-only path is an entity too; anything else is not ours
        if not entities and not ips:
            return
        kazoo = self.broker.zk.kazoo
        try:
            got, got_ips = await asyncio.to_thread(lambda: ({e: ZQ.read_entity(kazoo, *e) for e in entities},
                                                            {ip: ZQ.read_ip(kazoo, ip) for ip in ips}))
        except Exception:
            log.exception("reading changed client quotas failed")
            return
        self.apply(got)
        self.apply_ips(got_ips)

    def apply_ips(self, configs) -> None:
        for ip, config in configs.items():
            self.connections.set_ip(ip, config)

    def apply(self, configs) -> None:
        changed = False
        for (user, client), config in configs.items():
            changed |= self.manager.set_entity(user, client, config)
        if changed and self.broker.server is not None:
            for conn in list(self.broker.server.connections):
                conn.refresh_quota()


# ---- controller mutations (KIP-599): CreateTopics, CreatePartitions, DeleteTopics ------------------

# The first version of each that can answer THROTTLING_QUOTA_EXCEEDED per topic (older: throttled only).
STRICT_SINCE = {19: 6, 20: 5, 37: 3}
THROTTLED_MESSAGE = "The throttling quota has been exceeded."


def mutation_quota(broker, conn, header) -> Q.MutationQuota | None:
    """The request's controller mutation quota, or None when no controller_mutation_rate applies."""
    return broker.quotas.manager.mutation(conn.principal, header.client_id,
                                          header.api_version >= STRICT_SINCE[header.api_key])


def mutation_answer(conn, quota: Q.MutationQuota | None, answer: dict) -> dict:
    """``answer`` with the quota's throttle time, the connection muted that long (KIP-219)."""
    if quota is not None and quota.throttle_ms > 0:
        answer["throttle_time_ms"] = max(answer.get("throttle_time_ms") or 0, quota.throttle_ms)
        conn.throttle(quota.throttle_ms)
    return answer


# ---- DescribeClientQuotas (48) ---------------------------------------------------------------------

def _name_out(name):
    return None if name == Q.DEFAULT else name


def _describe_error(code, message):
    return {"throttle_time_ms": 0, "error_code": int(code), "error_message": message, "entries": None}


async def describe_client_quotas(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.DESCRIBE_CONFIGS):
        return _describe_error(Errors.CLUSTER_AUTHORIZATION_FAILED, None)
    filters = {}
    for c in body["components"]:
        etype, match_type, match = c["entity_type"], c["match_type"], c["match"]
        if etype not in _ENTITY_TYPES:
            return _describe_error(Errors.INVALID_REQUEST, f"Unsupported entity type {etype}: kbroker's "
                                   "client quotas are per user, client-id and ip")
        if etype in filters:
            return _describe_error(Errors.INVALID_REQUEST, f"Duplicate {etype} filter component entity type")
        if match_type not in (0, 1, 2) or (match_type == 0) != (match is not None):
            return _describe_error(Errors.INVALID_REQUEST, f"Invalid match type {match_type} with match "
                                   f"{match!r} for entity type {etype}")
        filters[etype] = (match_type, match)
    if "ip" in filters and len(filters) > 1:
        return _describe_error(Errors.INVALID_REQUEST, "Invalid entity filter component combination, IP filter "
                               "component should not be used with User or ClientId filter component.")
    kazoo = broker.zk.kazoo
    all_, ips = await asyncio.to_thread(lambda: ({} if "ip" in filters else ZQ.read_all(kazoo),
                                                 ZQ.read_ips(kazoo) if "ip" in filters or not filters else {}))
    entries = []
    for (user, client), config in sorted(all_.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        quotas = Q.parse_quotas(config)
        if not quotas:
            continue
        parts = {"user": user, "client-id": client}
        if body["strict"] and {t for t, v in parts.items() if v is not None} != set(filters):
            continue
        if not all(_matches(parts[t], mt, m) for t, (mt, m) in filters.items()):
            continue
        entries.append({
            "entity": [{"entity_type": t, "entity_name": _name_out(v)} for t, v in parts.items() if v is not None],
            "values": [{"key": k, "value": v} for k, v in sorted(quotas.items())]})
    for ip, config in sorted(ips.items()):
        rate = CQ.parse_rate(config)
        if rate is None or (body["strict"] and not filters):
            continue
        if "ip" in filters and not _matches(ip, *filters["ip"]):
            continue
        entries.append({"entity": [{"entity_type": "ip", "entity_name": _name_out(ip)}],
                        "values": [{"key": CQ.RATE_KEY, "value": float(rate)}]})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "entries": entries}


def _matches(name, match_type, match) -> bool:
    if name is None:
        return False
    if match_type == 0:
        return name == match
    if match_type == 1:
        return name == Q.DEFAULT
    return name != Q.DEFAULT


# ---- AlterClientQuotas (49) ------------------------------------------------------------------------

def _entity_of(entity_data):
    """(user, client) of an entry's entity, or (error code, message)."""
    parts = {}
    for e in entity_data:
        etype = e["entity_type"]
        if etype not in _ENTITY_TYPES:
            return None, f"Unsupported entity type {etype}: kbroker's client quotas are per user, client-id and ip"
        if etype in parts:
            return None, f"Duplicate {etype} entity type"
        name = e["entity_name"]
        parts[etype] = Q.DEFAULT if name is None else name
    if not parts:
        return None, "Invalid empty client quota entity"
    if "" in parts.values():
        return None, "Empty entity names are not allowed (a default entity has a null name)"
    if "ip" in parts:
        if len(parts) > 1:
            return None, ("Invalid quota entity combination, IP entity should not be combined with User or "
                          "ClientId entity.")
        ip = parts["ip"]
        if ip != Q.DEFAULT:
            try:
                ip = str(ipaddress.ip_address(ip))
            except ValueError:
                return None, f"{ip} is not a valid IP or resolvable host."
        return ip, None
    return (parts.get("user"), parts.get("client-id")), None


def _validate_ip_op(key: str, value: float) -> str | None:
    if key != CQ.RATE_KEY:
        return f"Invalid configuration key {key}: an ip entity has {CQ.RATE_KEY} only"
    if value < 0 or value != int(value):
        return f"Invalid quota value {value} for {key}: it must be a whole number of connections per second, at least 0"
    return None


async def alter_client_quotas(broker, conn, header, body):
    allowed = authz.cluster(broker, conn, authz.ALTER_CONFIGS)
    out, applied, applied_ips = [], {}, {}
    kazoo = broker.zk.kazoo
    for entry in body["entries"]:
        entity_out = [{"entity_type": e["entity_type"], "entity_name": e["entity_name"]} for e in entry["entity"]]

        def answer(code, message=None):
            out.append({"error_code": int(code), "error_message": message, "entity": entity_out})

        if not allowed:
            answer(Errors.CLUSTER_AUTHORIZATION_FAILED)
            continue
        entity, why = _entity_of(entry["entity"])
        if entity is None:
            answer(Errors.INVALID_REQUEST, why)
            continue
        is_ip = isinstance(entity, str)
        keys = (CQ.RATE_KEY,) if is_ip else Q.KEYS
        set_, delete, bad = {}, [], None
        for op in entry["ops"]:
            k = op["key"]
            if op["remove"]:
                bad = None if k in keys else f"Invalid configuration key {k}"
                delete.append(k)
            else:
                bad = _validate_ip_op(k, op["value"]) if is_ip else Q.validate(k, op["value"])
                set_[k] = _format(k, op["value"])
            if bad:
                break
        if bad:
            answer(Errors.INVALID_REQUEST, bad)
            continue
        if not body["validate_only"]:
            try:
                if is_ip:
                    applied_ips[entity] = await asyncio.to_thread(ZQ.alter_ip, kazoo, entity, set_, delete)
                else:
                    applied[entity] = await asyncio.to_thread(ZQ.alter_entity, kazoo, *entity, set_, delete)
            except Exception as e:      # noqa: BLE001 - the entry fails, the others go on
                log.warning("AlterClientQuotas %s failed: %s", entity, e)
                answer(Errors.UNKNOWN_SERVER_ERROR, str(e))
                continue
        answer(Errors.NONE)
    # this broker at once; the others on the notification
    if applied:
        broker.quotas.apply(applied)
    if applied_ips:
        broker.quotas.apply_ips(applied_ips)
    return {"throttle_time_ms": 0, "entries": out}


def _format(key: str, value: float) -> str:
    """As Kafka stores it: byte rates as whole numbers, request_percentage as a double."""
    return str(int(value)) if key in (Q.PRODUCE, Q.FETCH, CQ.RATE_KEY) else repr(float(value))
