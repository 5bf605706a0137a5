"""The one table of the APIs this broker serves: key, advertised versions, handler.

ApiVersions' answer (``api.SUPPORTED``) and the broker's dispatch dict are both built from ``TABLE``;
no API is declared anywhere else. A handler is ``handle(broker, conn, header, body)`` and returns a
response dict, an awaitable of one, ``NO_RESPONSE`` or ``CLOSE`` (kbroker.network.connection).
One module per API family holds the handlers.

The group and admin APIs advertise Kafka 3.9's whole ranges (clients of a ZooKeeper-era cluster send
their oldest versions); the data path and controller APIs the versions we serve. A row outside its
schema's valid range, or a key declared twice, fails at import.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from ...protocol import api
from ...protocol.api import ApiKey
from ...protocol.errors import Errors
from . import (acls, admin, authz, cluster_info, configs, controlled_shutdown, coordinator, core, fetch, groups,
               log_admin, produce, producer_ids, producers, quotas, reassignments, replica_control, sasl, transactions)


class Api(NamedTuple):
    key: ApiKey
    min_version: int
    max_version: int
    handle: Callable


# Controller -> broker handlers take the request body only (the epoch checks need nothing else); the
# sender must hold ClusterAction on the cluster (brokers do; a client's forged request changes nothing).
_REFUSED = {"error_code": int(Errors.CLUSTER_AUTHORIZATION_FAILED)}


def _leader_and_isr(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.CLUSTER_ACTION):
        return dict(_REFUSED, topics=[])
    return replica_control.leader_and_isr(broker, body)


def _stop_replica(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.CLUSTER_ACTION):
        return dict(_REFUSED, partition_errors=[])
    return replica_control.stop_replica(broker, body)


def _update_metadata(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.CLUSTER_ACTION):
        return dict(_REFUSED)
    return replica_control.update_metadata(broker, body)


def _controlled_shutdown(broker, conn, header, body):
    if not authz.cluster(broker, conn, authz.CLUSTER_ACTION):
        return dict(_REFUSED, remaining_partitions=[])
    return controlled_shutdown.controlled_shutdown(broker, body)


K = ApiKey
TABLE: tuple[Api, ...] = (
    # Advertised from v0 (librdkafka 2.0 disables compression when Produce min > 0); requests below
    # api.PRODUCE_MIN_SERVED (v3, the first to carry magic-2 batches) get UNSUPPORTED_VERSION.
    Api(K.PRODUCE, 0, 11, produce.handle),
    # v0-3 answers would need magic 0/1 message sets: each partition gets UNSUPPORTED_VERSION (fetch.py).
    Api(K.FETCH, 0, 17, fetch.handle),
    Api(K.LIST_OFFSETS, 0, 9, fetch.handle_list_offsets),
    Api(K.METADATA, 0, 12, core.metadata),
    # Controller -> broker (ZooKeeper mode): the versions our controller sends.
    Api(K.LEADER_AND_ISR, 5, 5, _leader_and_isr),
    Api(K.STOP_REPLICA, 3, 3, _stop_replica),
    Api(K.UPDATE_METADATA, 7, 7, _update_metadata),
    Api(K.CONTROLLED_SHUTDOWN, 3, 3, _controlled_shutdown),
    Api(K.OFFSET_COMMIT, 0, 9, groups.offset_commit),
    Api(K.OFFSET_FETCH, 0, 9, groups.offset_fetch),
    Api(K.FIND_COORDINATOR, 0, 6, coordinator.find_coordinator),
    Api(K.JOIN_GROUP, 0, 9, groups.join_group),
    Api(K.HEARTBEAT, 0, 4, groups.heartbeat),
    Api(K.LEAVE_GROUP, 0, 5, groups.leave_group),
    Api(K.SYNC_GROUP, 0, 5, groups.sync_group),
    Api(K.DESCRIBE_GROUPS, 0, 5, groups.describe_groups),
    Api(K.LIST_GROUPS, 0, 5, groups.list_groups),
    # Newer requests get the KIP-511 answer (v0 body, UNSUPPORTED_VERSION, our range).
    Api(K.API_VERSIONS, 0, 4, core.api_versions),
    Api(K.CREATE_TOPICS, 0, 7, admin.create_topics),
    Api(K.DELETE_TOPICS, 0, 6, admin.delete_topics),
    Api(K.DELETE_RECORDS, 0, 2, log_admin.delete_records),
    Api(K.INIT_PRODUCER_ID, 0, 5, producer_ids.init_producer_id),
    Api(K.OFFSET_FOR_LEADER_EPOCH, 0, 4, fetch.handle_offset_for_leader_epoch),
    # Transactions (coordinator side); AddPartitionsToTxn v4 is the leaders' KIP-890 verification.
    Api(K.ADD_PARTITIONS_TO_TXN, 0, 4, transactions.add_partitions_to_txn),
    Api(K.ADD_OFFSETS_TO_TXN, 0, 3, transactions.add_offsets_to_txn),
    Api(K.END_TXN, 0, 3, transactions.end_txn),
    Api(K.TXN_OFFSET_COMMIT, 0, 3, transactions.txn_offset_commit),
    Api(K.DESCRIBE_TRANSACTIONS, 0, 0, transactions.describe_transactions),
    Api(K.LIST_TRANSACTIONS, 0, 1, transactions.list_transactions),
    Api(K.WRITE_TXN_MARKERS, 0, 1, transactions.write_txn_markers),
    Api(K.DESCRIBE_ACLS, 0, 3, acls.describe_acls),
    Api(K.CREATE_ACLS, 0, 3, acls.create_acls),
    Api(K.DELETE_ACLS, 0, 3, acls.delete_acls),
    Api(K.DESCRIBE_CONFIGS, 0, 4, configs.describe_configs),
    Api(K.ALTER_CONFIGS, 0, 2, configs.alter_configs),
    Api(K.ALTER_REPLICA_LOG_DIRS, 0, 2, log_admin.alter_replica_log_dirs),
    Api(K.DESCRIBE_LOG_DIRS, 0, 4, log_admin.describe_log_dirs),
    Api(K.CREATE_PARTITIONS, 0, 3, admin.create_partitions),
    Api(K.DELETE_GROUPS, 0, 2, groups.delete_groups),
    Api(K.ELECT_LEADERS, 0, 2, admin.elect_leaders),
    Api(K.INCREMENTAL_ALTER_CONFIGS, 0, 1, configs.incremental_alter_configs),
    Api(K.ALTER_PARTITION_REASSIGNMENTS, 0, 0, reassignments.alter_partition_reassignments),
    Api(K.LIST_PARTITION_REASSIGNMENTS, 0, 0, reassignments.list_partition_reassignments),
    Api(K.OFFSET_DELETE, 0, 0, groups.offset_delete),
    Api(K.DESCRIBE_CLUSTER, 0, 2, cluster_info.describe_cluster),
    Api(K.DESCRIBE_PRODUCERS, 0, 0, producers.describe_producers),
    # SASL (listeners with SASL_PLAINTEXT / SASL_SSL; ILLEGAL_SASL_STATE elsewhere)
    Api(K.SASL_HANDSHAKE, 0, 1, sasl.sasl_handshake),
    Api(K.SASL_AUTHENTICATE, 0, 2, sasl.sasl_authenticate),
    Api(K.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, sasl.describe_user_scram_credentials),
    Api(K.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, sasl.alter_user_scram_credentials),
    # Client quotas (ZooKeeper /config/users, /config/clients)
    Api(K.DESCRIBE_CLIENT_QUOTAS, 0, 1, quotas.describe_client_quotas),
    Api(K.ALTER_CLIENT_QUOTAS, 0, 1, quotas.alter_client_quotas),
)
del K


def index(rows) -> dict[ApiKey, Api]:
    """key -> row, refusing a key declared twice and ranges outside the schema (at import)."""
    by_key: dict[ApiKey, Api] = {}
    for row in rows:
        key = ApiKey(row.key)
        if key in by_key:
            raise ValueError(f"{key.name} declared twice in the API table")
        api.check_range(key, row.min_version, row.max_version)
        if not callable(row.handle):
            raise ValueError(f"{key.name}: handler {row.handle!r} is not callable")
        by_key[key] = row
    return by_key


APIS: dict[ApiKey, Api] = index(TABLE)
api.SUPPORTED.clear()
api.SUPPORTED.update({row.key: (row.min_version, row.max_version) for row in TABLE})


def dispatch(broker) -> dict[int, Callable]:
    """The network server's dispatch dict for one broker: api_key -> handler(conn, header, body)."""
    return {int(row.key): functools.partial(row.handle, broker) for row in TABLE}
