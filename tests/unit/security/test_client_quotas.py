"""Client quota decisions without a broker: Kafka's entity precedence (per key), which clients share a
rate, the throttle time formula, value checks, and the znode paths of entities."""
from __future__ import annotations

import pytest

from kbroker.security.connection_quotas import UNBOUNDED, ConnectionQuotas
from kbroker.security.quotas import DEFAULT, FETCH, MUTATION, PRODUCE, REQUEST, QuotaManager, validate
from kbroker.zk.quotas import entity_path, parse_entity_path

LEVELS = [("alice", "app"), ("alice", DEFAULT), ("alice", None), (DEFAULT, "app"), (DEFAULT, DEFAULT),
          (DEFAULT, None), (None, "app"), (None, DEFAULT)]


def test_each_level_wins_over_the_ones_after_it():
    m = QuotaManager(2, 1.0)
    for i, (u, c) in enumerate(LEVELS):
        m.set_entity(u, c, {PRODUCE: str(1000 + i)})
    for i, entity in enumerate(LEVELS):
        assert m.lookup("User:alice", "app").bounds[PRODUCE][0] == 1000 + i
        m.set_entity(*entity, {})          # remove it: the next level decides
    assert m.lookup("User:alice", "app") is None


def test_precedence_is_per_key():
    m = QuotaManager(2, 1.0)
    m.set_entity("alice", None, {PRODUCE: "100"})
    m.set_entity(None, "app", {PRODUCE: "5", FETCH: "200"})
    q = m.lookup("User:alice", "app")
    assert q.bounds[PRODUCE][0] == 100 and q.bounds[FETCH][0] == 200 and not q.has(REQUEST)


def test_rates_are_shared_as_the_matched_entity_names_them():
    t = [0.0]
    m = QuotaManager(2, 1.0, clock=lambda: t[0])
    m.set_entity(DEFAULT, None, {PRODUCE: "1000"})      # each user its own rate, whatever its client-id
    m.set_entity(None, "shared", {FETCH: "1000"})       # every user of client-id "shared" one rate
    a1, a2, b = m.lookup("User:a", "x"), m.lookup("User:a", "y"), m.lookup("User:b", "x")
    assert a1.bounds[PRODUCE][1] is a2.bounds[PRODUCE][1] is not b.bounds[PRODUCE][1]
    assert m.lookup("User:a", "shared").bounds[FETCH][1] is m.lookup("User:b", "shared").bounds[FETCH][1]


def test_throttle_time_is_kafkas():
    t = [100.0]
    m = QuotaManager(2, 1.0, clock=lambda: t[0])
    m.set_entity(None, "app", {PRODUCE: "1000"})
    q = m.lookup("User:ANONYMOUS", "app")
    q.record(PRODUCE, 1000)         # elapsed counts at least (2 - 1) windows: exactly at the bound
    assert q.throttle_ms(PRODUCE) == 0
    q.record(PRODUCE, 2000)         # 3000 B over 1 s at 1000 B/s: (3000 - 1000) / 1000 x 1 s
    assert q.throttle_ms(PRODUCE) == 2000
    t[0] += 1.5                     # 3000 B over 1.5 s: 1.5 s more
    assert q.throttle_ms(PRODUCE) == 1500
    t[0] += 1.0                     # the first window left the 2-window horizon
    assert q.throttle_ms(PRODUCE) == 0


@pytest.mark.parametrize("key,value,ok", [(PRODUCE, 1024.0, True), (PRODUCE, 0.0, False), (PRODUCE, 10.5, False),
                                          (REQUEST, 12.5, True), ("retention.ms", 1.0, False)])
def test_validate(key, value, ok):
    assert (validate(key, value) is None) == ok


def test_entity_paths_are_sanitized_and_read_back():
    assert entity_path("CN=a b/c", DEFAULT) == "users/CN%3Da%20b%2Fc/clients/<default>"
    assert entity_path(None, "x*y") == "clients/x%2Ay"
    for entity in LEVELS:
        assert parse_entity_path(entity_path(*entity)) == entity
    with pytest.raises(ValueError):
        parse_entity_path("topics/t")


def _mutation_manager(t):
    m = QuotaManager(2, 1.0, clock=lambda: t[0], mutation_samples=2, mutation_window_s=1.0)
    m.set_entity(None, "app", {MUTATION: "10"})       # 10 partitions/s, a burst of 2 x 1 s x 10 = 20
    return m


def test_strict_mutations_refused_once_the_bucket_is_below_zero():
    t = [50.0]
    m = _mutation_manager(t)
    assert m.mutation("User:a", "other", strict=True) is None
    q = m.mutation("User:a", "app", strict=True)
    assert q.admit(15) and q.admit(10)        # 20 -> 5 -> -5: the one that takes it below zero goes ahead
    assert not q.admit(1)                     # refused, not recorded
    assert q.throttle_ms == 500               # 5 partitions of debt at 10/s
    t[0] += 0.25
    q2 = m.mutation("User:b", "app", strict=True)     # clients/app: one bucket for every user of it
    assert not q2.admit(1) and q2.throttle_ms == 250
    t[0] += 0.5                               # refilled to +2.5
    assert q2.admit(1) and q2.throttle_ms == 250      # the last refusal's time stays the answer's


def test_permissive_mutations_always_go_ahead_and_throttle_by_the_debt():
    t = [50.0]
    m = _mutation_manager(t)
    q = m.mutation("User:a", "app", strict=False)
    assert q.admit(20) and q.throttle_ms == 0         # exactly the burst: no debt
    assert q.admit(30) and q.throttle_ms == 3000
    t[0] += 100                                       # refilled, but never above the burst
    q = m.mutation("User:a", "app", strict=False)
    assert q.admit(21) and q.throttle_ms == 100


def test_mutation_quota_does_not_take_connections_off_the_native_path():
    m = _mutation_manager([0.0])
    assert m.lookup("User:a", "app") is None          # no Produce/Fetch/request bound


def test_connection_rate_per_address_with_a_default():
    t = [10.0]
    cq = ConnectionQuotas(samples=2, window_s=1.0, clock=lambda: t[0])
    cq.set_ip("10.0.0.1", {"connection_creation_rate": "2"})
    # the third in the first second: (3 / 2 - 1) x 1 s; not recorded, so the fourth is held as long
    assert [cq.ip_throttle_ms("10.0.0.1") for _ in range(4)] == [0, 0, 500, 500]
    assert cq.ip_throttle_ms("10.0.0.2") == 0                 # no bound of its own, no default
    cq.set_ip(DEFAULT, {"connection_creation_rate": "1"})
    assert [cq.ip_throttle_ms("10.0.0.2") for _ in range(2)] == [0, 1000]     # at most one window
    cq.set_ip("10.0.0.3", {"connection_creation_rate": "0"})  # no connections at all
    assert cq.ip_throttle_ms("10.0.0.3") == 1000
    t[0] += 1.5
    assert cq.ip_throttle_ms("10.0.0.1") == 0                 # 3 in 1.5 s: back at the bound
    assert cq.set_ip("10.0.0.1", {}) and cq.set_ip(DEFAULT, {})     # both removed: no bound
    assert not cq.set_ip(DEFAULT, {}) and [cq.ip_throttle_ms("10.0.0.1") for _ in range(5)] == [0] * 5


def test_broker_wide_connection_rate():
    t = [10.0]
    assert ConnectionQuotas(clock=lambda: t[0]).accept_delay_ms("PLAINTEXT", False) == (0, 0)   # unbounded
    cq = ConnectionQuotas(broker_rate=2, samples=2, window_s=1.0, clock=lambda: t[0])
    assert [cq.accept_delay_ms("PLAINTEXT", False)[0] for _ in range(4)] == [0, 0, 500, 1000]   # each recorded
    assert cq.accept_delay_ms("REPLICATION", True) == (0, 0)     # the inter-broker listener is not bound by it


def test_listener_connection_rate():
    """listener.name.<l>.max.connection.creation.rate: each listener's own rate, the inter-broker one's
    too; a connection is counted in the broker-wide rate as well; set_rates applies new bounds at once."""
    t = [10.0]
    cq = ConnectionQuotas(samples=2, window_s=1.0, clock=lambda: t[0])
    cq.set_rates(4, {"EXTERNAL": 2, "REPLICATION": 1})
    assert [cq.accept_delay_ms("EXTERNAL", False) for _ in range(3)] == [(0, 0), (0, 0), (0, 500)]
    assert [cq.accept_delay_ms("REPLICATION", True) for _ in range(2)] == [(0, 0), (0, 1000)]
    assert cq.accept_delay_ms("INTERNAL", False) == (0, 0)          # no bound of its own; 4 in the broker's rate
    assert cq.accept_delay_ms("INTERNAL", False) == (250, 0)
    cq.set_rates(UNBOUNDED, {"EXTERNAL": 100})
    assert cq.accept_delay_ms("EXTERNAL", False) == (0, 0) and cq.accept_delay_ms("REPLICATION", True) == (0, 0)
    assert set(cq._listeners) == {"EXTERNAL"}                        # the dropped bound's rate is gone
