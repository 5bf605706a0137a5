"""failOnDataLoss: offsets removed by retention fail a read that needs them (the message names the
option) or, with failOnDataLoss=false, are skipped; the data that remains is read in full. A
broker of its own with a 1 s retention check and small segments makes retention happen fast."""
from __future__ import annotations

import json

import pytest

from kbroker.testing import LocalCluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_fail_on_data_loss_after_retention(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from kbroker.spark.kafka import DataLossError, latest_offsets, plan_batch, read_range
    from kbroker.spark.options import read_config

    with LocalCluster(tmp_path, brokers=1, overrides={"log.retention.check.interval.ms": 500}) as cluster:
        bs = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        admin.create_topics([NewTopic("gone", 1, 1, config={"segment.bytes": "16384", "retention.bytes": "32768"})
                             ])["gone"].result(30)
        p = Producer({"bootstrap.servers": bs, "linger.ms": 0, "batch.size": 4096})
        for i in range(2000):
            p.produce("gone", value=b"%05d" % i + b"x" * 95, partition=0)
            if i % 100 == 0:
                p.flush(10)
        assert p.flush(30) == 0
        opts = {"kafka.bootstrap.servers": bs, "subscribe": "gone"}
        cfg = read_config(opts, streaming=False)
        # retention may take several checks to get under retention.bytes: wait until the log start offset
        # has stayed where it is over four checks (2 s), so the plans below all see the same one
        seen = []

        def settled():
            seen.append(latest_offsets(cfg)[0][("gone", 0)])
            return len(seen) >= 9 and seen[-1] > 0 and len(set(seen[-9:])) == 1
        wait_until(settled, timeout=60, what="retention to delete segments and settle", interval=0.25)
        earliest = seen[-1]
        wanted = dict(opts, startingOffsets=json.dumps({"gone": {"0": 0}}))
        with pytest.raises(DataLossError, match="failOnDataLoss"):
            plan_batch(read_config(wanted, streaming=False))
        # planned before the deletion (a streaming batch, a long task): the task sees it
        with pytest.raises(DataLossError, match="failOnDataLoss"):
            list(read_range(cfg.client, "gone", 0, 0, 2000, False, True, 1000, 1 << 20))
        rows = [o for rb in read_range(cfg.client, "gone", 0, 0, 2000, False, False, 1000, 1 << 20)
                for o in rb.column("offset").to_pylist()]
        lenient = plan_batch(read_config(dict(wanted, failOnDataLoss="false"), streaming=False))
    assert rows == list(range(rows[0], 2000)) and rows[0] >= earliest > 0
    assert [(r.start, r.end) for r in lenient] == [(earliest, 2000)]
