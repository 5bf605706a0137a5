import pytest


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """One real ZooKeeper (Debian's package) for the whole test session, on a free loopback port.

    tickTime 1000 ms: sessions may be negotiated between 2 s and 20 s.
    Yields a ``kbroker.zk.local.ZkProcess`` (``.connect_string``, ``.port``, ``.tick_time_ms``).
    Tests should isolate themselves under a chroot (``f"{zk_server.connect_string}/<unique>"``).
    """
    from kbroker.zk.local import start_zookeeper

    proc = start_zookeeper(tmp_path_factory.mktemp("zookeeper"), port=0, tick_time_ms=1000)
    try:
        yield proc
    finally:
        proc.stop()
