"""The one helper handlers ask "may this connection do this?" (Kafka's AuthHelper): the broker's
AclAuthorizer (kbroker/security/authorizer.py) asked with the connection's principal and host, its
answer kept on the connection.

Without an authorizer every check is one attribute test and allows. With one, each connection keeps
its decisions (``acl_decisions``: (operation, resource type, name) -> bool) and, for the native
Produce/Fetch path, the topics it may Write and Read and whether it holds ClusterAction (ConnState's
``_acl_write``, ``_acl_read``, ``_acl_cluster``): a topic not in the set sends the request to the
reference path, which asks here and adds it. Every change of the ACLs drops all of it
(``forget_all``), as does a change of the connection's principal (``forget``). Both are bounded: a
client naming endless topics gets its cache emptied, never grown past ``MAX_DECISIONS``.
"""
from __future__ import annotations

import asyncio

from ...security.acl import CLUSTER_NAME, Operation, ResourceType  # noqa: F401  (Operation: for callers)

MAX_DECISIONS = 10_000

READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = (Operation.READ, Operation.WRITE, Operation.CREATE,
                                                 Operation.DELETE, Operation.ALTER, Operation.DESCRIBE)
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = (
    Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE)
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                                           ResourceType.TRANSACTIONAL_ID)


def allowed(broker, conn, op: Operation, rtype: ResourceType, name: str) -> bool:
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    if conn is None:            # the broker's own calls (no client connection)
        return True
    decisions = conn.acl_decisions
    key = (op, rtype, name)
    ok = decisions.get(key)
    if ok is None:
        if len(decisions) >= MAX_DECISIONS:
            forget(conn)
        ok = decisions[key] = authorizer.authorize(conn.principal, conn.client_host, op, rtype, name)
        if ok:
            _remember_native(conn, op, rtype, name)
    return ok


def _remember_native(conn, op, rtype, name) -> None:
    if rtype == TOPIC:
        if op == WRITE:
            conn._acl_write.add(name)
        elif op == READ:
            conn._acl_read.add(name)
    elif rtype == CLUSTER and op == CLUSTER_ACTION:
        conn._acl_cluster = True


def cluster(broker, conn, op: Operation) -> bool:
    return allowed(broker, conn, op, CLUSTER, CLUSTER_NAME)


def refused(broker, conn, op: Operation, rtype: ResourceType, names) -> set:
    """The names of ``names`` the connection may not ``op`` (empty without an authorizer)."""
    if broker.authorizer is None or conn is None:
        return set()
    return {n for n in set(names) if not allowed(broker, conn, op, rtype, n)}


def may_create_topic(broker, conn, name: str) -> bool:
    """CreateTopics and auto-creation: Create on the cluster or on the topic."""
    return cluster(broker, conn, CREATE) or allowed(broker, conn, CREATE, TOPIC, name)


def allowed_any(broker, conn, op: Operation, rtype: ResourceType) -> bool:
    """``op`` on some resource of ``rtype`` (KIP-679); not cached (InitProducerId only)."""
    authorizer = broker.authorizer
    if authorizer is None or conn is None:
        return True
    return authorizer.authorize_any(conn.principal, conn.client_host, op, rtype)


def forget(conn) -> None:
    conn.forget_decisions()


def forget_all(connections) -> None:
    for conn in connections:
        forget(conn)


# The operations Kafka defines on each resource type (its AclEntry.supportedOperations): what an
# authorized-operations bit field (KIP-430) may hold.
SUPPORTED_OPERATIONS = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE),
    TRANSACTIONAL_ID: (DESCRIBE, WRITE),
}


def authorized_operations(broker, conn, rtype: ResourceType, name: str) -> int:
    """KIP-430's bit field (bit n = operation code n) of what the connection may do on the resource;
    every supported operation without an authorizer, as Kafka."""
    return sum(1 << int(op) for op in SUPPORTED_OPERATIONS[rtype] if allowed(broker, conn, op, rtype, name))


def with_metadata_operations(broker, conn, body, answer):
    """A Metadata answer (a dict, an EncodeOffLoop of one, or an awaitable of either) with the
    cluster's and the described topics' authorized operations filled in, as the request asked."""
    if asyncio.iscoroutine(answer):
        async def later():
            return with_metadata_operations(broker, conn, body, await answer)
        return later()
    res = getattr(answer, "body", answer)
    if body.get("include_cluster_authorized_operations"):
        res["cluster_authorized_operations"] = authorized_operations(broker, conn, CLUSTER, CLUSTER_NAME)
    if body.get("include_topic_authorized_operations"):
        for t in res["topics"]:
            if t["error_code"] == 0:
                t["topic_authorized_operations"] = authorized_operations(broker, conn, TOPIC, t["name"])
    return answer
