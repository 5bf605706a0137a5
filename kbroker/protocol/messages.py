"""Our compact definitions of Kafka's request and response schemas.

Each definition mirrors the structure of the corresponding message in Kafka's
``clients/src/main/resources/common/message/*.json``: field names in snake_case, the versions each
field exists in (``"3+"``, ``"0-8"``), the versions in which it is nullable, tags of tagged fields,
and the message's valid and flexible version ranges. Only the APIs kbroker implements or calls are
defined; the registry maps api_key → Schema.

Valid and flexible version ranges are Kafka 3.9's (the last release with ZooKeeper mode; newer
Kafka dropped old versions that our clients still send). Field versions, nullable versions, tags and
defaults follow the JSON exactly; a child field's versions are left out where they equal its
parent's. ``tests/test_protocol_schemas.py`` checks every definition against Kafka's JSON.
"""
from __future__ import annotations

from .schema import NULL, F, Schema, Struct

REQUESTS: dict[int, Schema] = {}
RESPONSES: dict[int, Schema] = {}
API_NAMES: dict[int, str] = {}


def api(key: int, name: str, valid: str, flexible: str, request: list, response: list) -> None:
    API_NAMES[key] = name
    REQUESTS[key] = Schema(name + "Request", valid, flexible, request)
    RESPONSES[key] = Schema(name + "Response", valid, flexible, response)


# "Not requested" value of the *_authorized_operations bit fields (KIP-430): INT32_MIN.
_OPS_NOT_REQUESTED = -0x80000000


# --- 18 ApiVersions ---------------------------------------------------------------------------------
api(18, "ApiVersions", "0-4", "3+",
    request=[
        F("client_software_name", "string", "3+"),
        F("client_software_version", "string", "3+"),
    ],
    response=[
        F("error_code", "int16"),
        F("api_keys", [
            F("api_key", "int16"),
            F("min_version", "int16"),
            F("max_version", "int16"),
        ]),
        F("throttle_time_ms", "int32", "1+"),
        F("supported_features", [
            F("name", "string"),
            F("min_version", "int16"),
            F("max_version", "int16"),
        ], "3+", tag=0, tagged="3+"),
        F("finalized_features_epoch", "int64", "3+", default=-1, tag=1, tagged="3+"),
        F("finalized_features", [
            F("name", "string"),
            F("max_version_level", "int16"),
            F("min_version_level", "int16"),
        ], "3+", tag=2, tagged="3+"),
        F("zk_migration_ready", "bool", "3+", tag=3, tagged="3+"),
    ])

# --- 0 Produce -----------------------------------------------------------------------------------
# records are a "records" field: decoded as a memoryview into the request frame (zero copy).
api(0, "Produce", "0-11", "9+",
    request=[
        F("transactional_id", "string", "3+", nullable="3+", default=NULL),
        F("acks", "int16"),
        F("timeout_ms", "int32"),
        F("topic_data", [
            F("name", "string"),
            F("partition_data", [
                F("index", "int32"),
                F("records", "records", nullable="0+"),
            ]),
        ]),
    ],
    response=[
        F("responses", [
            F("name", "string"),
            F("partition_responses", [
                F("index", "int32"),
                F("error_code", "int16"),
                F("base_offset", "int64"),
                F("log_append_time_ms", "int64", "2+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("record_errors", [
                    F("batch_index", "int32"),
                    F("batch_index_error_message", "string", nullable="8+", default=NULL),
                ], "8+"),
                F("error_message", "string", "8+", nullable="8+", default=NULL),
                F("current_leader", Struct([
                    F("leader_id", "int32", default=-1),
                    F("leader_epoch", "int32", default=-1),
                ]), "10+", tag=0, tagged="10+"),
            ]),
        ]),
        F("throttle_time_ms", "int32", "1+"),
        F("node_endpoints", [
            F("node_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", nullable="10+", default=NULL),
        ], "10+", tag=0, tagged="10+"),
    ])

# --- 1 Fetch -------------------------------------------------------------------------------------
# v15+ moves the follower's id into the tagged replica_state (KIP-903); v13+ names topics by id.
# Tagged response fields: diverging_epoch (follower truncation, KIP-595), current_leader and
# snapshot_id (KRaft); node_endpoints (v16+, KIP-951) lists the brokers named in current_leader.
api(1, "Fetch", "0-17", "12+",
    request=[
        F("cluster_id", "string", "12+", nullable="12+", default=NULL, tag=0, tagged="12+"),
        F("replica_id", "int32", "0-14", default=-1),
        F("replica_state", Struct([
            F("replica_id", "int32", default=-1),
            F("replica_epoch", "int64", default=-1),
        ]), "15+", tag=1, tagged="15+"),
        F("max_wait_ms", "int32"),
        F("min_bytes", "int32"),
        F("max_bytes", "int32", "3+", default=0x7FFFFFFF),
        F("isolation_level", "int8", "4+"),
        F("session_id", "int32", "7+"),
        F("session_epoch", "int32", "7+", default=-1),
        F("topics", [
            F("topic", "string", "0-12"),
            F("topic_id", "uuid", "13+"),
            F("partitions", [
                F("partition", "int32"),
                F("current_leader_epoch", "int32", "9+", default=-1),
                F("fetch_offset", "int64"),
                F("last_fetched_epoch", "int32", "12+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("partition_max_bytes", "int32"),
                F("replica_directory_id", "uuid", "17+", tag=0, tagged="17+"),
            ]),
        ]),
        F("forgotten_topics_data", [
            F("topic", "string", "7-12"),
            F("topic_id", "uuid", "13+"),
            F("partitions", "[]int32"),
        ], "7+"),
        F("rack_id", "string", "11+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "7+"),
        F("session_id", "int32", "7+"),
        F("responses", [
            F("topic", "string", "0-12"),
            F("topic_id", "uuid", "13+"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("high_watermark", "int64"),
                F("last_stable_offset", "int64", "4+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("diverging_epoch", Struct([
                    F("epoch", "int32", default=-1),
                    F("end_offset", "int64", default=-1),
                ]), "12+", tag=0, tagged="12+"),
                F("current_leader", Struct([
                    F("leader_id", "int32", default=-1),
                    F("leader_epoch", "int32", default=-1),
                ]), "12+", tag=1, tagged="12+"),
                F("snapshot_id", Struct([
                    F("end_offset", "int64", default=-1),
                    F("epoch", "int32", default=-1),
                ]), "12+", tag=2, tagged="12+"),
                F("aborted_transactions", [
                    F("producer_id", "int64"),
                    F("first_offset", "int64"),
                ], "4+", nullable="4+"),
                F("preferred_read_replica", "int32", "11+", default=-1),
                F("records", "records", nullable="0+"),
            ]),
        ]),
        F("node_endpoints", [
            F("node_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", nullable="16+", default=NULL),
        ], "16+", tag=0, tagged="16+"),
    ])

# --- 2 ListOffsets -------------------------------------------------------------------------------
# replica_id: Kafka's JSON has no default (0 = broker 0!); we default to -1 (a consumer), as
# kafka-python does, so a client that leaves it out is not mistaken for a follower.
# v0 answers with old_style_offsets (a list) instead of timestamp/offset.
api(2, "ListOffsets", "0-9", "6+",
    request=[
        F("replica_id", "int32", default=-1),
        F("isolation_level", "int8", "2+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("current_leader_epoch", "int32", "4+", default=-1),
                F("timestamp", "int64"),
                F("max_num_offsets", "int32", "0", default=1),
            ]),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("old_style_offsets", "[]int64", "0"),
                F("timestamp", "int64", "1+", default=-1),
                F("offset", "int64", "1+", default=-1),
                F("leader_epoch", "int32", "4+", default=-1),
            ]),
        ]),
    ])

# --- 3 Metadata ----------------------------------------------------------------------------------
# topics: v0 empty = all topics; v1+ null = all topics, empty = none.
# *_authorized_operations: INT32_MIN means "not requested" (bit field of ACL operations otherwise).
api(3, "Metadata", "0-12", "9+",
    request=[
        F("topics", [
            F("topic_id", "uuid", "10+"),
            F("name", "string", nullable="10+"),
        ], nullable="1+"),
        F("allow_auto_topic_creation", "bool", "4+", default=True),
        F("include_cluster_authorized_operations", "bool", "8-10"),
        F("include_topic_authorized_operations", "bool", "8+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "3+"),
        F("brokers", [
            F("node_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", "1+", nullable="1+", default=NULL),
        ]),
        F("cluster_id", "string", "2+", nullable="2+", default=NULL),
        F("controller_id", "int32", "1+", default=-1),
        F("topics", [
            F("error_code", "int16"),
            F("name", "string", nullable="12+"),
            F("topic_id", "uuid", "10+"),
            F("is_internal", "bool", "1+"),
            F("partitions", [
                F("error_code", "int16"),
                F("partition_index", "int32"),
                F("leader_id", "int32"),
                F("leader_epoch", "int32", "7+", default=-1),
                F("replica_nodes", "[]int32"),
                F("isr_nodes", "[]int32"),
                F("offline_replicas", "[]int32", "5+"),
            ]),
            F("topic_authorized_operations", "int32", "8+", default=_OPS_NOT_REQUESTED),
        ]),
        F("cluster_authorized_operations", "int32", "8-10", default=_OPS_NOT_REQUESTED),
    ])

# --- 4 LeaderAndIsr ------------------------------------------------------------------------------
# ZK-mode controller -> broker requests (4, 5, 6, 7). Request header v1 rules like every API.
api(4, "LeaderAndIsr", "0-7", "4+",
    request=[
        F("controller_id", "int32"),
        F("is_k_raft_controller", "bool", "7+"),
        F("controller_epoch", "int32"),
        F("broker_epoch", "int64", "2+", default=-1),
        F("type", "int8", "5+"),
        F("ungrouped_partition_states", [
            F("topic_name", "string"),
            F("partition_index", "int32"),
            F("controller_epoch", "int32"),
            F("leader", "int32"),
            F("leader_epoch", "int32"),
            F("isr", "[]int32"),
            F("partition_epoch", "int32"),
            F("replicas", "[]int32"),
            F("adding_replicas", "[]int32", "3+"),
            F("removing_replicas", "[]int32", "3+"),
            F("is_new", "bool", "1+"),
            F("leader_recovery_state", "int8", "6+"),
        ], "0-1"),
        F("topic_states", [
            F("topic_name", "string"),
            F("topic_id", "uuid", "5+"),
            F("partition_states", [
                F("topic_name", "string", "0-1"),
                F("partition_index", "int32"),
                F("controller_epoch", "int32"),
                F("leader", "int32"),
                F("leader_epoch", "int32"),
                F("isr", "[]int32"),
                F("partition_epoch", "int32"),
                F("replicas", "[]int32"),
                F("adding_replicas", "[]int32", "3+"),
                F("removing_replicas", "[]int32", "3+"),
                F("is_new", "bool", "1+"),
                F("leader_recovery_state", "int8", "6+"),
            ]),
        ], "2+"),
        F("live_leaders", [
            F("broker_id", "int32"),
            F("host_name", "string"),
            F("port", "int32"),
        ]),
    ],
    response=[
        F("error_code", "int16"),
        F("partition_errors", [
            F("topic_name", "string"),
            F("partition_index", "int32"),
            F("error_code", "int16"),
        ], "0-4"),
        F("topics", [
            F("topic_id", "uuid"),
            F("partition_errors", [
                F("topic_name", "string", "0-4"),
                F("partition_index", "int32"),
                F("error_code", "int16"),
            ]),
        ], "5+"),
    ])

# --- 5 StopReplica -------------------------------------------------------------------------------
api(5, "StopReplica", "0-4", "2+",
    request=[
        F("controller_id", "int32"),
        F("is_k_raft_controller", "bool", "4+"),
        F("controller_epoch", "int32"),
        F("broker_epoch", "int64", "1+", default=-1),
        F("delete_partitions", "bool", "0-2"),
        F("ungrouped_partitions", [
            F("topic_name", "string"),
            F("partition_index", "int32"),
        ], "0"),
        F("topics", [
            F("name", "string"),
            F("partition_indexes", "[]int32"),
        ], "1-2"),
        F("topic_states", [
            F("topic_name", "string"),
            F("partition_states", [
                F("partition_index", "int32"),
                F("leader_epoch", "int32", default=-1),
                F("delete_partition", "bool"),
            ]),
        ], "3+"),
    ],
    response=[
        F("error_code", "int16"),
        F("partition_errors", [
            F("topic_name", "string"),
            F("partition_index", "int32"),
            F("error_code", "int16"),
        ]),
    ])

# --- 6 UpdateMetadata ----------------------------------------------------------------------------
api(6, "UpdateMetadata", "0-8", "6+",
    request=[
        F("controller_id", "int32"),
        F("is_k_raft_controller", "bool", "8+"),
        F("type", "int8", "8+", tag=0, tagged="8+"),
        F("controller_epoch", "int32"),
        F("broker_epoch", "int64", "5+", default=-1),
        F("ungrouped_partition_states", [
            F("topic_name", "string"),
            F("partition_index", "int32"),
            F("controller_epoch", "int32"),
            F("leader", "int32"),
            F("leader_epoch", "int32"),
            F("isr", "[]int32"),
            F("zk_version", "int32"),
            F("replicas", "[]int32"),
            F("offline_replicas", "[]int32", "4+"),
        ], "0-4"),
        F("topic_states", [
            F("topic_name", "string"),
            F("topic_id", "uuid", "7+"),
            F("partition_states", [
                F("topic_name", "string", "0-4"),
                F("partition_index", "int32"),
                F("controller_epoch", "int32"),
                F("leader", "int32"),
                F("leader_epoch", "int32"),
                F("isr", "[]int32"),
                F("zk_version", "int32"),
                F("replicas", "[]int32"),
                F("offline_replicas", "[]int32", "4+"),
            ]),
        ], "5+"),
        F("live_brokers", [
            F("id", "int32"),
            F("v0_host", "string", "0"),
            F("v0_port", "int32", "0"),
            F("endpoints", [
                F("port", "int32"),
                F("host", "string"),
                F("listener", "string", "3+"),
                F("security_protocol", "int16"),
            ], "1+"),
            F("rack", "string", "2+", nullable="0+"),
        ]),
    ],
    response=[
        F("error_code", "int16"),
    ])

# --- 7 ControlledShutdown ------------------------------------------------------------------------
# v0 is left out: its request header has no client_id (Kafka special-cases the header of
# ControlledShutdown v0), which our header parser does not model. Brokers since 0.10 send v1+.
api(7, "ControlledShutdown", "1-3", "3+",
    request=[
        F("broker_id", "int32"),
        F("broker_epoch", "int64", "2+", default=-1),
    ],
    response=[
        F("error_code", "int16"),
        F("remaining_partitions", [
            F("topic_name", "string"),
            F("partition_index", "int32"),
        ]),
    ])

# --- 8 OffsetCommit ------------------------------------------------------------------------------
# generation_id -1 with member_id "" = a standalone (simple consumer) commit.
api(8, "OffsetCommit", "0-9", "8+",
    request=[
        F("group_id", "string"),
        F("generation_id_or_member_epoch", "int32", "1+", default=-1),
        F("member_id", "string", "1+"),
        F("group_instance_id", "string", "7+", nullable="7+", default=NULL),
        F("retention_time_ms", "int64", "2-4", default=-1),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("committed_leader_epoch", "int32", "6+", default=-1),
                F("commit_timestamp", "int64", "1", default=-1),
                F("committed_metadata", "string", nullable="0+"),
            ]),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32", "3+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
            ]),
        ]),
    ])

# --- 9 OffsetFetch -------------------------------------------------------------------------------
# v8+ batches several groups (groups[]) instead of group_id/topics; topics null = all partitions.
api(9, "OffsetFetch", "0-9", "6+",
    request=[
        F("group_id", "string", "0-7"),
        F("topics", [
            F("name", "string"),
            F("partition_indexes", "[]int32"),
        ], "0-7", nullable="2-7"),
        F("groups", [
            F("group_id", "string"),
            F("member_id", "string", "9+", nullable="9+", default=NULL),
            F("member_epoch", "int32", "9+", default=-1),
            F("topics", [
                F("name", "string"),
                F("partition_indexes", "[]int32"),
            ], nullable="8+"),
        ], "8+"),
        F("require_stable", "bool", "7+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "3+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("committed_leader_epoch", "int32", "5-7", default=-1),
                F("metadata", "string", nullable="0-7"),
                F("error_code", "int16"),
            ]),
        ], "0-7"),
        F("error_code", "int16", "2-7"),
        F("groups", [
            F("group_id", "string"),
            F("topics", [
                F("name", "string"),
                F("partitions", [
                    F("partition_index", "int32"),
                    F("committed_offset", "int64"),
                    F("committed_leader_epoch", "int32", default=-1),
                    F("metadata", "string", nullable="8+"),
                    F("error_code", "int16"),
                ]),
            ]),
            F("error_code", "int16"),
        ], "8+"),
    ])

# --- 10 FindCoordinator ---------------------------------------------------------------------------
# v4+ batches keys (coordinator_keys -> coordinators[]) and drops the single-key fields.
api(10, "FindCoordinator", "0-6", "3+",
    request=[
        F("key", "string", "0-3"),
        F("key_type", "int8", "1+"),
        F("coordinator_keys", "[]string", "4+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "0-3"),
        F("error_message", "string", "1-3", nullable="1-3"),
        F("node_id", "int32", "0-3"),
        F("host", "string", "0-3"),
        F("port", "int32", "0-3"),
        F("coordinators", [
            F("key", "string"),
            F("node_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="4+"),
        ], "4+"),
    ])

# --- 11 JoinGroup ---------------------------------------------------------------------------------
api(11, "JoinGroup", "0-9", "6+",
    request=[
        F("group_id", "string"),
        F("session_timeout_ms", "int32"),
        F("rebalance_timeout_ms", "int32", "1+", default=-1),
        F("member_id", "string"),
        F("group_instance_id", "string", "5+", nullable="5+", default=NULL),
        F("protocol_type", "string"),
        F("protocols", [
            F("name", "string"),
            F("metadata", "bytes"),
        ]),
        F("reason", "string", "8+", nullable="8+", default=NULL),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F("error_code", "int16"),
        F("generation_id", "int32", default=-1),
        F("protocol_type", "string", "7+", nullable="7+", default=NULL),
        F("protocol_name", "string", nullable="7+"),
        F("leader", "string"),
        F("skip_assignment", "bool", "9+"),
        F("member_id", "string"),
        F("members", [
            F("member_id", "string"),
            F("group_instance_id", "string", "5+", nullable="5+", default=NULL),
            F("metadata", "bytes"),
        ]),
    ])

# --- 12 Heartbeat ---------------------------------------------------------------------------------
api(12, "Heartbeat", "0-4", "4+",
    request=[
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+", default=NULL),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
    ])

# --- 13 LeaveGroup --------------------------------------------------------------------------------
api(13, "LeaveGroup", "0-5", "4+",
    request=[
        F("group_id", "string"),
        F("member_id", "string", "0-2"),
        F("members", [
            F("member_id", "string"),
            F("group_instance_id", "string", nullable="3+", default=NULL),
            F("reason", "string", "5+", nullable="5+", default=NULL),
        ], "3+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("members", [
            F("member_id", "string"),
            F("group_instance_id", "string", nullable="3+"),
            F("error_code", "int16"),
        ], "3+"),
    ])

# --- 14 SyncGroup ---------------------------------------------------------------------------------
api(14, "SyncGroup", "0-5", "4+",
    request=[
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+", default=NULL),
        F("protocol_type", "string", "5+", nullable="5+", default=NULL),
        F("protocol_name", "string", "5+", nullable="5+", default=NULL),
        F("assignments", [
            F("member_id", "string"),
            F("assignment", "bytes"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("protocol_type", "string", "5+", nullable="5+", default=NULL),
        F("protocol_name", "string", "5+", nullable="5+", default=NULL),
        F("assignment", "bytes"),
    ])

# --- 15 DescribeGroups ----------------------------------------------------------------------------
api(15, "DescribeGroups", "0-5", "5+",
    request=[
        F("groups", "[]string"),
        F("include_authorized_operations", "bool", "3+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("groups", [
            F("error_code", "int16"),
            F("group_id", "string"),
            F("group_state", "string"),
            F("protocol_type", "string"),
            F("protocol_data", "string"),
            F("members", [
                F("member_id", "string"),
                F("group_instance_id", "string", "4+", nullable="4+", default=NULL),
                F("client_id", "string"),
                F("client_host", "string"),
                F("member_metadata", "bytes"),
                F("member_assignment", "bytes"),
            ]),
            F("authorized_operations", "int32", "3+", default=_OPS_NOT_REQUESTED),
        ]),
    ])

# --- 16 ListGroups --------------------------------------------------------------------------------
api(16, "ListGroups", "0-5", "3+",
    request=[
        F("states_filter", "[]string", "4+"),
        F("types_filter", "[]string", "5+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("groups", [
            F("group_id", "string"),
            F("protocol_type", "string"),
            F("group_state", "string", "4+"),
            F("group_type", "string", "5+"),
        ]),
    ])

# --- 17 SaslHandshake -----------------------------------------------------------------------------
api(17, "SaslHandshake", "0-1", "none",
    request=[
        F("mechanism", "string"),
    ],
    response=[
        F("error_code", "int16"),
        F("mechanisms", "[]string"),
    ])

# --- 19 CreateTopics ------------------------------------------------------------------------------
api(19, "CreateTopics", "0-7", "5+",
    request=[
        F("topics", [
            F("name", "string"),
            F("num_partitions", "int32"),
            F("replication_factor", "int16"),
            F("assignments", [
                F("partition_index", "int32"),
                F("broker_ids", "[]int32"),
            ]),
            F("configs", [
                F("name", "string"),
                F("value", "string", nullable="0+"),
            ]),
        ]),
        F("timeout_ms", "int32", default=60000),
        F("validate_only", "bool", "1+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F("topics", [
            F("name", "string"),
            F("topic_id", "uuid", "7+"),
            F("error_code", "int16"),
            F("error_message", "string", "1+", nullable="0+"),
            F("topic_config_error_code", "int16", "5+", tag=0, tagged="5+"),
            F("num_partitions", "int32", "5+", default=-1),
            F("replication_factor", "int16", "5+", default=-1),
            F("configs", [
                F("name", "string"),
                F("value", "string", nullable="5+"),
                F("read_only", "bool"),
                F("config_source", "int8", default=-1),
                F("is_sensitive", "bool"),
            ], "5+", nullable="5+"),
        ]),
    ])

# --- 20 DeleteTopics ------------------------------------------------------------------------------
api(20, "DeleteTopics", "0-6", "4+",
    request=[
        F("topics", [
            F("name", "string", nullable="6+", default=NULL),
            F("topic_id", "uuid"),
        ], "6+"),
        F("topic_names", "[]string", "0-5"),
        F("timeout_ms", "int32"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("responses", [
            F("name", "string", nullable="6+"),
            F("topic_id", "uuid", "6+"),
            F("error_code", "int16"),
            F("error_message", "string", "5+", nullable="5+", default=NULL),
        ]),
    ])

# --- 21 DeleteRecords -----------------------------------------------------------------------------
api(21, "DeleteRecords", "0-2", "2+",
    request=[
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("offset", "int64"),
            ]),
        ]),
        F("timeout_ms", "int32"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("low_watermark", "int64"),
                F("error_code", "int16"),
            ]),
        ]),
    ])

# --- 22 InitProducerId ----------------------------------------------------------------------------
api(22, "InitProducerId", "0-5", "2+",
    request=[
        F("transactional_id", "string", nullable="0+"),
        F("transaction_timeout_ms", "int32"),
        F("producer_id", "int64", "3+", default=-1),
        F("producer_epoch", "int16", "3+", default=-1),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("producer_id", "int64", default=-1),
        F("producer_epoch", "int16"),
    ])

# --- 27 WriteTxnMarkers --------------------------------------------------------------------------
# Transaction coordinator -> partition leaders: one COMMIT/ABORT control batch per listed partition.
api(27, "WriteTxnMarkers", "0-1", "1+",
    request=[
        F("markers", [
            F("producer_id", "int64"),
            F("producer_epoch", "int16"),
            F("transaction_result", "bool"),
            F("topics", [
                F("name", "string"),
                F("partition_indexes", "[]int32"),
            ]),
            F("coordinator_epoch", "int32"),
        ]),
    ],
    response=[
        F("markers", [
            F("producer_id", "int64"),
            F("topics", [
                F("name", "string"),
                F("partitions", [
                    F("partition_index", "int32"),
                    F("error_code", "int16"),
                ]),
            ]),
        ]),
    ])

# --- 61 DescribeProducers -------------------------------------------------------------------------
api(61, "DescribeProducers", "0", "0+",
    request=[
        F("topics", [
            F("name", "string"),
            F("partition_indexes", "[]int32"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+", default=NULL),
                F("active_producers", [
                    F("producer_id", "int64"),
                    F("producer_epoch", "int32"),
                    F("last_sequence", "int32", default=-1),
                    F("last_timestamp", "int64", default=-1),
                    F("coordinator_epoch", "int32"),
                    F("current_txn_start_offset", "int64", default=-1),
                ]),
            ]),
        ]),
    ])

# --- 23 OffsetForLeaderEpoch ----------------------------------------------------------------------
# replica_id -2 = a consumer (KIP-320 validation), -1 = debugging consumer, >= 0 = a follower.
api(23, "OffsetForLeaderEpoch", "0-4", "4+",
    request=[
        F("replica_id", "int32", "3+", default=-2),
        F("topics", [
            F("topic", "string"),
            F("partitions", [
                F("partition", "int32"),
                F("current_leader_epoch", "int32", "2+", default=-1),
                F("leader_epoch", "int32"),
            ]),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F("topics", [
            F("topic", "string"),
            F("partitions", [
                F("error_code", "int16"),
                F("partition", "int32"),
                F("leader_epoch", "int32", "1+", default=-1),
                F("end_offset", "int64", default=-1),
            ]),
        ]),
    ])

# --- 24 AddPartitionsToTxn ------------------------------------------------------------------------
# v4+ (KIP-890) batches transactions and is broker-only (verify_only: is the partition in the txn?).
_ADD_TXN_TOPIC = [F("name", "string"), F("partitions", "[]int32")]
_ADD_TXN_TOPIC_RESULT = [
    F("name", "string"),
    F("results_by_partition", [
        F("partition_index", "int32"),
        F("partition_error_code", "int16"),
    ]),
]
api(24, "AddPartitionsToTxn", "0-4", "3+",
    request=[
        F("transactions", [
            F("transactional_id", "string"),
            F("producer_id", "int64"),
            F("producer_epoch", "int16"),
            F("verify_only", "bool", default=False),
            F("topics", _ADD_TXN_TOPIC),
        ], "4+"),
        F("v3_and_below_transactional_id", "string", "0-3"),
        F("v3_and_below_producer_id", "int64", "0-3"),
        F("v3_and_below_producer_epoch", "int16", "0-3"),
        F("v3_and_below_topics", _ADD_TXN_TOPIC, "0-3"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16", "4+"),
        F("results_by_transaction", [
            F("transactional_id", "string"),
            F("topic_results", _ADD_TXN_TOPIC_RESULT),
        ], "4+"),
        F("results_by_topic_v3_and_below", _ADD_TXN_TOPIC_RESULT, "0-3"),
    ])

# --- 25 AddOffsetsToTxn ---------------------------------------------------------------------------
api(25, "AddOffsetsToTxn", "0-3", "3+",
    request=[
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("group_id", "string"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
    ])

# --- 26 EndTxn ------------------------------------------------------------------------------------
api(26, "EndTxn", "0-3", "3+",
    request=[
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("committed", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
    ])

# --- 28 TxnOffsetCommit ---------------------------------------------------------------------------
api(28, "TxnOffsetCommit", "0-3", "3+",
    request=[
        F("transactional_id", "string"),
        F("group_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("generation_id", "int32", "3+", default=-1),
        F("member_id", "string", "3+", default=""),
        F("group_instance_id", "string", "3+", nullable="3+", default=NULL),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("committed_leader_epoch", "int32", "2+", default=-1),
                F("committed_metadata", "string", nullable="0+"),
            ]),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
            ]),
        ]),
    ])

# --- 32 DescribeConfigs ---------------------------------------------------------------------------
api(32, "DescribeConfigs", "0-4", "4+",
    request=[
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configuration_keys", "[]string", nullable="0+"),
        ]),
        F("include_synonyms", "bool", "1+"),
        F("include_documentation", "bool", "3+"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", [
                F("name", "string"),
                F("value", "string", nullable="0+"),
                F("read_only", "bool"),
                F("is_default", "bool", "0"),
                F("config_source", "int8", "1+", default=-1),
                F("is_sensitive", "bool"),
                F("synonyms", [
                    F("name", "string"),
                    F("value", "string", nullable="0+"),
                    F("source", "int8"),
                ], "1+"),
                F("config_type", "int8", "3+"),
                F("documentation", "string", "3+", nullable="0+"),
            ]),
        ]),
    ])

# --- 33 AlterConfigs ------------------------------------------------------------------------------
api(33, "AlterConfigs", "0-2", "2+",
    request=[
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", [
                F("name", "string"),
                F("value", "string", nullable="0+"),
            ]),
        ]),
        F("validate_only", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("responses", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("resource_type", "int8"),
            F("resource_name", "string"),
        ]),
    ])

# --- 34 AlterReplicaLogDirs -----------------------------------------------------------------------
api(34, "AlterReplicaLogDirs", "0-2", "2+",
    request=[
        F("dirs", [
            F("path", "string"),
            F("topics", [
                F("name", "string"),
                F("partitions", "[]int32"),
            ]),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("topic_name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
            ]),
        ]),
    ])

# --- 35 DescribeLogDirs ---------------------------------------------------------------------------
# topics null: every partition in every log dir.
api(35, "DescribeLogDirs", "0-4", "2+",
    request=[
        F("topics", [
            F("topic", "string"),
            F("partitions", "[]int32"),
        ], nullable="0+"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16", "3+"),
        F("results", [
            F("error_code", "int16"),
            F("log_dir", "string"),
            F("topics", [
                F("name", "string"),
                F("partitions", [
                    F("partition_index", "int32"),
                    F("partition_size", "int64"),
                    F("offset_lag", "int64"),
                    F("is_future_key", "bool"),
                ]),
            ]),
            F("total_bytes", "int64", "4+", default=-1),
            F("usable_bytes", "int64", "4+", default=-1),
        ]),
    ])

# --- 36 SaslAuthenticate --------------------------------------------------------------------------
api(36, "SaslAuthenticate", "0-2", "2+",
    request=[
        F("auth_bytes", "bytes"),
    ],
    response=[
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", "1+"),
    ])

# --- 37 CreatePartitions --------------------------------------------------------------------------
api(37, "CreatePartitions", "0-3", "2+",
    request=[
        F("topics", [
            F("name", "string"),
            F("count", "int32"),
            F("assignments", [
                F("broker_ids", "[]int32"),
            ], nullable="0+"),
        ]),
        F("timeout_ms", "int32"),
        F("validate_only", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("name", "string"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=NULL),
        ]),
    ])

# --- 42 DeleteGroups ------------------------------------------------------------------------------
api(42, "DeleteGroups", "0-2", "2+",
    request=[
        F("groups_names", "[]string"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("group_id", "string"),
            F("error_code", "int16"),
        ]),
    ])

# --- 43 ElectLeaders -----------------------------------------------------------------------------
# election_type 0 = preferred replica, 1 = unclean (first live replica of a leaderless partition).
api(43, "ElectLeaders", "0-2", "2+",
    request=[
        F("election_type", "int8", "1+"),
        F("topic_partitions", [
            F("topic", "string"),
            F("partitions", "[]int32"),
        ], nullable="0+"),
        F("timeout_ms", "int32", default=60000),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16", "1+"),
        F("replica_election_results", [
            F("topic", "string"),
            F("partition_result", [
                F("partition_id", "int32"),
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+"),
            ]),
        ]),
    ])

# --- 44 IncrementalAlterConfigs -------------------------------------------------------------------
api(44, "IncrementalAlterConfigs", "0-1", "1+",
    request=[
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", [
                F("name", "string"),
                F("config_operation", "int8"),
                F("value", "string", nullable="0+"),
            ]),
        ]),
        F("validate_only", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("responses", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("resource_type", "int8"),
            F("resource_name", "string"),
        ]),
    ])

# --- 45 AlterPartitionReassignments -----------------------------------------------------------------
# replicas null cancels the partition's reassignment (KIP-455).
api(45, "AlterPartitionReassignments", "0", "0+",
    request=[
        F("timeout_ms", "int32", default=60000),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("replicas", "[]int32", nullable="0+", default=NULL),
            ]),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("responses", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+"),
            ]),
        ]),
    ])

# --- 46 ListPartitionReassignments ------------------------------------------------------------------
# topics null: every ongoing reassignment.
api(46, "ListPartitionReassignments", "0", "0+",
    request=[
        F("timeout_ms", "int32", default=60000),
        F("topics", [
            F("name", "string"),
            F("partition_indexes", "[]int32"),
        ], nullable="0+", default=NULL),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("replicas", "[]int32"),
                F("adding_replicas", "[]int32"),
                F("removing_replicas", "[]int32"),
            ]),
        ]),
    ])

# --- 47 OffsetDelete ------------------------------------------------------------------------------
api(47, "OffsetDelete", "0", "none",
    request=[
        F("group_id", "string"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
            ]),
        ]),
    ],
    response=[
        F("error_code", "int16"),
        F("throttle_time_ms", "int32"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
            ]),
        ]),
    ])

# --- 29 DescribeAcls ------------------------------------------------------------------------------
api(29, "DescribeAcls", "0-3", "2+",
    request=[
        F("resource_type_filter", "int8"),
        F("resource_name_filter", "string", nullable="0+"),
        F("pattern_type_filter", "int8", "1+", default=3),
        F("principal_filter", "string", nullable="0+"),
        F("host_filter", "string", nullable="0+"),
        F("operation", "int8"),
        F("permission_type", "int8"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("pattern_type", "int8", "1+", default=3),
            F("acls", [
                F("principal", "string"),
                F("host", "string"),
                F("operation", "int8"),
                F("permission_type", "int8"),
            ]),
        ]),
    ])

# --- 30 CreateAcls --------------------------------------------------------------------------------
api(30, "CreateAcls", "0-3", "2+",
    request=[
        F("creations", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("resource_pattern_type", "int8", "1+", default=3),
            F("principal", "string"),
            F("host", "string"),
            F("operation", "int8"),
            F("permission_type", "int8"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
        ]),
    ])

# --- 31 DeleteAcls --------------------------------------------------------------------------------
api(31, "DeleteAcls", "0-3", "2+",
    request=[
        F("filters", [
            F("resource_type_filter", "int8"),
            F("resource_name_filter", "string", nullable="0+"),
            F("pattern_type_filter", "int8", "1+", default=3),
            F("principal_filter", "string", nullable="0+"),
            F("host_filter", "string", nullable="0+"),
            F("operation", "int8"),
            F("permission_type", "int8"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("filter_results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("matching_acls", [
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+"),
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F("pattern_type", "int8", "1+", default=3),
                F("principal", "string"),
                F("host", "string"),
                F("operation", "int8"),
                F("permission_type", "int8"),
            ]),
        ]),
    ])

# --- 60 DescribeCluster ---------------------------------------------------------------------------
# --- 48 DescribeClientQuotas, 49 AlterClientQuotas ------------------------------------------------
api(48, "DescribeClientQuotas", "0-1", "1+",
    request=[
        F("components", [
            F("entity_type", "string"),
            F("match_type", "int8"),
            F("match", "string", nullable="0+"),
        ]),
        F("strict", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("entries", [
            F("entity", [
                F("entity_type", "string"),
                F("entity_name", "string", nullable="0+"),
            ]),
            F("values", [
                F("key", "string"),
                F("value", "float64"),
            ]),
        ], nullable="0+"),
    ])

api(49, "AlterClientQuotas", "0-1", "1+",
    request=[
        F("entries", [
            F("entity", [
                F("entity_type", "string"),
                F("entity_name", "string", nullable="0+"),
            ]),
            F("ops", [
                F("key", "string"),
                F("value", "float64"),
                F("remove", "bool"),
            ]),
        ]),
        F("validate_only", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("entries", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("entity", [
                F("entity_type", "string"),
                F("entity_name", "string", nullable="0+"),
            ]),
        ]),
    ])

api(50, "DescribeUserScramCredentials", "0", "0+",
    request=[
        F("users", [
            F("name", "string"),
        ], nullable="0+"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("results", [
            F("user", "string"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("credential_infos", [
                F("mechanism", "int8"),
                F("iterations", "int32"),
            ]),
        ]),
    ])

api(51, "AlterUserScramCredentials", "0", "0+",
    request=[
        F("deletions", [
            F("name", "string"),
            F("mechanism", "int8"),
        ]),
        F("upsertions", [
            F("name", "string"),
            F("mechanism", "int8"),
            F("iterations", "int32"),
            F("salt", "bytes"),
            F("salted_password", "bytes"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("user", "string"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
        ]),
    ])

api(60, "DescribeCluster", "0-2", "0+",
    request=[
        F("include_cluster_authorized_operations", "bool"),
        F("endpoint_type", "int8", "1+", default=1),
        F("include_fenced_brokers", "bool", "2+"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+", default=NULL),
        F("endpoint_type", "int8", "1+", default=1),
        F("cluster_id", "string"),
        F("controller_id", "int32", default=-1),
        F("brokers", [
            F("broker_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", nullable="0+", default=NULL),
            F("is_fenced", "bool", "2+"),
        ]),
        F("cluster_authorized_operations", "int32", default=_OPS_NOT_REQUESTED),
    ])

# --- 65 DescribeTransactions ----------------------------------------------------------------------
api(65, "DescribeTransactions", "0", "0+",
    request=[
        F("transactional_ids", "[]string"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("transaction_states", [
            F("error_code", "int16"),
            F("transactional_id", "string"),
            F("transaction_state", "string"),
            F("transaction_timeout_ms", "int32"),
            F("transaction_start_time_ms", "int64"),
            F("producer_id", "int64"),
            F("producer_epoch", "int16"),
            F("topics", [
                F("topic", "string"),
                F("partitions", "[]int32"),
            ]),
        ]),
    ])

# --- 66 ListTransactions --------------------------------------------------------------------------
api(66, "ListTransactions", "0-1", "0+",
    request=[
        F("state_filters", "[]string"),
        F("producer_id_filters", "[]int64"),
        F("duration_filter", "int64", "1+", default=-1),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("unknown_state_filters", "[]string"),
        F("transaction_states", [
            F("transactional_id", "string"),
            F("producer_id", "int64"),
            F("transaction_state", "string"),
        ]),
    ])
