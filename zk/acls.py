"""ACL storage in Kafka's ZooKeeper layout: one znode per resource pattern holding its entries' JSON
(the JSON itself is kbroker.security.acl's), and the sequential change notifications every broker
watches. I/O only: callers hand in and get back bytes.

LITERAL patterns live under ``/kafka-acl/<Type>/<name>`` and announce changes in
``/kafka-acl-changes``; PREFIXED ones under ``/kafka-acl-extended/prefixed/<Type>/<name>`` with
``/kafka-acl-extended-changes``. Writes are compare-and-set on the znode version, so two brokers
adding entries to one resource at once cannot lose either (the loser re-reads and retries).

Threads: every method blocks on ZooKeeper (worker threads); watch callbacks run on kazoo's thread and
only hand over (``deliver``).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.security import READ_ACL_UNSAFE, make_acl

log = logging.getLogger("kbroker.zk")

ROOTS = {"LITERAL": "/kafka-acl", "PREFIXED": "/kafka-acl-extended/prefixed"}
CHANGES = {"LITERAL": "/kafka-acl-changes", "PREFIXED": "/kafka-acl-extended-changes"}
CHANGE_PREFIX = "acl_changes_"
# Every path the ACL store owns (zookeeper.set.acl protects these as it does the broker's own).
PATHS = tuple(ROOTS.values()) + tuple(CHANGES.values())
# Notifications older than this are deleted by the broker that reads them (Kafka's 15 minutes): every
# live broker has applied them long before; a broker that starts reads the whole store anyway.
CHANGE_EXPIRY_MS = 15 * 60 * 1000


class StaleAclVersion(Exception):
    """The resource's znode changed since it was read."""


def resource_path(kind: str, type_name: str, name: str) -> str:
    return f"{ROOTS[kind]}/{type_name}/{name}"


class AclZk:
    """The ACL znodes over a started kazoo client."""

    def __init__(self, kazoo):
        self.zk = kazoo

    def ensure_paths(self) -> None:
        for path in PATHS:
            self.zk.retry(self.zk.ensure_path, path)

    def read_all(self) -> list[tuple[str, str, str, bytes, int]]:
        """(kind, type name, resource name, data, version) of every resource znode."""
        zk, out = self.zk, []
        for kind, root in ROOTS.items():
            try:
                types = zk.retry(zk.get_children, root)
            except NoNodeError:
                continue
            for type_name in types:
                try:
                    names = zk.retry(zk.get_children, f"{root}/{type_name}")
                except NoNodeError:
                    continue
                for name in names:
                    got = self.read(kind, type_name, name)
                    if got[1] >= 0:
                        out.append((kind, type_name, name) + got)
        return out

    def read(self, kind: str, type_name: str, name: str) -> tuple[bytes, int]:
        """(data, version) of one resource's znode; (b"", -1) when it does not exist."""
        try:
            data, stat = self.zk.retry(self.zk.get, resource_path(kind, type_name, name))
        except NoNodeError:
            return b"", -1
        return data or b"", stat.version

    def write(self, kind: str, type_name: str, name: str, data: bytes | None, version: int) -> None:
        """Set (``data``) or delete (None) the resource's znode if it is still at ``version`` (-1: it
        did not exist); StaleAclVersion otherwise."""
        zk, path = self.zk, resource_path(kind, type_name, name)
        try:
            if data is None:
                if version >= 0:
                    zk.retry(zk.delete, path, version=version)
            elif version < 0:
                zk.retry(zk.create, path, data, makepath=True)
            else:
                zk.retry(zk.set, path, data, version=version)
        except (BadVersionError, NodeExistsError, NoNodeError) as exc:
            raise StaleAclVersion(path) from exc
        except NotEmptyError as exc:
            raise StaleAclVersion(path) from exc

    def notify(self, kind: str, data: bytes) -> str:
        """Announce a changed resource to every broker; the notification's path."""
        return self.zk.retry(self.zk.create, f"{CHANGES[kind]}/{CHANGE_PREFIX}", data, sequence=True,
                             makepath=True)

    def read_changes(self, kind: str, children) -> list[bytes]:
        """The data of the named notifications (gone ones skipped); those older than
        CHANGE_EXPIRY_MS are deleted once read."""
        zk, out = self.zk, []
        now_ms = time.time() * 1000
        for child in children:
            path = f"{CHANGES[kind]}/{child}"
            try:
                data, stat = zk.retry(zk.get, path)
            except NoNodeError:
                continue
            out.append(data or b"")
            if now_ms - stat.ctime > CHANGE_EXPIRY_MS:
                try:
                    zk.retry(zk.delete, path)
                except NoNodeError:
                    pass
        return out

    def watch_changes(self, kind: str, callback: Callable[[list[str]], None],
                      deliver: Callable, active: Callable[[], bool]) -> None:
        """``callback(sorted children)`` through ``deliver`` now and on every change of the kind's
        notification znode, until ``active()`` turns false."""
        self.zk.retry(self.zk.ensure_path, CHANGES[kind])

        def on_children(children):
            if not active():
                return False
            deliver(callback, sorted(c for c in children if c.startswith(CHANGE_PREFIX)))
            return None

        self.zk.ChildrenWatch(CHANGES[kind], on_children)


# ---- ZooKeeper's own ACLs on the znodes a broker creates (zookeeper.set.acl) -------------------------

# Where secrets live (SCRAM credentials, broker configs with passwords): no world read, as Kafka.
SENSITIVE_PATHS = ("/config/users", "/config/brokers")


def digest_auth(credentials: str) -> list[tuple[str, str]]:
    """kazoo's ``auth_data`` for ``user:password`` (ZooKeeper's digest scheme); ValueError when the
    text is not of that form."""
    user, sep, password = credentials.partition(":")
    if not (user and sep and password):
        raise ValueError("ZooKeeper digest credentials must be user:password")
    return [("digest", credentials)]


def secure_acls(sensitive: bool = False) -> list:
    """What Kafka gives a znode when zookeeper.set.acl is on: everything for the identity that created
    it (every broker authenticates as the same one), read for everyone else unless ``sensitive``."""
    creator = make_acl("auth", "", all=True)
    return [creator] if sensitive else [creator] + list(READ_ACL_UNSAFE)
