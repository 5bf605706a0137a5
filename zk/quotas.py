"""Client quota configs in ZooKeeper as Kafka's ZooKeeper mode keeps them: the entity's config znode
(``{"version":1,"config":{"producer_byte_rate":"1048576",...}}``) at

- ``/config/users/<user>/clients/<client-id>``, ``/config/users/<user>``,
- ``/config/clients/<client-id>``,
- ``/config/ips/<ip>`` (KIP-612 connection rates; the address as written, or ``<default>``),

with ``<default>`` as the name of a default entity, names sanitized as Kafka's Sanitizer does (URL
encoding, ``*`` as ``%2A``), and every change announced by a ``/config/changes/config_change_<seq>``
notification naming the entity path (``users/alice/clients/app``). A user's znode also holds its SCRAM
credentials (zk/credentials.py): writes here keep the keys they do not name.

An entity is ``(user, client)``, each the unsanitized name, ``DEFAULT`` or None (no such part).
Threads: every function blocks on ZooKeeper (worker threads).
"""
from __future__ import annotations

from urllib.parse import quote, unquote

from kazoo.exceptions import NoNodeError

from . import layout as L
from .credentials import alter_entity_config

DEFAULT = "<default>"
CONFIG = "/config"


def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize: the name as one znode path element (the default stays as it is)."""
    return name if name == DEFAULT else quote(name, safe="")


def desanitize(element: str) -> str:
    return element if element == DEFAULT else unquote(element)


def entity_path(user: str | None, client: str | None) -> str:
    """The entity's path below /config (also the change notification's ``entity_path``)."""
    if user is None and client is None:
        raise ValueError("a quota entity names a user, a client-id or both")
    parts = []
    if user is not None:
        parts += ["users", sanitize(user)]
    if client is not None:
        parts += ["clients", sanitize(client)]
    return "/".join(parts)


def parse_entity_path(path: str) -> tuple[str | None, str | None]:
    """``users/<u>[/clients/<c>]`` or ``clients/<c>`` -> (user, client); ValueError otherwise."""
    parts = path.split("/")
    if len(parts) == 2 and parts[0] in ("users", "clients") and parts[1]:
        name = desanitize(parts[1])
        return (name, None) if parts[0] == "users" else (None, name)
    if len(parts) == 4 and parts[0] == "users" and parts[2] == "clients" and parts[1] and parts[3]:
        return desanitize(parts[1]), desanitize(parts[3])
    raise ValueError(f"not a client quota entity path: {path!r}")


def _config(kazoo, path: str) -> dict[str, str] | None:
    try:
        data, _ = kazoo.retry(kazoo.get, f"{CONFIG}/{path}")
    except NoNodeError:
        return None
    return L.decode_config(data)


def read_entity(kazoo, user: str | None, client: str | None) -> dict[str, str]:
    """The entity's whole config ({} when its znode does not exist)."""
    return _config(kazoo, entity_path(user, client)) or {}


def _children(kazoo, path: str) -> list[str]:
    try:
        return kazoo.retry(kazoo.get_children, f"{CONFIG}/{path}")
    except NoNodeError:
        return []


def read_all(kazoo) -> dict[tuple[str | None, str | None], dict[str, str]]:
    """Every user, user/client and client entity's config (entities with a znode but no keys too)."""
    out = {}
    for u in _children(kazoo, "users"):
        user = desanitize(u)
        got = _config(kazoo, f"users/{u}")
        if got is not None:
            out[(user, None)] = got
        for c in _children(kazoo, f"users/{u}/clients"):
            got = _config(kazoo, f"users/{u}/clients/{c}")
            if got is not None:
                out[(user, desanitize(c))] = got
    for c in _children(kazoo, "clients"):
        got = _config(kazoo, f"clients/{c}")
        if got is not None:
            out[(None, desanitize(c))] = got
    return out


def alter_entity(kazoo, user: str | None, client: str | None, set_: dict[str, str], delete=()) -> dict[str, str]:
    """Set and remove keys of the entity's config, announced by a change notification; the new config."""
    return alter_entity_config(kazoo, entity_path(user, client), set_, delete)


def ip_entity(path: str) -> str | None:
    """The address (or DEFAULT) of an ``ips/<ip>`` change notification's entity path, else None."""
    kind, _, name = path.partition("/")
    return name if kind == "ips" and name and "/" not in name else None


def read_ip(kazoo, ip: str) -> dict[str, str]:
    return _config(kazoo, f"ips/{ip}") or {}


def read_ips(kazoo) -> dict[str, dict[str, str]]:
    """Every ``ips/<ip>`` entity's config, by address (or DEFAULT)."""
    out = {}
    for ip in _children(kazoo, "ips"):
        got = _config(kazoo, f"ips/{ip}")
        if got is not None:
            out[ip] = got
    return out


def alter_ip(kazoo, ip: str, set_: dict[str, str], delete=()) -> dict[str, str]:
    return alter_entity_config(kazoo, f"ips/{ip}", set_, delete)
