"""Partition rules on real log files: high watermark = min LEO over the ISR, never decreasing, not
advancing below min.insync.replicas or when stale; ISR shrink after the lag time, expansion only
from a fetch in the current epoch at max(HW, epoch start) (KAFKA-7128)."""
from kbroker.log import Log, LogConfig
from kbroker.replica import LeaderAndIsrState, Partition

from test_log import T0, batch


def leader(tmp_path, isr=(0, 1, 2), replicas=(0, 1, 2), epoch=3, min_isr=2, records=0):
    lg = Log(str(tmp_path / "t-0"), "t", 0, LogConfig({"min.insync.replicas": min_isr}), hw_follows_leo=False)
    for _ in range(records):
        lg.append_as_leader(batch(2), 1, T0)
    p = Partition("t", 0, lg, 0)
    p.make_leader(LeaderAndIsrState(0, epoch, list(isr), list(replicas), 7), now_ms=1000)
    return p


def test_hw_is_min_leo_of_isr_and_never_decreases(tmp_path):
    p = leader(tmp_path)
    for _ in range(5):
        p.log.append_as_leader(batch(2), 3, T0)
    assert p.log.log_end_offset == 10
    assert not p.maybe_increment_hw()              # followers' LEOs unknown
    p.update_follower(1, 6, 3, 1100)
    assert not p.maybe_increment_hw()
    p.update_follower(2, 4, 3, 1100)
    assert p.maybe_increment_hw() and p.log.high_watermark == 4
    p.update_follower(2, 10, 3, 1200)
    assert p.maybe_increment_hw() and p.log.high_watermark == 6
    p.update_follower(1, 2, 3, 1300)               # a follower reporting less cannot lower it
    assert not p.maybe_increment_hw() and p.log.high_watermark == 6


def test_hw_does_not_advance_below_min_isr_or_when_stale(tmp_path):
    p = leader(tmp_path, isr=(0,), min_isr=2)
    p.log.append_as_leader(batch(2), 3, T0)
    assert not p.maybe_increment_hw() and p.log.high_watermark == 0
    q = leader(tmp_path / "b", isr=(0,), min_isr=1)
    q.log.append_as_leader(batch(2), 3, T0)
    assert q.maybe_increment_hw() and q.log.high_watermark == 2
    q.stale = True
    q.log.append_as_leader(batch(2), 3, T0)
    assert not q.maybe_increment_hw() and q.log.high_watermark == 2


def test_shrink_after_lag_and_caught_up_rules(tmp_path):
    p = leader(tmp_path)
    p.log.append_as_leader(batch(2), 3, T0)        # LEO 2
    lag = 10_000
    assert p.out_of_sync(1000 + lag, lag) == []
    p.update_follower(1, 2, 3, 5000)                # at the LEO: caught up at 5000
    p.update_follower(2, 0, 3, 5000)                # behind
    assert p.out_of_sync(1000 + lag + 1, lag) == [2]
    # Follower 2 reaches, in its next fetch, the LEO the leader had at its previous fetch: it
    # counts as caught up as of that previous fetch.
    p.log.append_as_leader(batch(2), 3, T0)         # LEO 4
    p.update_follower(2, 2, 3, 12_000)
    assert p.followers[2].last_caught_up_ms == 5000
    assert p.out_of_sync(15_500, lag) == [1, 2]    # neither has fetched since 5000
    assert p.out_of_sync(15_000, lag) == []


def test_expand_needs_current_epoch_and_epoch_start(tmp_path):
    p = leader(tmp_path, isr=(0, 1), records=3)     # LEO 6 when this epoch starts
    assert p.epoch_start_offset == 6
    p.log.append_as_leader(batch(2), 3, T0)         # LEO 8
    p.update_follower(1, 8, 3, 1100)
    assert p.maybe_increment_hw() and p.log.high_watermark == 8
    p.update_follower(2, 8, 2, 1100)                # caught up, but its fetch was in epoch 2
    assert not p.can_join_isr(2)
    p.update_follower(2, 5, 3, 1200)                # current epoch, below the epoch start
    assert not p.can_join_isr(2)
    p.update_follower(2, 8, 3, 1300)
    assert p.can_join_isr(2)


def test_new_leader_epoch_start_and_listoffsets_readiness(tmp_path):
    p = leader(tmp_path, records=2)                 # LEO 4, HW 0 (checkpoint lost)
    assert p.log.epoch_cache.entries[-1] == (3, 4)
    assert not p.leader_hw_ready()
    p.update_follower(1, 4, 3, 1100)
    p.update_follower(2, 4, 3, 1100)
    assert p.maybe_increment_hw() and p.leader_hw_ready()


def test_follower_state_and_same_epoch_replica_change(tmp_path):
    p = leader(tmp_path)
    assert set(p.followers) == {1, 2}
    assert p.make_follower(LeaderAndIsrState(1, 4, [0, 1, 2], [0, 1, 2], 8))
    assert not p.is_leader and p.followers == {}
    assert not p.make_follower(LeaderAndIsrState(1, 4, [1, 2], [0, 1, 2], 9))
    assert p.make_leader(LeaderAndIsrState(0, 5, [0, 1], [0, 1, 3], 10), 2000)
    assert set(p.followers) == {1, 3}


# ---- epoch truncation decisions (replica/fetcher.py truncation_step) on real logs ------------------

def epochs_log(tmp_path, name, history, leo):
    """A follower log whose batches carry the leader epochs of ``history`` [(epoch, start)]."""
    from kbroker.log import Log, LogConfig

    lg = Log(str(tmp_path / name / "t-0"), "t", 0, LogConfig(), hw_follows_leo=False)
    bounds = [s for _e, s in history[1:]] + [leo]
    for (epoch, start), end in zip(history, bounds):
        while lg.log_end_offset < end:
            lg.append_as_leader(batch(1), epoch, T0)
    assert lg.epoch_cache.entries == history
    return lg



def test_truncation_steps_agree_on_the_divergence_point(tmp_path):
    from kbroker.replica.fetcher import truncation_step

    # KIP-101: same epoch, the leader's log ends earlier -> truncate to the leader's end.
    f = epochs_log(tmp_path, "a", [(0, 0)], 10)
    assert truncation_step(f, 0, 0, 6) == (6, None)
    # KIP-279: the leader never had our epoch 1; it answers epoch 0 ending at 10, where we left
    # epoch 0 at 8 -> the logs agree up to 8.
    f = epochs_log(tmp_path, "b", [(0, 0), (1, 8)], 12)
    assert truncation_step(f, 1, 0, 10) == (8, None)
    # Several rounds: we hold epochs 0 and 3, the leader 0, 1 and 2. Asked about 3 it answers 2;
    # we do not hold 2, so we ask about our epoch below it (0); its answer (0 ends at 4) decides.
    f = epochs_log(tmp_path, "c", [(0, 0), (3, 5)], 9)
    assert truncation_step(f, 3, 2, 7) == (None, 0)
    assert truncation_step(f, 0, 0, 4) == (4, None)
    # No usable answer: fall back to the high watermark.
    f.high_watermark = 3
    assert truncation_step(f, 3, -1, -1) == (3, None)
