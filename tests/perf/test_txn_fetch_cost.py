"""Smoke test of the read_committed fetch cost tool (perf/txn_fetch_cost.py): one quick round against
a one-broker cluster. No timing assertions (figures of a quick run on a shared machine mean nothing):
both isolation levels read the whole partition (every transaction ended, so the LSO is the HW and the
same batches are served), and the result is well formed."""
from __future__ import annotations

from kbroker.perf import txn_fetch_cost


def test_one_round():
    lines = []
    res = txn_fetch_cost.run(mb=2, batch_kb=16, txn_batches=4, abort_every=3, rounds=1, out=lines.append)
    (seen,) = res["rounds"]
    assert seen[0][0] == seen[1][0] >= 2 << 20
    assert len(res["ratios"]) == 1 and lines[-1].startswith("median ratio")
