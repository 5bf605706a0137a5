"""Client quota decisions without a broker: Kafka's entity precedence (per key), which clients share a
rate, the throttle time formula, value checks, and the znode paths of entities."""
from __future__ import annotations

import pytest

from kbroker.security.quotas import DEFAULT, FETCH, PRODUCE, REQUEST, QuotaManager, validate
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
