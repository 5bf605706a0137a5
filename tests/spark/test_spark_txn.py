"""The Spark source with kafka.isolation.level=read_committed over transactions written by confluent-kafka:
the DataFrame holds exactly the committed records (aborted ones and markers skipped) and stops at the last
stable offset (an open transaction's records are not read); read_uncommitted reads every data record."""
from __future__ import annotations

import uuid

import confluent_kafka as ck
import pytest

from spark_util import create_topic

pytestmark = pytest.mark.timeout(600)


def _txn(bootstrap, tid, topic, values, commit: bool | None):
    """One transaction of ``values`` over 2 partitions; commit, abort, or (None) leave it open (for up to
    10 minutes: the coordinator must not abort it while Spark reads)."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                     "transaction.timeout.ms": 600000})
    p.init_transactions(30)
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % 2)
    p.flush(30)
    if commit is True:
        p.commit_transaction(30)
    elif commit is False:
        p.abort_transaction(30)
    return p


def _values(spark, bootstrap, topic, isolation) -> list[bytes]:
    df = (spark.read.format("kbroker").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("kafka.isolation.level", isolation).load())
    return sorted(bytes(r.value) for r in df.select("value").collect())


def test_read_committed_skips_aborted_and_stops_at_the_lso(spark, bootstrap):
    topic = f"stxn-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    committed, aborted, open_ = [], [], []
    # Interleaved: two producers, so an aborted transaction's batches sit between committed ones.
    a = _txn(bootstrap, f"{topic}-a", topic, [b"c1-%d" % i for i in range(40)], True)
    committed += [b"c1-%d" % i for i in range(40)]
    _txn(bootstrap, f"{topic}-b", topic, [b"x1-%d" % i for i in range(30)], False)
    aborted += [b"x1-%d" % i for i in range(30)]
    a.begin_transaction()
    for i in range(20):
        a.produce(topic, value=b"c2-%d" % i, partition=i % 2)
    a.flush(30)
    b = _txn(bootstrap, f"{topic}-b", topic, [b"x2-%d" % i for i in range(25)], None)
    a.commit_transaction(30)
    committed += [b"c2-%d" % i for i in range(20)]
    b.abort_transaction(30)
    aborted += [b"x2-%d" % i for i in range(25)]
    _txn(bootstrap, f"{topic}-a", topic, [b"c3-%d" % i for i in range(10)], True)
    committed += [b"c3-%d" % i for i in range(10)]
    # Left open while Spark reads: the last stable offset stops the read before it.
    o = _txn(bootstrap, f"{topic}-o", topic, [b"o-%d" % i for i in range(15)], None)
    open_ += [b"o-%d" % i for i in range(15)]
    try:
        assert _values(spark, bootstrap, topic, "read_committed") == sorted(committed)
        assert _values(spark, bootstrap, topic, "read_uncommitted") == sorted(committed + aborted + open_)
    finally:
        o.abort_transaction(30)
