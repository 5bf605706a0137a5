"""AclCache's decisions (kbroker/security/authorizer.py) and the ACL JSON (kbroker/security/acl.py)."""
import pytest

from kbroker.security.acl import (AclEntry, Operation as Op, PatternType as P, Permission, ResourcePattern,
                                  ResourceType as T, decode_acls, decode_change, encode_acls, encode_change,
                                  parse_enum)
from kbroker.security.authorizer import AclAuthorizer, AclCache, parse_super_users

ALICE, BOB = "User:alice", "User:bob"
H1, H2 = "127.0.0.1", "127.0.0.2"


def allow(principal, op, host="*"):
    return AclEntry(principal, host, op, Permission.ALLOW)


def deny(principal, op, host="*"):
    return AclEntry(principal, host, op, Permission.DENY)


def topic(name, pattern=P.LITERAL):
    return ResourcePattern(T.TOPIC, name, pattern)


def test_no_acls_follows_allow_everyone():
    assert not AclCache().authorize(ALICE, H1, Op.READ, T.TOPIC, "t")
    assert AclCache(allow_if_no_acls=True).authorize(ALICE, H1, Op.READ, T.TOPIC, "t")
    # once the resource has any ACL, the flag no longer applies
    c = AclCache(allow_if_no_acls=True)
    c.set(topic("t"), [allow(BOB, Op.READ)])
    assert not c.authorize(ALICE, H1, Op.READ, T.TOPIC, "t")
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "other")


def test_super_user_bypasses_deny():
    c = AclCache(super_users=parse_super_users("User:admin; User:broker"))
    c.set(topic("*"), [deny("User:*", Op.ALL)])
    assert c.authorize("User:admin", H1, Op.DELETE, T.TOPIC, "t")
    assert c.authorize("User:broker", H1, Op.CLUSTER_ACTION, T.CLUSTER, "kafka-cluster")
    assert not c.authorize(ALICE, H1, Op.READ, T.TOPIC, "t")


def test_deny_wins_over_allow():
    c = AclCache()
    c.set(topic("t"), [allow(ALICE, Op.ALL), deny(ALICE, Op.WRITE)])
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "t")
    assert not c.authorize(ALICE, H1, Op.WRITE, T.TOPIC, "t")
    # a DENY on the wildcard or a prefix beats a literal ALLOW
    c.set(topic("pay", P.PREFIXED), [deny(ALICE, Op.READ)])
    c.set(topic("payments"), [allow(ALICE, Op.READ)])
    assert not c.authorize(ALICE, H1, Op.READ, T.TOPIC, "payments")


def test_patterns_literal_wildcard_prefixed():
    c = AclCache()
    c.set(topic("orders"), [allow(ALICE, Op.READ)])
    c.set(topic("*"), [allow(BOB, Op.WRITE)])
    c.set(topic("log-", P.PREFIXED), [allow(ALICE, Op.WRITE)])
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "orders")
    assert not c.authorize(ALICE, H1, Op.READ, T.TOPIC, "orders2")
    assert c.authorize(BOB, H1, Op.WRITE, T.TOPIC, "anything")
    assert c.authorize(ALICE, H1, Op.WRITE, T.TOPIC, "log-app")
    assert not c.authorize(ALICE, H1, Op.WRITE, T.TOPIC, "log")
    # a pattern of another resource type never applies
    assert not c.authorize(ALICE, H1, Op.READ, T.GROUP, "orders")
    # PREFIXED "*" is a prefix of names that start with "*", not a wildcard
    c2 = AclCache()
    c2.set(topic("*", P.PREFIXED), [allow(ALICE, Op.READ)])
    assert not c2.authorize(ALICE, H1, Op.READ, T.TOPIC, "t")


def test_many_prefixes_either_lookup_order():
    c = AclCache()
    for i in range(50):
        c.set(topic(f"p{i}-", P.PREFIXED), [allow(ALICE, Op.READ)])
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "p7-x")          # name shorter than the pattern count
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "p7-" + "x" * 100)
    assert not c.authorize(ALICE, H1, Op.READ, T.TOPIC, "q7-" + "x" * 100)


def test_hosts_and_wildcard_principal():
    c = AclCache()
    c.set(topic("t"), [allow("User:*", Op.READ, H1)])
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "t")
    assert c.authorize(BOB, H1, Op.READ, T.TOPIC, "t")
    assert not c.authorize(ALICE, H2, Op.READ, T.TOPIC, "t")
    c.set(topic("t"), [allow("User:*", Op.READ), deny(ALICE, Op.READ, H2)])
    assert c.authorize(ALICE, H1, Op.READ, T.TOPIC, "t")
    assert not c.authorize(ALICE, H2, Op.READ, T.TOPIC, "t")


@pytest.mark.parametrize("granted, asked, ok", [
    (Op.READ, Op.DESCRIBE, True), (Op.WRITE, Op.DESCRIBE, True), (Op.DELETE, Op.DESCRIBE, True),
    (Op.ALTER, Op.DESCRIBE, True), (Op.CREATE, Op.DESCRIBE, False),
    (Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, True), (Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, False),
    (Op.DESCRIBE, Op.READ, False), (Op.ALL, Op.ALTER_CONFIGS, True), (Op.READ, Op.WRITE, False),
])
def test_implied_operations(granted, asked, ok):
    c = AclCache()
    c.set(topic("t"), [allow(ALICE, granted)])
    assert c.authorize(ALICE, H1, asked, T.TOPIC, "t") is ok


def test_implied_operations_do_not_imply_denies():
    # A DENY of READ does not deny DESCRIBE (Kafka: a deny matches the operation asked or ALL only)
    c = AclCache()
    c.set(topic("t"), [deny(ALICE, Op.READ), allow(ALICE, Op.DESCRIBE)])
    assert c.authorize(ALICE, H1, Op.DESCRIBE, T.TOPIC, "t")


def test_authorize_any_kip679():
    c = AclCache()
    assert not c.authorize_any(ALICE, H1, Op.WRITE, T.TOPIC)
    c.set(topic("a"), [allow(ALICE, Op.WRITE)])
    assert c.authorize_any(ALICE, H1, Op.WRITE, T.TOPIC)
    assert not c.authorize_any(BOB, H1, Op.WRITE, T.TOPIC)
    c.set(topic("a", P.PREFIXED), [deny(ALICE, Op.WRITE)])        # covers the only allow
    assert not c.authorize_any(ALICE, H1, Op.WRITE, T.TOPIC)
    c.set(topic("b-", P.PREFIXED), [allow(ALICE, Op.ALL)])
    assert c.authorize_any(ALICE, H1, Op.WRITE, T.TOPIC)
    c.set(topic("*"), [deny(ALICE, Op.WRITE)])
    assert not c.authorize_any(ALICE, H1, Op.WRITE, T.TOPIC)
    assert AclCache(super_users=[ALICE]).authorize_any(ALICE, H1, Op.WRITE, T.TOPIC)


def test_version_and_on_change():
    c = AclCache()
    seen = []
    c.on_change.append(lambda: seen.append(c.version))
    assert c.set(topic("t"), [allow(ALICE, Op.READ)])
    assert not c.set(topic("t"), [allow(ALICE, Op.READ)])      # unchanged: no bump
    assert c.set(topic("t"), [])
    assert seen == [1, 2] and c.bindings() == []


def test_json_as_kafka_writes_it():
    entries = {allow(ALICE, Op.CLUSTER_ACTION, H1), deny("User:*", Op.DESCRIBE_CONFIGS)}
    data = encode_acls(entries)
    assert b'"operation":"ClusterAction"' in data and b'"permissionType":"Deny"' in data
    assert data.startswith(b'{"version":1,"acls":[')
    assert decode_acls(data) == entries
    assert decode_acls(b'{"version":1,"acls":[{"principal":"User:x","permissionType":"Allow",'
                       b'"operation":"IdempotentWrite","host":"*"}]}') == {allow("User:x", Op.IDEMPOTENT_WRITE)}
    with pytest.raises(ValueError):
        decode_acls(b'{"version":2,"acls":[]}')


def test_change_notifications_as_kafka_writes_them():
    lit = ResourcePattern(T.TRANSACTIONAL_ID, "tx-1", P.LITERAL)
    assert encode_change(lit) == b"TransactionalId:tx-1"
    assert decode_change(b"TransactionalId:tx-1", extended=False) == lit
    pre = topic("log-", P.PREFIXED)
    data = encode_change(pre)
    assert data == b'{"version":1,"resourceType":"Topic","name":"log-","patternType":"PREFIXED"}'
    assert decode_change(data, extended=True) == pre


def test_enum_spellings():
    assert parse_enum(Op, "ClusterAction") is Op.CLUSTER_ACTION
    assert parse_enum(Op, "cluster_action") is Op.CLUSTER_ACTION
    assert parse_enum(T, "transactional-id") is T.TRANSACTIONAL_ID
    with pytest.raises(ValueError):
        parse_enum(Op, "Fly")


def test_from_config():
    conf = {"authorizer.class.name": "", "super.users": None, "allow.everyone.if.no.acl.found": False}
    assert AclAuthorizer.from_config(conf.get) is None
    conf["authorizer.class.name"] = "kafka.security.authorizer.AclAuthorizer"
    conf["super.users"] = "User:admin;User:ops"
    a = AclAuthorizer.from_config(conf.get)
    assert a.super_users == {"User:admin", "User:ops"} and not a.allow_if_no_acls
    conf["authorizer.class.name"] = "com.example.Mine"
    with pytest.raises(ValueError):
        AclAuthorizer.from_config(conf.get)
