"""A broker that has not yet had the controller's first UpdateMetadata does not answer Metadata with
"no controller": it holds the request until that update (bounded), as Kafka holds client requests
until its startup completes. The window is held open on purpose: the test's own ZooKeeper session
owns /controller (a broker id that does not exist), so the new broker cannot be elected until the
test closes that session."""
import select
import threading

import confluent_kafka.admin as ck_admin
import pytest
from kazoo.client import KazooClient

from kbroker.protocol import api
from kbroker.server.apis.core import STARTUP_METADATA_WAIT_S
from kbroker.testing import BrokerProc, LocalCluster, free_port
from kbroker.zk import layout as L

from checkers import RawConn

METADATA = 3


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path, brokers=0)
    c.start()   # ZooKeeper only
    try:
        yield c
    finally:
        c.stop()


def _hold_controller(zk_connect: str) -> KazooClient:
    zk = KazooClient(hosts=zk_connect, timeout=10)
    zk.start(timeout=10)
    zk.ensure_path("/")
    zk.create(L.CONTROLLER, L.encode_controller(99), ephemeral=True, makepath=True)
    return zk


def _answered_within(conn: RawConn, seconds: float) -> bool:
    return bool(select.select([conn.sock], [], [], seconds)[0])


def test_metadata_waits_for_the_first_update_metadata(cluster):
    holder = _hold_controller(cluster.zk_connect)
    try:
        cluster.brokers[0] = BrokerProc(0, free_port(), cluster.root)
        b = cluster.start_broker(0, wait_controller=False)     # registered and answering ApiVersions
        bootstrap = f"127.0.0.1:{b.port}"
        with RawConn(bootstrap) as raw:
            raw.correlation += 1
            raw.send(api.encode_request(METADATA, 1, raw.correlation, "startup", {"topics": []}))
            # Before the change this broker answered at once with controller_id -1.
            assert not _answered_within(raw, 0.5), "Metadata answered before the controller's metadata"
            got = {}
            client = threading.Thread(target=lambda: got.update(
                md=ck_admin.AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)))
            client.start()
            holder.stop()       # /controller goes with the session: broker 0 is elected
            holder.close()
            holder = None
            cid, body = api.decode_response(METADATA, 1, raw.recv_frame(timeout=STARTUP_METADATA_WAIT_S + 10))
            assert cid == raw.correlation and body["controller_id"] == 0, body
            assert [x["node_id"] for x in body["brokers"]] == [0]
            client.join(timeout=40)
            assert got["md"].controller_id == 0, got
    finally:
        if holder is not None:
            holder.stop()
            holder.close()


def test_metadata_answers_after_the_wait_when_no_controller_comes(cluster):
    holder = _hold_controller(cluster.zk_connect)
    try:
        cluster.brokers[0] = BrokerProc(0, free_port(), cluster.root)
        b = cluster.start_broker(0, wait_controller=False)
        # librdkafka gets an answer (itself as the only broker, no controller) instead of none.
        md = ck_admin.AdminClient({"bootstrap.servers": f"127.0.0.1:{b.port}"}).list_topics(
            timeout=STARTUP_METADATA_WAIT_S + 20)
        assert list(md.brokers) == [0] and md.controller_id == -1
    finally:
        holder.stop()
        holder.close()
