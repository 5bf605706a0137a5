"""ACLs as Kafka models them: a resource pattern (type, name, pattern type) and entries (principal,
host, operation, permission), with the codes of Kafka's wire protocol and the JSON Kafka's ZooKeeper
mode stores under ``/kafka-acl`` and ``/kafka-acl-extended/prefixed``.

The znode of a LITERAL pattern is ``/kafka-acl/<Type>/<name>``, of a PREFIXED one
``/kafka-acl-extended/prefixed/<Type>/<name>``; its data is
``{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}``.
A change is announced by a sequential znode: ``/kafka-acl-changes/acl_changes_`` holding
``Topic:name`` for a literal pattern, ``/kafka-acl-extended-changes/acl_changes_`` holding
``{"version":1,"resourceType":"Topic","name":"p","patternType":"PREFIXED"}`` for the others.
"""
from __future__ import annotations

import enum
import json
from typing import NamedTuple

WILDCARD = "*"                  # a LITERAL name matching every resource of its type; also any host
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


def camel(member: enum.Enum) -> str:
    """Kafka's name of an enum member in JSON and paths: CLUSTER_ACTION -> ClusterAction."""
    return "".join(w.capitalize() for w in member.name.split("_"))


def _by_camel(cls) -> dict[str, enum.Enum]:
    return {camel(m).lower(): m for m in cls}


_TYPES, _OPS, _PERMS, _PATTERNS = (_by_camel(ResourceType), _by_camel(Operation), _by_camel(Permission),
                                   _by_camel(PatternType))


def parse_enum(cls, text: str):
    """A member from Kafka's spelling, case and underscores ignored (``ClusterAction``,
    ``cluster_action``, ``CLUSTER-ACTION``); ValueError for anything else."""
    table = {ResourceType: _TYPES, Operation: _OPS, Permission: _PERMS, PatternType: _PATTERNS}[cls]
    key = text.replace("_", "").replace("-", "").lower()
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"unknown {cls.__name__} {text!r}") from None


# The operations each resource type knows (Kafka's ACL documentation); a binding with any other is
# refused by CreateAcls with INVALID_REQUEST.
VALID_OPERATIONS: dict[ResourceType, frozenset] = {
    ResourceType.TOPIC: frozenset({Operation.ALL, Operation.READ, Operation.WRITE, Operation.CREATE,
                                   Operation.DELETE, Operation.ALTER, Operation.DESCRIBE,
                                   Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({Operation.ALL, Operation.READ, Operation.DELETE, Operation.DESCRIBE}),
    ResourceType.CLUSTER: frozenset({Operation.ALL, Operation.CREATE, Operation.ALTER, Operation.DESCRIBE,
                                     Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                                     Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.ALL, Operation.WRITE, Operation.DESCRIBE}),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.ALL, Operation.DESCRIBE}),
    ResourceType.USER: frozenset({Operation.ALL, Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS}),
}


class ResourcePattern(NamedTuple):
    type: ResourceType
    name: str
    pattern: PatternType


class AclEntry(NamedTuple):
    principal: str          # "User:alice", "User:*"
    host: str               # an IP address or "*"
    operation: Operation
    permission: Permission


class AclBinding(NamedTuple):
    resource: ResourcePattern
    entry: AclEntry


# ---- Kafka's JSON -----------------------------------------------------------------------------------

def encode_acls(entries) -> bytes:
    """The data of a resource's znode (entries sorted, so equal sets give equal bytes)."""
    acls = [{"principal": e.principal, "permissionType": camel(e.permission), "operation": camel(e.operation),
             "host": e.host} for e in sorted(set(entries))]
    return json.dumps({"version": 1, "acls": acls}, separators=(",", ":")).encode()


def decode_acls(data: bytes | None) -> frozenset[AclEntry]:
    """A resource znode's entries; empty for a missing or empty znode. ValueError when unreadable."""
    if not data:
        return frozenset()
    obj = json.loads(data)
    if not isinstance(obj, dict) or obj.get("version") != 1:
        raise ValueError(f"unsupported ACL znode data {data[:80]!r}")
    out = set()
    for a in obj.get("acls") or ():
        out.add(AclEntry(str(a["principal"]), str(a["host"]), parse_enum(Operation, a["operation"]),
                         parse_enum(Permission, a["permissionType"])))
    return frozenset(out)


def encode_change(resource: ResourcePattern) -> bytes:
    """A change notification's data: ``Type:name`` for a literal pattern, JSON for the others."""
    if resource.pattern == PatternType.LITERAL:
        return f"{camel(resource.type)}:{resource.name}".encode()
    return json.dumps({"version": 1, "resourceType": camel(resource.type), "name": resource.name,
                       "patternType": camel(resource.pattern).upper()}, separators=(",", ":")).encode()


def decode_change(data: bytes, extended: bool) -> ResourcePattern:
    """The resource a change notification names (``extended``: from /kafka-acl-extended-changes)."""
    text = data.decode()
    if not extended:
        kind, _, name = text.partition(":")
        return ResourcePattern(parse_enum(ResourceType, kind), name, PatternType.LITERAL)
    obj = json.loads(text)
    return ResourcePattern(parse_enum(ResourceType, obj["resourceType"]), obj["name"],
                           parse_enum(PatternType, obj["patternType"]))


def valid_principal(principal: str) -> bool:
    """``Type:name`` with both parts non-empty (Kafka's KafkaPrincipal parse)."""
    kind, sep, name = principal.partition(":")
    return bool(kind and sep and name)


class AclFilter(NamedTuple):
    """DescribeAcls / DeleteAcls filter, as Kafka's AclBindingFilter: None names, principals and
    hosts match anything; ANY matches any type, pattern, operation or permission; a MATCH pattern
    matches the patterns that would apply to the named resource (its literal name, the literal
    wildcard, each prefix of it)."""
    rtype: ResourceType
    name: str | None
    pattern: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    def unknown(self) -> bool:
        """A field Kafka refuses in a filter (UNKNOWN)."""
        return (self.rtype == ResourceType.UNKNOWN or self.pattern == PatternType.UNKNOWN
                or self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN)

    def matches_pattern(self, r: ResourcePattern) -> bool:
        if self.rtype != ResourceType.ANY and self.rtype != r.type:
            return False
        if self.pattern not in (PatternType.ANY, PatternType.MATCH) and self.pattern != r.pattern:
            return False
        if self.name is None:
            return True
        if self.pattern in (PatternType.ANY, r.pattern):
            return self.name == r.name
        if r.pattern == PatternType.LITERAL:
            return self.name == r.name or r.name == WILDCARD
        return self.name.startswith(r.name)

    def matches_entry(self, e: AclEntry) -> bool:
        return ((self.principal is None or self.principal == e.principal)
                and (self.host is None or self.host == e.host)
                and (self.operation == Operation.ANY or self.operation == e.operation)
                and (self.permission == Permission.ANY or self.permission == e.permission))

    def matches(self, b: AclBinding) -> bool:
        return self.matches_pattern(b.resource) and self.matches_entry(b.entry)


def binding_error(b: AclBinding) -> str | None:
    """Why CreateAcls refuses a binding (INVALID_REQUEST), or None when it is valid."""
    r, e = b.resource, b.entry
    if r.type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return "Invalid resource type"
    if r.pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid pattern type {r.pattern.name}: only LITERAL and PREFIXED ACLs can be created"
    if not r.name:
        return "Invalid empty resource name specified"
    if r.type == ResourceType.CLUSTER and r.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if e.operation not in VALID_OPERATIONS.get(r.type, ()):
        return f"Operation {e.operation.name} is not valid for resource type {r.type.name}"
    if e.permission not in (Permission.ALLOW, Permission.DENY):
        return "Invalid permission type"
    if not valid_principal(e.principal):
        return f"Invalid principal {e.principal!r}"
    if not e.host:
        return "Invalid empty host"
    return None


def code_of(cls, value: int):
    """An enum member from its wire code, UNKNOWN for a code Kafka does not define."""
    try:
        return cls(value)
    except ValueError:
        return cls(0)
