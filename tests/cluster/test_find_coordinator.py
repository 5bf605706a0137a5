"""FindCoordinator: Kafka's placement rule (leader of __consumer_offsets partition
abs(javaHash(group)) % partitions), with the internal topic created on first use."""
from confluent_kafka.admin import AdminClient
import pytest

from kbroker.protocol import api
from kbroker.server.apis.coordinator import java_string_hash, partition_for


# Expected values printed by OpenJDK 17's String.hashCode().
@pytest.mark.parametrize("s, expected", [
    ("", 0), ("a", 97), ("hello", 99162322), ("consumer-group-1", 147483020),
    ("\u00e9t\u00e9", 227742), ("\U0001F600", 1772899),   # a surrogate pair counts as two code units
])
def test_java_string_hash(s, expected):
    assert java_string_hash(s) == expected


def test_partition_for_min_int_hash():
    # "polygenelubricants" hashes to Integer.MIN_VALUE; Kafka's Utils.abs maps it to 0.
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert partition_for("polygenelubricants", 50) == 0


def _find(bootstrap, group, version):
    import socket
    import struct
    host, port = bootstrap.split(",")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(api.encode_request(10, version, 5, "t", {"key": group, "key_type": 0}))
        n = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        return api.decode_response(10, version, memoryview(s.recv(n, socket.MSG_WAITALL)))[1]


def test_find_coordinator_creates_offsets_topic_and_names_its_leader(kafka_cluster):
    answer = _find(kafka_cluster.bootstrap, "g1", 2)
    assert answer["error_code"] == 0, answer
    assert (answer["node_id"], f"{answer['host']}:{answer['port']}") == (0, kafka_cluster.bootstrap)
    md = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap}).list_topics(timeout=10)
    offsets = md.topics["__consumer_offsets"]
    assert len(offsets.partitions) == 50
    # v0 carries no key type and no error message, and still answers.
    assert _find(kafka_cluster.bootstrap, "g2", 0)["node_id"] == 0
