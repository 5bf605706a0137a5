"""The controller's pure rules: replica placement (Kafka's rack-unaware and rack-aware
assignReplicasToBrokers) and leader election choices. Integration tests on real clusters are in
test_controller.py / test_controller_failover.py."""
from collections import Counter

import pytest

from kbroker.controller import election
from kbroker.controller.assignment import AssignmentError, assign_replicas, rack_alternated
from kbroker.protocol.errors import Errors


def test_rack_unaware_matches_kafkas_fixed_start_example():
    # Kafka's documented example: 5 brokers, 10 partitions, RF 3, start index 0.
    got = assign_replicas(range(5), 10, 3, start_index=0)
    assert got == {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
                   5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}


def test_rack_alternated_broker_list():
    assert rack_alternated({0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}) == \
        [0, 3, 1, 5, 4, 2]


@pytest.mark.parametrize("racks", [
    {0: "a", 1: "a", 2: "b"},
    {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"},
    {0: "r1", 1: "r1", 2: "r2", 3: "r2"},
])
def test_rack_aware_spreads_every_partition_over_racks(racks):
    n_racks = len(set(racks.values()))
    for rf in range(1, len(racks) + 1):
        got = assign_replicas(racks, 24, rf, racks=racks)
        for p, replicas in got.items():
            assert len(set(replicas)) == rf
            # As many distinct racks as the replication factor allows.
            assert len({racks[r] for r in replicas}) == min(rf, n_racks), (rf, p, replicas)
        # Leaders rotate over every broker evenly.
        leaders = Counter(r[0] for r in got.values())
        assert set(leaders) == set(racks) and max(leaders.values()) - min(leaders.values()) <= 1


def test_mixed_rack_information_falls_back_to_rack_unaware():
    got = assign_replicas([0, 1, 2], 3, 2, start_index=0, racks={0: "a", 1: None, 2: "b"})
    assert got == assign_replicas([0, 1, 2], 3, 2, start_index=0)


def test_replication_factor_and_partition_count_checks():
    with pytest.raises(AssignmentError) as e:
        assign_replicas([0, 1, 2], 1, 4)
    assert e.value.code == Errors.INVALID_REPLICATION_FACTOR
    assert e.value.message == "Replication factor: 4 larger than available brokers: 3."
    with pytest.raises(AssignmentError) as e:
        assign_replicas([0], 0, 1)
    assert e.value.code == Errors.INVALID_PARTITIONS
    with pytest.raises(AssignmentError) as e:
        assign_replicas([0], 1, 0)
    assert e.value.code == Errors.INVALID_REPLICATION_FACTOR


def test_offline_election_prefers_assignment_order_within_the_live_isr():
    assert election.offline([1, 2, 3], [3, 2], live={2, 3}) == (2, [3, 2])
    # The dead leave the ISR; no live ISR member: offline unless unclean.
    assert election.offline([1, 2, 3], [1], live={2, 3}) is None
    assert election.offline([1, 2, 3], [1], live={2, 3}, unclean=True) == (2, [2])
    assert election.offline([1, 2, 3], [1], live=set(), unclean=True) is None


def test_controlled_shutdown_and_preferred_elections():
    assert election.controlled_shutdown([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1}) == (2, [2, 3])
    assert election.controlled_shutdown([1, 2], [1], {1, 2}, {1}) is None   # nobody in sync to take over
    assert election.preferred([1, 2, 3], [2, 1], {1, 2, 3}) == (1, [2, 1])
    assert election.preferred([1, 2, 3], [2, 3], {1, 2, 3}) is None          # preferred not in sync
    assert election.preferred([1, 2, 3], [1, 2], {2, 3}) is None             # preferred not alive


def test_removing_a_replica_keeps_the_last_isr_member():
    assert election.without_replica(1, [1, 2], 2) == (1, [1])
    assert election.without_replica(1, [1, 2], 1) == (-1, [2])
    assert election.without_replica(1, [1], 1) == (-1, [1])
