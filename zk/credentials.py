"""SCRAM credentials in ZooKeeper as Kafka keeps them: ``/config/users/<user>`` holds the user's
entity config (``{"version":1,"config":{"SCRAM-SHA-512":"salt=..,stored_key=..,server_key=..,
iterations=.."}}``, beside any quota keys of the same user), and every change posts a
``users/<user>`` notification under ``/config/changes``. The credential text itself is
``kbroker.security.sasl.scram.ScramCredential``'s; this module only reads and writes the znodes."""
from __future__ import annotations

from kazoo.exceptions import BadVersionError, NoNodeError, NodeExistsError

from . import layout as L

CONFIG_USERS = "/config/users"


def user_path(user: str) -> str:
    if not user or "/" in user or user in (".", ".."):
        raise ValueError(f"invalid user name {user!r}")
    return f"{CONFIG_USERS}/{user}"


def get_user_config(kazoo, user: str) -> dict[str, str]:
    """The user's entity config ({} when it has none)."""
    try:
        data, _ = kazoo.retry(kazoo.get, user_path(user))
    except NoNodeError:
        return {}
    return L.decode_config(data)


def list_users(kazoo) -> list[str]:
    try:
        return sorted(kazoo.retry(kazoo.get_children, CONFIG_USERS))
    except NoNodeError:
        return []


def alter_user_config(kazoo, user: str, set_: dict[str, str], delete=()) -> dict[str, str]:
    """Set and remove keys of the user's entity config with a "users/<user>" change notification.
    -> the new config."""
    user_path(user)
    return alter_entity_config(kazoo, f"users/{user}", set_, delete)


def alter_entity_config(kazoo, entity: str, set_: dict[str, str], delete=()) -> dict[str, str]:
    """Set and remove keys of the config at ``/config/<entity>`` (e.g. "users/alice/clients/app") with
    a change notification naming ``entity``, in one multi-op (compare-and-set on the znode, retried on
    a concurrent write). -> the new config."""
    path = f"/config/{entity}"
    kazoo.retry(kazoo.ensure_path, path.rsplit("/", 1)[0])
    kazoo.retry(kazoo.ensure_path, L.CONFIG_CHANGES)
    for _ in range(10):
        try:
            data, stat = kazoo.retry(kazoo.get, path)
            current = L.decode_config(data)
        except NoNodeError:
            stat, current = None, {}
        new = {k: v for k, v in current.items() if k not in set(delete)}
        new.update(set_)
        tx = kazoo.transaction()
        if stat is None:
            tx.create(path, L.encode_config(new))
        else:
            tx.set_data(path, L.encode_config(new), version=stat.version)
        entity_type, _, entity_name = entity.partition("/")
        tx.create(L.CONFIG_CHANGE_PREFIX, L.encode_config_change(entity_type, entity_name), sequence=True)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return new
        if not any(isinstance(r, (BadVersionError, NodeExistsError, NoNodeError)) for r in results):
            raise RuntimeError(f"writing {path} failed: {results!r}")
    raise RuntimeError(f"{path} kept changing")
