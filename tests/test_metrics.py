"""The /metrics endpoint serves Kafka's JMX-exporter names, and the counters follow real traffic."""
import re
import time
import urllib.error
import urllib.request

import confluent_kafka as ck
import pytest

from kbroker.testing import LocalCluster, free_port


def _samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    port = free_port()
    with LocalCluster(tmp_path_factory.mktemp("metrics"), num_partitions=2,
                      overrides={"kbroker.metrics.port": port}) as c:
        yield c, port


def test_metrics_follow_produce_and_fetch(metered):
    cluster, port = metered
    url = f"http://127.0.0.1:{port}/metrics"
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(3000):
        p.produce("metered", value=b"v" * 1000)
    assert p.flush(30) == 0
    # No auto-commit: consumer groups (and their coordinator) are a later issue; librdkafka would
    # otherwise wait for a coordinator on close.
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "m", "enable.auto.commit": False})
    c.assign([ck.TopicPartition("metered", i, ck.OFFSET_BEGINNING) for i in range(2)])
    got, errors = 0, []
    deadline = time.monotonic() + 60
    while got < 3000 and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1):
            if m.error():
                errors.append(str(m.error()))
            else:
                got += 1
    c.close()
    assert got == 3000, f"consumed {got} of 3000; errors: {errors[:5]}"

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for name in ("kafka_server_brokertopicmetrics_messagesin_total", "kafka_server_brokertopicmetrics_bytesin_total",
                 "kafka_server_brokertopicmetrics_bytesout_total", "kafka_network_requestmetrics_requests_total",
                 "kafka_controller_kafkacontroller_activecontrollercount"):
        assert f"# TYPE {name} " in text
    s = _samples(text)
    assert s['kafka_server_brokertopicmetrics_messagesin_total{topic="metered"}'] == 3000
    stored = s['kafka_server_brokertopicmetrics_bytesin_total{topic="metered"}']
    assert stored > 3000 * 1000
    assert s['kafka_server_brokertopicmetrics_bytesout_total{topic="metered"}'] >= stored
    assert s["kafka_controller_kafkacontroller_activecontrollercount"] == 1
    assert any(re.match(r'kafka_network_requestmetrics_requests_total\{request="Produce",version="\d+"\}', k) for k in s)
    # Every fetched byte left through sendfile or the counted copy path, and most through sendfile.
    sent = s["kbroker_network_fetch_sendfile_bytes_total"] + s["kbroker_network_fetch_copy_bytes_total"]
    assert sent == s["kafka_server_brokertopicmetrics_bytesout_total"]
    assert s["kbroker_network_fetch_sendfile_bytes_total"] >= 0.9 * sent


def test_metrics_unknown_path_is_404(metered):
    _cluster, port = metered
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
    assert e.value.code == 404
