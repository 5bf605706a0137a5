"""The API table (kbroker.server.apis.TABLE) is the only declaration of what the broker serves:
ApiVersions answers exactly its rows (seen by kafka-python and by raw requests), every row's handler
answers a request over a real socket, and a malformed table fails when it is built."""
import functools

import pytest
from kafka.admin import KafkaAdminClient
from kafka.protocol.api_key import ApiKey as KafkaPythonApiKey

from kbroker.protocol import api
from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.protocol.messages import API_NAMES, REQUESTS
from kbroker.server import apis
from kbroker.testing import LocalCluster

from checkers import RawConn

TABLE_RANGES = {int(row.key): (row.min_version, row.max_version) for row in apis.TABLE}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # One offsets partition: FindCoordinator below creates __consumer_offsets.
    with LocalCluster(tmp_path_factory.mktemp("api-table"), brokers=1,
                      overrides={"offsets.topic.num.partitions": 1}) as c:
        yield c


def test_api_key_names_are_kafkas():
    assert {int(k) for k in ApiKey} >= set(REQUESTS)
    for key in ApiKey:
        if key in REQUESTS:
            assert API_NAMES[key].lower() == key.name.replace("_", "").lower()
        # kafka-python's enum has Kafka's names (CamelCase there).
        assert KafkaPythonApiKey(int(key)).name.lower() == key.name.replace("_", "").lower()


def test_supported_is_the_table():
    assert {int(k): v for k, v in api.SUPPORTED.items()} == TABLE_RANGES
    assert len(TABLE_RANGES) == len(apis.TABLE)


def test_kafka_python_sees_the_table(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, client_id="api-table")
    try:
        seen = {int(k): tuple(v) for k, v in admin.api_versions().items()}
    finally:
        admin.close()
    assert seen == TABLE_RANGES


@pytest.mark.parametrize("version", range(5))
def test_api_versions_every_version_answers_the_table(cluster, version):
    with RawConn(cluster.bootstrap) as raw:
        resp = raw.request(ApiKey.API_VERSIONS, version, {"client_software_name": "t",
                                                           "client_software_version": "1"})
    assert resp["error_code"] == 0
    keys = [k["api_key"] for k in resp["api_keys"]]
    assert keys == sorted(keys)
    assert {k["api_key"]: (k["min_version"], k["max_version"]) for k in resp["api_keys"]} == TABLE_RANGES


def test_api_versions_too_new_gets_our_range(cluster):
    """KIP-511: v5 (unknown to us and to Kafka 3.9) is answered in v0 with UNSUPPORTED_VERSION and the
    table's ApiVersions row."""
    with RawConn(cluster.bootstrap) as raw:
        raw.correlation += 1
        # a v4 request (header v2, as a client sends its newest) under a v5 header
        frame = bytearray(api.encode_request(ApiKey.API_VERSIONS, 4, raw.correlation, "t",
                                             {"client_software_name": "t", "client_software_version": "1"}))
        frame[6:8] = (5).to_bytes(2, "big")
        raw.send(bytes(frame))
        cid, resp = api.decode_response(ApiKey.API_VERSIONS, 0, raw.recv_frame())
    assert cid == raw.correlation
    assert resp["error_code"] == Errors.UNSUPPORTED_VERSION
    assert resp["api_keys"] == [{"api_key": ApiKey.API_VERSIONS, "min_version": 0, "max_version": 4}]


# Request bodies that reach each handler without changing the cluster (schema defaults fill the
# rest): controller requests carry an epoch older than any controller's, so they are refused as
# stale after the handler is reached; ControlledShutdown names a broker that does not exist.
_BODIES = {
    ApiKey.PRODUCE: {"acks": 1, "timeout_ms": 1000},    # acks=0 would not be answered
    ApiKey.FETCH: {"replica_id": -1, "max_wait_ms": 0},
    ApiKey.LEADER_AND_ISR: {"controller_id": 99, "controller_epoch": -1, "broker_epoch": -1},
    ApiKey.STOP_REPLICA: {"controller_id": 99, "controller_epoch": -1, "broker_epoch": -1},
    ApiKey.UPDATE_METADATA: {"controller_id": 99, "controller_epoch": -1, "broker_epoch": -1},
    ApiKey.CONTROLLED_SHUTDOWN: {"broker_id": 99, "broker_epoch": -1},
    ApiKey.ELECT_LEADERS: {"topic_partitions": [], "timeout_ms": 1000},
    ApiKey.METADATA: {"topics": []},
    ApiKey.OFFSET_FETCH: {"group_id": "api-table", "topics": []},
}


@pytest.mark.parametrize("row", apis.TABLE, ids=lambda r: r.key.name)
def test_every_row_is_answered_at_both_ends_of_its_range(cluster, row):
    """Only a handler answers: the network layer closes the connection for anything it cannot
    dispatch (except ApiVersions' KIP-511 fallback, which answers v0 with an error)."""
    body = _BODIES.get(row.key, {})
    with RawConn(cluster.bootstrap, timeout=30) as raw:
        for version in sorted({row.min_version, row.max_version}):
            resp = raw.request(row.key, version, body, timeout=30)
            assert isinstance(resp, dict)
            if row.key == ApiKey.PRODUCE and version < api.PRODUCE_MIN_SERVED:
                assert resp["responses"] == []      # nothing to refuse per partition, but answered
            if row.key in (ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA):
                assert resp["error_code"] == Errors.STALE_CONTROLLER_EPOCH


def test_dispatch_binds_every_row_to_the_broker():
    broker = object()
    table = apis.dispatch(broker)
    assert set(table) == set(TABLE_RANGES)
    for row in apis.TABLE:
        handler = table[row.key]
        assert isinstance(handler, functools.partial)
        assert handler.func is row.handle and handler.args == (broker,)


def test_a_key_declared_twice_fails_when_the_table_is_built():
    rows = list(apis.TABLE) + [apis.Api(ApiKey.METADATA, 0, 1, apis.TABLE[0].handle)]
    with pytest.raises(ValueError, match="METADATA declared twice"):
        apis.index(rows)
    assert apis.index(apis.TABLE).keys() == {r.key for r in apis.TABLE}


def test_a_range_outside_the_schema_fails_when_the_table_is_built():
    with pytest.raises(ValueError, match="outside its schema range"):
        apis.index([apis.Api(ApiKey.METADATA, 0, 99, apis.TABLE[0].handle)])
    with pytest.raises(ValueError, match="not a valid ApiKey"):
        apis.index([apis.Api(57, 0, 0, apis.TABLE[0].handle)])
