import pytest


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """One real ZooKeeper (Debian's package) for the whole test session, on a free loopback port.

    tickTime 1000 ms: sessions may be negotiated between 2 s and 20 s.
    Yields a ``kbroker.zk.local.ZkProcess`` (``.connect_string``, ``.port``, ``.tick_time_ms``).
    Tests should isolate themselves under a chroot (``f"{zk_server.connect_string}/<unique>"``).
    """
    from kbroker.zk.local import start_zookeeper

    proc = start_zookeeper(tmp_path_factory.mktemp("zookeeper"), port=0, tick_time_ms=1000, die_with_parent=True)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory):
    """One ZooKeeper + one kbroker broker for the whole session (tests use their own topic names).
    Auto-created topics get 3 partitions. Fault tests start their own LocalCluster."""
    from kbroker.testing import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("cluster"), brokers=1, num_partitions=3) as cluster:
        yield cluster


@pytest.fixture
def bootstrap(kafka_cluster):
    return kafka_cluster.bootstrap
