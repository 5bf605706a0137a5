"""Kafka's AclAuthorizer (``authorizer.class.name=kafka.security.authorizer.AclAuthorizer``): who may
do what, from the ACLs in ZooKeeper.

Decision (``AclCache.authorize``), as Kafka decides:

1. a principal named in ``super.users`` may do everything;
2. the ACLs that apply to a resource are those of its LITERAL name, of the LITERAL ``*`` of its type
   and of every PREFIXED pattern its name starts with; when there are none,
   ``allow.everyone.if.no.acl.found`` decides;
3. a DENY entry whose principal (or ``User:*``), host (or ``*``) and operation (or ALL) match wins;
4. otherwise an ALLOW entry that matches allows: its operation is the one asked, ALL, or one that
   implies it (DESCRIBE is implied by READ, WRITE, DELETE and ALTER; DESCRIBE_CONFIGS by
   ALTER_CONFIGS);
5. anything else is denied.

``AclCache.authorize_any`` is KIP-679's "this operation on some resource of the type" (an idempotent
producer without IdempotentWrite on the cluster may still init a producer id when it may Write some
topic): allowed unless a matching DENY on the LITERAL ``*`` exists, when a matching ALLOW pattern
exists that no DENY covers (a DENY on the same LITERAL name, or on a PREFIXED pattern that the ALLOW's
name starts with).

``AclAuthorizer`` keeps the cache equal to ZooKeeper (zk/acls.py): it registers the change watch
before it reads every resource, then re-reads each resource a notification names; ZooKeeper's watch
fires within milliseconds, so a change reaches every broker well within a second. ``version`` grows
with every applied change: callers that keep decisions (a connection's cache, the native path's
per-connection topic sets) drop them when it moves (``on_change``). CreateAcls and DeleteAcls write a
resource's znode compare-and-set and announce it.

Threads: decisions and applied changes on the loop; ZooKeeper reads and writes on worker threads.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
from typing import Callable, Iterable

from ..zk.acls import AclZk, StaleAclVersion
from .acl import (WILDCARD, WILDCARD_PRINCIPAL, AclBinding, AclEntry, Operation, PatternType,
                  Permission, ResourcePattern, ResourceType, camel, decode_acls, decode_change, encode_acls,
                  encode_change, parse_enum)

log = logging.getLogger(__name__)

CLASS_NAMES = ("kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer")

_IMPLIED = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                                   Operation.ALTER, Operation.ALL}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.ALL}),
}


def parse_super_users(text: str | None) -> frozenset[str]:
    """``super.users``: principals separated by semicolons (``User:admin;User:broker``)."""
    return frozenset(p.strip() for p in (text or "").split(";") if p.strip())


class AclCache:
    """The ACLs in memory and the decisions made from them (no I/O)."""

    def __init__(self, super_users: Iterable[str] = (), allow_if_no_acls: bool = False):
        self.super_users = frozenset(super_users)
        self.allow_if_no_acls = allow_if_no_acls
        self._acls: dict[ResourcePattern, frozenset[AclEntry]] = {}
        self._prefixed: dict[ResourceType, dict[str, frozenset[AclEntry]]] = {}
        self._types: dict[ResourceType, int] = {}      # patterns per resource type
        self.version = 0
        self.on_change: list[Callable[[], None]] = []

    # ---- contents ---------------------------------------------------------------------------------
    def set(self, resource: ResourcePattern, entries: Iterable[AclEntry]) -> bool:
        """Make ``resource``'s entries ``entries`` (none: the pattern goes); True when that changed."""
        entries = frozenset(entries)
        old = self._acls.get(resource, frozenset())
        if old == entries:
            return False
        if entries:
            self._acls[resource] = entries
        else:
            self._acls.pop(resource, None)
        self._types[resource.type] = self._types.get(resource.type, 0) + bool(entries) - bool(old)
        if resource.pattern == PatternType.PREFIXED:
            by_name = self._prefixed.setdefault(resource.type, {})
            if entries:
                by_name[resource.name] = entries
            else:
                by_name.pop(resource.name, None)
        self.version += 1
        for fn in self.on_change:
            fn()
        return True

    def get(self, resource: ResourcePattern) -> frozenset[AclEntry]:
        return self._acls.get(resource, frozenset())

    def bindings(self) -> list[AclBinding]:
        return [AclBinding(r, e) for r, entries in self._acls.items() for e in entries]

    def matching(self, rtype: ResourceType, name: str) -> list[AclEntry]:
        """Every entry that applies to resource ``name`` of ``rtype``: its literal name, the literal
        wildcard and each prefix pattern it starts with."""
        acls = self._acls
        out = list(acls.get(ResourcePattern(rtype, name, PatternType.LITERAL), ()))
        if name != WILDCARD:
            out += acls.get(ResourcePattern(rtype, WILDCARD, PatternType.LITERAL), ())
        prefixed = self._prefixed.get(rtype)
        if prefixed:
            if len(prefixed) < len(name):
                for prefix, entries in prefixed.items():
                    if name.startswith(prefix):
                        out += entries
            else:
                for i in range(1, len(name) + 1):
                    out += prefixed.get(name[:i], ())
        return out

    # ---- decisions --------------------------------------------------------------------------------
    def authorize(self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        acls = self.matching(rtype, name)
        if not acls:
            return self.allow_if_no_acls
        for e in acls:
            if e.permission == Permission.DENY and (e.operation == op or e.operation == Operation.ALL) \
                    and _who(e, principal, host):
                return False
        allowed = _IMPLIED.get(op) or (op, Operation.ALL)
        for e in acls:
            if e.permission == Permission.ALLOW and e.operation in allowed and _who(e, principal, host):
                return True
        return False

    def authorize_any(self, principal: str, host: str, op: Operation, rtype: ResourceType) -> bool:
        """May ``principal`` do ``op`` on at least one resource of ``rtype`` (KIP-679)?"""
        if principal in self.super_users:
            return True
        if not self._types.get(rtype):
            return self.allow_if_no_acls
        deny_lit, deny_pre, allow_lit, allow_pre = set(), set(), set(), set()
        for r, entries in self._acls.items():
            if r.type != rtype:
                continue
            for e in entries:
                if (e.operation == op or e.operation == Operation.ALL) and _who(e, principal, host):
                    if e.permission == Permission.DENY:
                        (deny_pre if r.pattern == PatternType.PREFIXED else deny_lit).add(r.name)
                    elif e.permission == Permission.ALLOW:
                        (allow_pre if r.pattern == PatternType.PREFIXED else allow_lit).add(r.name)
        if WILDCARD in deny_lit:
            return False

        def covered(name: str) -> bool:
            return any(name.startswith(p) for p in deny_pre)

        return any(not covered(p) for p in allow_pre) or \
            any(n not in deny_lit and not covered(n) for n in allow_lit)


def _who(e: AclEntry, principal: str, host: str) -> bool:
    return (e.principal == principal or e.principal == WILDCARD_PRINCIPAL) and (e.host == host or e.host == WILDCARD)


def resource_from_zk(kind: str, type_name: str, name: str) -> ResourcePattern:
    return ResourcePattern(parse_enum(ResourceType, type_name), name, PatternType[kind])


class AclAuthorizer(AclCache):
    """AclCache kept equal to ZooKeeper's ACL store (module docstring)."""

    def __init__(self, super_users=(), allow_if_no_acls=False):
        super().__init__(super_users, allow_if_no_acls)
        self.store: AclZk | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._last_seq: dict[str, str | None] = {"LITERAL": None, "PREFIXED": None}   # newest child seen
        self._active = False

    @classmethod
    def from_config(cls, get) -> "AclAuthorizer | None":
        """The authorizer ``authorizer.class.name`` names (None when empty); ValueError for a class
        kbroker does not implement."""
        name = (get("authorizer.class.name") or "").strip()
        if not name:
            return None
        if name not in CLASS_NAMES:
            raise ValueError(f"authorizer.class.name={name}: only {CLASS_NAMES[0]} is implemented")
        return cls(parse_super_users(get("super.users")), bool(get("allow.everyone.if.no.acl.found")))

    def start(self, kazoo, loop, deliver) -> None:
        """Watch the change notifications, then load every resource (worker thread)."""
        self.store, self.loop, self._active = AclZk(kazoo), loop, True
        self.store.ensure_paths()
        for kind in ("LITERAL", "PREFIXED"):
            self.store.watch_changes(kind, lambda children, k=kind: self._on_changes(k, children), deliver,
                                     lambda: self._active)
        loaded = []
        for kind, type_name, name, data, _version in self.store.read_all():
            try:
                loaded.append((resource_from_zk(kind, type_name, name), decode_acls(data)))
            except (ValueError, KeyError, TypeError):
                log.error("unreadable ACL znode %s/%s/%s: ignored", kind, type_name, name)
        loop.call_soon_threadsafe(self._apply, loaded)

    def stop(self) -> None:
        self._active = False

    def _apply(self, loaded) -> None:
        for resource, entries in loaded:
            self.set(resource, entries)

    def _on_changes(self, kind: str, children: list[str]) -> None:
        """Notification children (loop; sorted: ZooKeeper's sequence suffixes are zero-padded, so
        names sort as their numbers): re-read the resources named by the ones after the last seen
        (the first call only records where we are: the full load covers what came before). A burst
        of N notifications fires the watch N times with up to N children each: a binary search
        keeps each call's work on the loop small."""
        last = self._last_seq[kind]
        self._last_seq[kind] = children[-1] if children else (last if last is not None else "")
        if last is None:
            return
        fresh = children[bisect.bisect_right(children, last):]
        if fresh:
            self.loop.create_task(self._reload(kind, fresh))

    async def _reload(self, kind: str, children: list[str]) -> None:
        try:
            loaded = await asyncio.to_thread(self._read_named, kind, children)
        except Exception:
            log.exception("reading ACL change notifications failed")
            return
        self._apply(loaded)

    def _read_named(self, kind: str, children) -> list:
        out = []
        for data in self.store.read_changes(kind, children):
            try:
                resource = decode_change(data, kind != "LITERAL")
            except (ValueError, KeyError, TypeError):
                log.error("unreadable ACL change notification %r: ignored", data[:100])
                continue
            out.append((resource, self._read_resource(resource)[0]))
        return out

    def _read_resource(self, r: ResourcePattern) -> tuple[frozenset[AclEntry], int]:
        data, version = self.store.read(r.pattern.name, camel(r.type), r.name)
        try:
            return decode_acls(data), version
        except (ValueError, KeyError, TypeError):
            log.error("unreadable ACL znode for %s: replaced on write", r)
            return frozenset(), version

    # ---- CreateAcls / DeleteAcls (worker thread) ----------------------------------------------------
    def update(self, resource: ResourcePattern, change: Callable[[frozenset], frozenset]) -> frozenset:
        """Apply ``change(current entries) -> new entries`` to ``resource``'s znode compare-and-set,
        retried until no other writer came in between, and announce it; the new entries (also
        applied to this broker's cache on the loop)."""
        while True:
            current, version = self._read_resource(resource)
            new = frozenset(change(current))
            if new == current:
                return new
            try:
                self.store.write(resource.pattern.name, camel(resource.type), resource.name,
                                 encode_acls(new) if new else None, version)
            except StaleAclVersion:
                continue
            self.store.notify(resource.pattern.name, encode_change(resource))
            self.loop.call_soon_threadsafe(self.set, resource, new)
            return new
