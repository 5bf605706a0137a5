"""Client quotas in the request path, and DescribeClientQuotas (48) / AlterClientQuotas (49).

``Throttling`` is what the network server asks (``KafkaServer.quotas``, kbroker/network/connection.py):

- ``lookup(principal, client_id)``: the connection's ``ClientQuota`` (kbroker/security/quotas.py) or
  None. A connection with one takes the reference path for Produce and Fetch (its native handlers
  are unset), so every byte is counted; one without keeps the native path. Until the client-id of a
  connection is known (its first request, ApiVersions for every real client) it takes the reference
  path whenever any quota exists.
- ``request_in``: a Produce's request bytes are recorded as it arrives (Kafka counts the request size).
- ``answer_out``: as the answer leaves, the Fetch's records bytes and the request's handling time
  (percent of one thread, Kafka's request quota) are recorded; the answer carries the largest throttle
  time of the client's quotas in ``throttle_time_ms`` (every answer that has the field), and the
  connection is muted that long (KIP-219: the broker stops reading it; the answer itself goes out at
  once). A throttled Fetch answers no data, its bytes un-recorded, as Kafka does. Follower fetches and
  the inter-broker, ApiVersions and SASL requests are exempt, as in Kafka.

Quota configs are ZooKeeper's (zk/quotas.py): loaded at start, re-read for every ``users/...`` or
``clients/...`` change notification under /config/changes (the broker's config-change watch), so every
broker applies a change within a second.

Threads: the event loop; ZooKeeper on worker threads.
"""
from __future__ import annotations

import asyncio
import logging

from ...protocol.errors import Errors
from ...protocol.types import FileRegions
from ...security import quotas as Q
from ...zk import quotas as ZQ
from . import authz

log = logging.getLogger(__name__)

_PRODUCE, _FETCH = 0, 1
# Kafka answers these without throttling (inter-broker actions, the handshake and authentication).
_EXEMPT = frozenset((4, 5, 6, 7, 17, 18, 27, 36))
_ENTITY_TYPES = {"user": 0, "client-id": 1}


def _records_size(records) -> int:
    if records is None:
        return 0
    if type(records) is FileRegions:
        return records.size
    return len(records) if not isinstance(records, memoryview) else records.nbytes


class Throttling:
    def __init__(self, broker, manager: Q.QuotaManager):
        self.broker = broker
        self.manager = manager

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
    def answer_out(conn, quota: Q.ClientQuota, slot, result):
        """The answer of ``slot`` (a response dict, NO_RESPONSE or CLOSE) with the throttle applied."""
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
        elif key == _FETCH and is_dict and quota.has(Q.FETCH):
            size = sum(_records_size(p.get("records")) for t in result.get("responses") or ()
                       for p in t.get("partitions") or ())
            quota.record(Q.FETCH, size)
            fetch_ms = quota.throttle_ms(Q.FETCH)
            if max(ms, fetch_ms) > 0:
                quota.record(Q.FETCH, -size)
                result = dict(result, responses=[])
            ms = max(ms, fetch_ms)
        if ms > 0:
            if is_dict:
                result["throttle_time_ms"] = max(result.get("throttle_time_ms") or 0, ms)
            conn.throttle(ms)
        return result

    # ---- configs ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Every quota entity from ZooKeeper (worker thread; applied on the loop before it returns
        control to clients: the broker calls this before its listeners open)."""
        for (user, client), config in ZQ.read_all(self.broker.zk.kazoo).items():
            self.manager.set_entity(user, client, config)

    async def reload_all(self) -> None:
        try:
            got = await asyncio.to_thread(ZQ.read_all, self.broker.zk.kazoo)
        except Exception:
            log.exception("reading the client quotas failed")
            return
        known = {e: {} for e in self.manager.entities}      # entities gone from ZooKeeper: no bounds
        self.apply({**known, **got})

    async def reload(self, paths) -> None:
        """Re-read the entities named by change notifications (``users/alice/clients/app``, ...)."""
        entities = set()
        for path in paths:
            try:
                entities.add(ZQ.parse_entity_path(path))
            except ValueError:
                continue        # a user's SCRAM-only path is an entity too; anything else is not ours
        if not entities:
            return
        kazoo = self.broker.zk.kazoo
        try:
            got = await asyncio.to_thread(lambda: {e: ZQ.read_entity(kazoo, *e) for e in entities})
        except Exception:
            log.exception("reading changed client quotas failed")
            return
        self.apply(got)

    def apply(self, configs) -> None:
        changed = False
        for (user, client), config in configs.items():
            changed |= self.manager.set_entity(user, client, config)
        if changed and self.broker.server is not None:
            for conn in list(self.broker.server.connections):
                conn.refresh_quota()


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
                                   "client quotas are per user and client-id")
        if etype in filters:
            return _describe_error(Errors.INVALID_REQUEST, f"Duplicate {etype} filter component entity type")
        if match_type not in (0, 1, 2) or (match_type == 0) != (match is not None):
            return _describe_error(Errors.INVALID_REQUEST, f"Invalid match type {match_type} with match "
                                   f"{match!r} for entity type {etype}")
        filters[etype] = (match_type, match)
    all_ = await asyncio.to_thread(ZQ.read_all, broker.zk.kazoo)
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
            return None, f"Unsupported entity type {etype}: kbroker's client quotas are per user and client-id"
        if etype in parts:
            return None, f"Duplicate {etype} entity type"
        name = e["entity_name"]
        parts[etype] = Q.DEFAULT if name is None else name
    if not parts:
        return None, "Invalid empty client quota entity"
    if "" in parts.values():
        return None, "Empty entity names are not allowed (a default entity has a null name)"
    return (parts.get("user"), parts.get("client-id")), None


async def alter_client_quotas(broker, conn, header, body):
    allowed = authz.cluster(broker, conn, authz.ALTER_CONFIGS)
    out, applied = [], {}
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
        set_, delete, bad = {}, [], None
        for op in entry["ops"]:
            k = op["key"]
            if op["remove"]:
                bad = None if k in Q.KEYS else f"Invalid configuration key {k}"
                delete.append(k)
            else:
                bad = Q.validate(k, op["value"])
                set_[k] = _format(k, op["value"])
            if bad:
                break
        if bad:
            answer(Errors.INVALID_REQUEST, bad)
            continue
        if not body["validate_only"]:
            try:
                applied[entity] = await asyncio.to_thread(ZQ.alter_entity, kazoo, *entity, set_, delete)
            except Exception as e:      # noqa: BLE001 - the entry fails, the others go on
                log.warning("AlterClientQuotas %s failed: %s", entity, e)
                answer(Errors.UNKNOWN_SERVER_ERROR, str(e))
                continue
        answer(Errors.NONE)
    if applied:
        broker.quotas.apply(applied)     # this broker at once; the others on the notification
    return {"throttle_time_ms": 0, "entries": out}


def _format(key: str, value: float) -> str:
    """As Kafka stores it: byte rates as whole numbers, request_percentage as a double."""
    return str(int(value)) if key in (Q.PRODUCE, Q.FETCH) else repr(float(value))
