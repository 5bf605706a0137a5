"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31), as Kafka's ZooKeeper mode serves them.

Without an authorizer each answers SECURITY_DISABLED. DescribeAcls needs Describe on the cluster,
CreateAcls and DeleteAcls Alter (CLUSTER_AUTHORIZATION_FAILED otherwise). Creations are grouped per
resource pattern and written to ZooKeeper compare-and-set with one change notification each
(kbroker/security/authorizer.py ``AclAuthorizer.update``); every broker applies them within a second,
this one before it answers. A DeleteAcls filter removes every entry it matches, from the patterns it
matches in this broker's cache, and answers with what it removed.
"""
from __future__ import annotations

import asyncio
import logging

from ...protocol.errors import Errors
from ...security.acl import (AclBinding, AclEntry, AclFilter, Operation, PatternType, Permission, ResourcePattern,
                             ResourceType, binding_error, code_of)
from . import authz

log = logging.getLogger(__name__)

_DISABLED = "No Authorizer is configured on the broker"


def _filter(d: dict) -> AclFilter:
    return AclFilter(code_of(ResourceType, d["resource_type_filter"]), d["resource_name_filter"],
                     code_of(PatternType, d["pattern_type_filter"]), d["principal_filter"], d["host_filter"],
                     code_of(Operation, d["operation"]), code_of(Permission, d["permission_type"]))


def describe_acls(broker, conn, header, body):
    res = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": []}
    if broker.authorizer is None:
        res["error_code"], res["error_message"] = int(Errors.SECURITY_DISABLED), _DISABLED
        return res
    if not authz.cluster(broker, conn, authz.DESCRIBE):
        res["error_code"] = int(Errors.CLUSTER_AUTHORIZATION_FAILED)
        return res
    f = _filter(body)
    if f.unknown():
        res["error_code"], res["error_message"] = int(Errors.INVALID_REQUEST), "The filter has an UNKNOWN field"
        return res
    grouped: dict[ResourcePattern, list] = {}
    for b in broker.authorizer.bindings():
        if f.matches(b):
            grouped.setdefault(b.resource, []).append(b.entry)
    res["resources"] = [
        {"resource_type": int(r.type), "resource_name": r.name, "pattern_type": int(r.pattern),
         "acls": [{"principal": e.principal, "host": e.host, "operation": int(e.operation),
                   "permission_type": int(e.permission)} for e in sorted(entries)]}
        for r, entries in sorted(grouped.items())]
    return res


async def create_acls(broker, conn, header, body):
    creations = body["creations"]
    if broker.authorizer is None:
        return _every(creations, Errors.SECURITY_DISABLED, _DISABLED)
    if not authz.cluster(broker, conn, authz.ALTER):
        return _every(creations, Errors.CLUSTER_AUTHORIZATION_FAILED, None)
    results = []
    by_resource: dict[ResourcePattern, list[tuple[AclEntry, dict]]] = {}
    for c in creations:
        b = AclBinding(ResourcePattern(code_of(ResourceType, c["resource_type"]), c["resource_name"],
                                       code_of(PatternType, c["resource_pattern_type"])),
                       AclEntry(c["principal"], c["host"], code_of(Operation, c["operation"]),
                                code_of(Permission, c["permission_type"])))
        res = {"error_code": 0, "error_message": None}
        results.append(res)
        why = binding_error(b)
        if why is not None:
            res["error_code"], res["error_message"] = int(Errors.INVALID_REQUEST), why
            continue
        by_resource.setdefault(b.resource, []).append((b.entry, res))
    for resource, rows in by_resource.items():
        entries = {e for e, _ in rows}
        try:
            await asyncio.to_thread(broker.authorizer.update, resource, lambda cur: cur | entries)
        except Exception as e:    # ZooKeeper trouble for one resource must not lose the others' answers
            log.exception("creating ACLs on %s failed", resource)
            for _e, res in rows:
                res["error_code"], res["error_message"] = int(Errors.UNKNOWN_SERVER_ERROR), f"{e}"
    return {"throttle_time_ms": 0, "results": results}


def _every(rows, code, message):
    return {"throttle_time_ms": 0, "results": [{"error_code": int(code), "error_message": message} for _ in rows]}


async def delete_acls(broker, conn, header, body):
    filters = body["filters"]
    if broker.authorizer is None or not authz.cluster(broker, conn, authz.ALTER):
        code, message = ((Errors.SECURITY_DISABLED, _DISABLED) if broker.authorizer is None
                         else (Errors.CLUSTER_AUTHORIZATION_FAILED, None))
        return {"throttle_time_ms": 0, "filter_results": [
            {"error_code": int(code), "error_message": message, "matching_acls": []} for _ in filters]}
    out = []
    for d in filters:
        f = _filter(d)
        res = {"error_code": 0, "error_message": None, "matching_acls": []}
        out.append(res)
        if f.unknown():
            res["error_code"], res["error_message"] = int(Errors.INVALID_REQUEST), "The filter has an UNKNOWN field"
            continue
        resources = {b.resource for b in broker.authorizer.bindings() if f.matches_pattern(b.resource)}
        for r in sorted(resources):
            removed: set = set()

            def change(cur, removed=removed):
                removed.clear()
                removed.update(e for e in cur if f.matches_entry(e))
                return cur - removed
            try:
                await asyncio.to_thread(broker.authorizer.update, r, change)
            except Exception as e:
                log.exception("deleting ACLs on %s failed", r)
                res["error_code"], res["error_message"] = int(Errors.UNKNOWN_SERVER_ERROR), f"{e}"
                continue
            res["matching_acls"] += [
                {"error_code": 0, "error_message": None, "resource_type": int(r.type), "resource_name": r.name,
                 "pattern_type": int(r.pattern), "principal": e.principal, "host": e.host,
                 "operation": int(e.operation), "permission_type": int(e.permission)} for e in sorted(removed)]
    return {"throttle_time_ms": 0, "filter_results": out}
