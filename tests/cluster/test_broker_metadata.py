"""Topics written to ZooKeeper by someone else (another broker's controller, an operator tool) reach
the broker through its /brokers/topics watch: it opens the logs it leads and serves them; topics removed
from ZooKeeper leave its metadata."""
import uuid

import confluent_kafka as ck
from kazoo.client import KazooClient

from kbroker.testing import wait_until
from kbroker.zk import layout as L

from checkers import RawConn

METADATA = 3


def _topic_names(bootstrap):
    with RawConn(bootstrap) as raw:
        return {t["name"] for t in raw.request(METADATA, 8, {"topics": None})["topics"]}


def test_topic_written_to_zookeeper_elsewhere_is_served(kafka_cluster):
    name = f"external-{uuid.uuid4().hex[:8]}"
    zk = KazooClient(hosts=kafka_cluster.zk.connect_string)
    zk.start(timeout=10)
    try:
        assignment = {0: [0], 1: [0]}
        tx = zk.transaction()
        tx.create(L.topic_path(name), L.encode_topic(assignment, L.new_uuid_base64()))
        tx.create(L.topic_partitions_path(name))
        for p in assignment:
            tx.create(L.partition_path(name, p))
            tx.create(L.partition_state_path(name, p), L.encode_partition_state(L.PartitionState(0, 0, [0], 1)))
        assert all(not isinstance(r, Exception) for r in tx.commit())

        wait_until(lambda: name in _topic_names(kafka_cluster.bootstrap), 15, f"{name} in the broker's metadata")
        p = ck.Producer({"bootstrap.servers": kafka_cluster.bootstrap, "allow.auto.create.topics": False})
        for i in range(10):
            p.produce(name, value=b"v%d" % i, partition=i % 2)
        assert p.flush(15) == 0
        logs = kafka_cluster.brokers[0].data_dir
        assert (logs / f"{name}-0").is_dir() and (logs / f"{name}-1").is_dir()

        # Gone from ZooKeeper -> gone from the broker's metadata.
        zk.delete(L.topic_path(name), recursive=True)
        wait_until(lambda: name not in _topic_names(kafka_cluster.bootstrap), 15, f"{name} to leave metadata")
    finally:
        zk.stop()
        zk.close()
