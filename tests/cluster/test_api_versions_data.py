"""Every version Kafka 3.9 serves of the data-path APIs (InitProducerId, OffsetForLeaderEpoch,
ListOffsets, Metadata), sent through our codec over a real socket to a real broker, answered as Kafka
answers each version."""
import base64
import time

import pytest

from kbroker.protocol.api import ApiKey
from kbroker.protocol.errors import Errors
from kbroker.server import apis
from kbroker.testing import LocalCluster

from builders import T0, batch
from checkers import RawConn, create_topic

K = ApiKey
ZERO_ID = bytes(16)
TOPIC = "data-t"
# Three batches of 3 records, timestamps T0.., with the largest timestamp in the middle batch's last record.
STAMPS = [T0, T0 + 50, T0 + 20]


def _produce(raw, topic, partition, buf):
    r = raw.request(K.PRODUCE, 8, {"acks": -1, "timeout_ms": 10000, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": bytes(buf)}]}]})
    p = r["responses"][0]["partition_responses"][0]
    assert p["error_code"] == 0, p
    return p["base_offset"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("data-versions"), brokers=1) as c:
        create_topic(c.bootstrap, TOPIC, 2)
        with RawConn(c.bootstrap) as raw:
            for ts in STAMPS:
                _produce(raw, TOPIC, 0, batch(3, 10, ts=ts, ts_step=10))
        yield c


def _range(key):
    return next((row.min_version, row.max_version) for row in apis.TABLE if row.key == key)


def test_ranges_are_kafka_39s():
    assert {k: _range(k) for k in (K.API_VERSIONS, K.INIT_PRODUCER_ID, K.OFFSET_FOR_LEADER_EPOCH, K.LIST_OFFSETS,
                                   K.METADATA)} == {
        K.API_VERSIONS: (0, 4), K.INIT_PRODUCER_ID: (0, 5), K.OFFSET_FOR_LEADER_EPOCH: (0, 4),
        K.LIST_OFFSETS: (0, 9), K.METADATA: (0, 12)}


def test_newest_produce_and_fetch_advertised(cluster):
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    got = {k["api_key"]: (k["min_version"], k["max_version"]) for k in r["api_keys"]}
    assert (got[K.PRODUCE], got[K.FETCH]) == ((0, 11), (0, 17)) == (_range(K.PRODUCE), _range(K.FETCH))


@pytest.mark.parametrize("version", range(6))
def test_init_producer_id(cluster, version):
    with RawConn(cluster.bootstrap) as raw:
        a = raw.request(K.INIT_PRODUCER_ID, version, {"transactional_id": None, "transaction_timeout_ms": 60000})
        b = raw.request(K.INIT_PRODUCER_ID, version, {"transactional_id": None, "transaction_timeout_ms": 60000})
    assert (a["error_code"], a["producer_epoch"], b["error_code"]) == (0, 0, 0)
    assert a["producer_id"] >= 0 and b["producer_id"] not in (a["producer_id"], -1)


@pytest.mark.parametrize("version", range(5))
def test_offset_for_leader_epoch(cluster, version):
    body = {"replica_id": -2, "topics": [{"topic": TOPIC, "partitions": [
        {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0},
        {"partition": 9, "current_leader_epoch": -1, "leader_epoch": 0}]}]}
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.OFFSET_FOR_LEADER_EPOCH, version, body)
    p0, p9 = r["topics"][0]["partitions"]
    assert (p0["error_code"], p0["end_offset"]) == (0, 9)
    assert p9["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION
    if version >= 1:
        assert p0["leader_epoch"] == 0
    else:
        assert p0["leader_epoch"] == -1      # not in v0's answer: the decoder's default


def _list(raw, version, timestamp, partition=0, isolation=0, max_num=1):
    r = raw.request(K.LIST_OFFSETS, version, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                        "timestamp": timestamp, "max_num_offsets": max_num}]}]})
    return r["topics"][0]["partitions"][0]


def test_list_offsets_v0_old_style_offsets(cluster):
    with RawConn(cluster.bootstrap) as raw:
        latest = _list(raw, 0, -1, max_num=5)
        earliest = _list(raw, 0, -2, max_num=5)
        future = _list(raw, 0, int(time.time() * 1000) + 3600_000, max_num=5)
        past = _list(raw, 0, 1, max_num=5)
        empty = _list(raw, 0, -1, partition=1, max_num=5)
        unknown = _list(raw, 0, -1, partition=7)
    # one segment (base 0) holding 9 records: [log end, segment start] newest first, latest starts at the end
    assert (latest["error_code"], latest["old_style_offsets"]) == (0, [9, 0])
    assert earliest["old_style_offsets"] == [0]
    assert future["old_style_offsets"] == [9, 0]
    assert past["old_style_offsets"] == []           # no segment modified before 1970
    assert empty["old_style_offsets"] == [0]        # an empty active segment: only its start
    assert (unknown["error_code"], unknown["old_style_offsets"]) == (Errors.UNKNOWN_TOPIC_OR_PARTITION, [])


@pytest.mark.parametrize("version", range(1, 10))
def test_list_offsets_every_version(cluster, version):
    with RawConn(cluster.bootstrap) as raw:
        latest = _list(raw, version, -1)
        earliest = _list(raw, version, -2)
        by_time = _list(raw, version, T0 + 45)
    assert (latest["error_code"], latest["offset"]) == (0, 9)
    assert (earliest["error_code"], earliest["offset"]) == (0, 0)
    # the first record at or after T0+45: the second batch (T0+50, 60, 70) starts at offset 3
    assert (by_time["offset"], by_time["timestamp"]) == (3, T0 + 50)
    if version >= 4:
        assert latest["leader_epoch"] == 0


@pytest.mark.parametrize("version", [7, 8, 9])
def test_list_offsets_max_timestamp(cluster, version):
    """KIP-734: the offset of the record with the largest timestamp (the second batch's last, T0+70)."""
    with RawConn(cluster.bootstrap) as raw:
        r = _list(raw, version, -3)
        empty = _list(raw, version, -3, partition=1)
    assert (r["error_code"], r["offset"], r["timestamp"], r["leader_epoch"]) == (0, 5, T0 + 70, 0)
    assert (empty["error_code"], empty["offset"], empty["timestamp"]) == (0, -1, -1)


def test_list_offsets_earliest_local_and_latest_tiered(cluster):
    """v8 earliest-local is the log start (every record is local); v9 latest-tiered is -1 (none tiered)."""
    with RawConn(cluster.bootstrap) as raw:
        local = _list(raw, 8, -4)
        tiered = _list(raw, 9, -5)
    assert (local["error_code"], local["offset"]) == (0, 0)
    assert (tiered["error_code"], tiered["offset"], tiered["timestamp"]) == (0, -1, -1)


def _topic_id(raw):
    r = raw.request(K.METADATA, 10, {"topics": [{"name": TOPIC, "topic_id": ZERO_ID}]})
    return r["topics"][0]["topic_id"]


@pytest.mark.parametrize("version", range(13))
def test_metadata_every_version(cluster, version):
    absent = f"absent-{version}"
    topics = [{"name": TOPIC, "topic_id": ZERO_ID}, {"name": absent, "topic_id": ZERO_ID}]
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.METADATA, version, {"topics": topics, "allow_auto_topic_creation": False})
    by_name = {t["name"]: t for t in r["topics"]}
    t = by_name[TOPIC]
    assert t["error_code"] == 0 and sorted(p["partition_index"] for p in t["partitions"]) == [0, 1]
    assert all(p["leader_id"] == 0 for p in t["partitions"])
    if version >= 4:       # v0-3 auto-create whatever they name
        assert by_name[absent]["error_code"] == Errors.UNKNOWN_TOPIC_OR_PARTITION
    if version >= 10:
        assert t["topic_id"] != ZERO_ID and by_name[absent]["topic_id"] == ZERO_ID


def test_metadata_topic_id_is_partition_metadata_s(cluster):
    """The id answered is the one the log keeps in partition.metadata (Kafka's file)."""
    with RawConn(cluster.bootstrap) as raw:
        tid = _topic_id(raw)
    text = (cluster.brokers[0].data_dir / f"{TOPIC}-0" / "partition.metadata").read_text()
    assert base64.urlsafe_b64encode(tid).decode().rstrip("=") in text


def test_metadata_v12_by_topic_id(cluster):
    unknown = b"\x01" * 16
    with RawConn(cluster.bootstrap) as raw:
        tid = _topic_id(raw)
        r = raw.request(K.METADATA, 12, {"topics": [{"name": None, "topic_id": tid},
                                                    {"name": None, "topic_id": unknown}]})
    got = {t["topic_id"]: t for t in r["topics"]}
    assert (got[tid]["error_code"], got[tid]["name"], len(got[tid]["partitions"])) == (0, TOPIC, 2)
    assert (got[unknown]["error_code"], got[unknown]["name"]) == (Errors.UNKNOWN_TOPIC_ID, None)


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_ids_and_null_names_refused_before_v12(cluster, version):
    with RawConn(cluster.bootstrap) as raw:
        tid = _topic_id(raw)
        by_id = raw.request(K.METADATA, version, {"topics": [{"name": TOPIC, "topic_id": tid}]})
        null = raw.request(K.METADATA, version, {"topics": [{"name": None, "topic_id": ZERO_ID}]})
    assert [t["error_code"] for t in by_id["topics"] + null["topics"]] == [Errors.INVALID_REQUEST] * 2
    assert by_id["topics"][0]["partitions"] == []


def _fetch_body(version, tid, partition=0, offset=0, replica_id=-1):
    return {"replica_id": replica_id, "replica_state": {"replica_id": replica_id, "replica_epoch": -1},
            "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [
                {"topic": TOPIC, "topic_id": tid, "partitions": [
                    {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


@pytest.mark.parametrize("version", range(18))
def test_fetch_every_version(cluster, version):
    from kbroker.record import decode_records
    with RawConn(cluster.bootstrap) as raw:
        tid = _topic_id(raw)
        r = raw.request(K.FETCH, version, _fetch_body(version, tid, offset=3))
    t = r["responses"][0]
    p = t["partitions"][0]
    if version < 4:       # would need magic 0/1 message sets: refused, not converted
        assert (p["error_code"], p["records"] or b"") == (Errors.UNSUPPORTED_VERSION, b"")
        return
    assert (p["error_code"], p["high_watermark"]) == (0, 9)
    assert (t["topic_id"] if version >= 13 else t["topic"]) == (tid if version >= 13 else TOPIC)
    data = bytes(p["records"])
    assert [r[0] for r in decode_records(data)] == [3, 4, 5]


@pytest.mark.parametrize("version", [13, 15, 17])
def test_fetch_unknown_topic_id(cluster, version):
    unknown = b"\x02" * 16
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.FETCH, version, _fetch_body(version, unknown))
    t = r["responses"][0]
    assert (t["topic_id"], t["partitions"][0]["error_code"]) == (unknown, Errors.UNKNOWN_TOPIC_ID)


@pytest.mark.parametrize("version", range(12))
def test_produce_every_version(cluster, version):
    with RawConn(cluster.bootstrap) as raw:
        r = raw.request(K.PRODUCE, version, {"acks": 1, "timeout_ms": 10000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 1, "records": bytes(batch(2, 10))}]}]})
    p = r["responses"][0]["partition_responses"][0]
    if version < 3:       # magic 0/1 message sets only: refused, not converted
        assert p["error_code"] == Errors.UNSUPPORTED_VERSION
    else:
        assert p["error_code"] == 0 and p["base_offset"] >= 0


def test_not_leader_answers_name_the_leader(tmp_path_factory):
    """KIP-951: Produce v10+ and Fetch v16+ sent to a broker that does not lead the partition name the
    leader (tagged current_leader) and its address (tagged node_endpoints); older versions do not."""
    with LocalCluster(tmp_path_factory.mktemp("kip951"), brokers=2) as c:
        create_topic(c.bootstrap, "led", 1)
        with RawConn(c.bootstrap) as raw:
            t = raw.request(K.METADATA, 12, {"topics": [{"name": "led", "topic_id": ZERO_ID}]})["topics"][0]
        tid, leader, epoch = t["topic_id"], t["partitions"][0]["leader_id"], t["partitions"][0]["leader_epoch"]
        other = next(b for i, b in c.brokers.items() if i != leader)
        leader_port = c.brokers[leader].port
        with RawConn(f"127.0.0.1:{other.port}") as raw:
            produced = {v: raw.request(K.PRODUCE, v, {"acks": 1, "timeout_ms": 5000, "topic_data": [
                {"name": "led", "partition_data": [{"index": 0, "records": bytes(batch(1, 10))}]}]})
                for v in (9, 10, 11)}
            fetched = {v: raw.request(K.FETCH, v, dict(_fetch_body(v, tid), topics=[
                {"topic": "led", "topic_id": tid, "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}])) for v in (15, 16, 17)}
    for v, r in produced.items():
        p = r["responses"][0]["partition_responses"][0]
        assert p["error_code"] == Errors.NOT_LEADER_OR_FOLLOWER
        if v >= 10:
            assert p["current_leader"] == {"leader_id": leader, "leader_epoch": epoch}
            assert [(n["node_id"], n["port"]) for n in r["node_endpoints"]] == [(leader, leader_port)]
        else:
            assert p["current_leader"] == {"leader_id": -1, "leader_epoch": -1}     # the default: not sent
    for v, r in fetched.items():
        p = r["responses"][0]["partitions"][0]
        assert p["error_code"] == Errors.NOT_LEADER_OR_FOLLOWER
        if v >= 16:
            assert p["current_leader"] == {"leader_id": leader, "leader_epoch": epoch}
            assert [(n["node_id"], n["port"]) for n in r["node_endpoints"]] == [(leader, leader_port)]
        else:
            assert p["current_leader"] == {"leader_id": -1, "leader_epoch": -1}
