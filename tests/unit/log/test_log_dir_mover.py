"""Moving a replica between the log dirs of one broker (LogManager.alter_dir, Kafka's future replica):
filled while the current log takes appends, swapped in once caught up, every crash point recoverable,
the current log's truncations and log start followed, the future reported by DescribeLogDirs."""
import asyncio
import os
from types import SimpleNamespace

import pytest

from kbroker.log import LogManager
from kbroker.log.manager import DELETE_SUFFIX, FUTURE_SUFFIX
from kbroker.server.apis.log_admin import describe_log_dirs
import builders

T0 = builders.T0
CLUSTER = "Yk3Zc1pTQmW2bXJ0aWNsZQ"
TP = ("t", 0)


_sent = iter(range(1 << 30))


def batch(n=3):
    tag = next(_sent)       # every record's key tells which batch it came from
    return builders.batch(n, ts=T0, key=lambda i: b"%d-%d" % (tag, i), fill=b"m", ts_step=0)


def values(log) -> list:
    """Every record's (offset, key) from the log start, read back through the log."""
    from kbroker.record import decode_records
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, max_offset=log.log_end_offset)
        buf = b"".join(os.pread(fd, n, pos) for fd, pos, n in data.regions)
        recs = [(o, k) for o, _ts, k, _v, *_ in decode_records(buf) if o >= offset]
        assert recs, offset
        out += recs
        offset = recs[-1][0] + 1
    return out


def entries(d, suffix):
    return [n for n in os.listdir(d) if n.endswith(suffix)]


def manager(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    m = LogManager(dirs, {"log.segment.bytes": "4000"})
    m.startup(1, CLUSTER)
    return m, dirs


def log_in_a(tmp_path, batches):
    """A manager over dirs a and b, and a log in a with ``batches`` batches of 3 records."""
    m, (a, b) = manager(tmp_path)
    m.preferred_dirs[TP] = a
    log = m.get_or_create(*TP)
    for _ in range(batches):
        log.append_as_leader(batch(), 0, T0)
    return m, a, b, log


def crash(m):
    """Process death: the locks go, nothing is flushed or closed."""
    m.cleaner.stop()
    m._unlock()


async def wait_for(cond, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.002)


def test_a_move_under_appends_swaps_in_a_complete_copy(tmp_path):
    async def main():
        m, a, b, log = log_in_a(tmp_path, 60)
        replaced = []
        m.on_log_replaced = lambda tp, old, new: replaced.append((tp, old, new))
        m.alter_dir(TP, b)
        assert m.future_dir(TP) == b and len(entries(b, FUTURE_SUFFIX)) == 1
        appended = 0
        while not replaced:             # appends keep landing on the current log while it is copied
            if appended < 200:
                m.get(TP).append_as_leader(batch(), 1, T0)
                appended += 1
            await asyncio.sleep(0)
        [(tp, old, new)] = replaced
        assert old is log and m.get(TP) is new and m._dir_of[TP] == b and TP not in m.futures
        assert new.dir == os.path.join(b, "t-0") and new.log_end_offset == old.log_end_offset
        assert [v for _o, v in values(new)] == [v for _o, v in values(old)]
        assert [o for o, _v in values(new)] == list(range(new.log_end_offset))
        assert new.epoch_cache.entries == old.epoch_cache.entries
        assert not os.path.exists(os.path.join(a, "t-0")) and not entries(a, DELETE_SUFFIX)
        assert not entries(b, FUTURE_SUFFIX)
        assert new.append_as_leader(batch(), 1, T0).base_offset == old.log_end_offset
        m.shutdown()
        m2 = LogManager([a, b], {})
        m2.startup(1, CLUSTER)
        assert m2._dir_of[TP] == b and m2.get(TP).log_end_offset == new.log_end_offset
        m2.shutdown()
    asyncio.run(main())


def _half_copied(tmp_path, steps):
    """A log in dir a with a future in b, ``steps`` copy steps done (no loop: no mover runs)."""
    m, a, b, log = log_in_a(tmp_path, 40)
    m.alter_dir(TP, b)
    fut = m.futures[TP]
    for _ in range(steps):
        m._catch_up_step(log, fut)
    return m, a, b, log, fut


def test_a_crash_before_the_swap_resumes_the_move(tmp_path):
    m, a, b, log, fut = _half_copied(tmp_path, 1)
    assert 0 < fut.log_end_offset < log.log_end_offset
    expected = values(log)
    crash(m)

    async def main():
        m2 = LogManager([a, b], {})
        m2.startup(1, CLUSTER)
        assert m2._dir_of[TP] == a and m2.future_dir(TP) == b
        done = []
        m2.on_log_replaced = lambda tp, old, new: done.append(new)
        await wait_for(lambda: done)
        assert m2._dir_of[TP] == b and values(m2.get(TP)) == expected
        m2.shutdown()
    asyncio.run(main())


def test_a_crash_between_the_renames_keeps_the_complete_future(tmp_path):
    m, a, b, log, fut = _half_copied(tmp_path, 100)
    assert fut.log_end_offset == log.log_end_offset
    expected = values(log)
    # The swap's steps up to its first rename (LogManager._swap), then the process dies.
    fut.close()
    m._write_checkpoints(b)
    os.replace(log.dir, os.path.join(a, "t-0.0123456789abcdef0123456789abcdef" + DELETE_SUFFIX))
    crash(m)
    m2 = LogManager([a, b], {})
    m2.startup(1, CLUSTER)
    assert m2._dir_of[TP] == b and not m2.futures and values(m2.get(TP)) == expected
    assert not entries(a, DELETE_SUFFIX) and not entries(b, FUTURE_SUFFIX)
    assert m2.get(TP).recovery_point == log.log_end_offset     # from b's checkpoint written before the rename
    m2.shutdown()


def test_a_failed_rename_puts_the_current_log_back(tmp_path):
    async def main():
        m, a, b, log = log_in_a(tmp_path, 10)
        blocker = os.path.join(b, "t-0")
        os.makedirs(os.path.join(blocker, "x"))     # the future cannot be renamed onto a non-empty dir
        m.on_log_replaced = lambda tp, old, new: None
        m.alter_dir(TP, b)
        await wait_for(lambda: TP not in m._movers)
        assert m.get(TP) is log and os.path.isdir(log.dir) and not entries(a, DELETE_SUFFIX)
        assert not m.futures and not entries(b, FUTURE_SUFFIX)
        assert log.append_as_leader(batch(), 0, T0).base_offset == 30     # still served where it was
        m.shutdown()
    asyncio.run(main())


def test_the_future_follows_truncation_and_log_start(tmp_path):
    m, a, b, log, fut = _half_copied(tmp_path, 100)
    assert fut.log_end_offset == log.log_end_offset == 120
    log.truncate_to(60)                         # a new leader's log diverged from offset 60
    for _ in range(5):
        log.append_as_leader(batch(), 3, T0)
    log.delete_records(31)                      # inside a batch
    while m._catch_up_step(log, fut):
        pass
    assert fut.log_end_offset == log.log_end_offset == 75
    assert fut.log_start_offset == log.log_start_offset == 31
    assert values(fut) == values(log)
    assert fut.epoch_cache.entries == log.epoch_cache.entries
    assert m._can_swap(log, fut) is False       # no on_log_replaced: nobody would repoint the partition
    m.shutdown()


def test_describe_log_dirs_reports_the_future(tmp_path):
    m, a, b, log, fut = _half_copied(tmp_path, 1)
    broker = SimpleNamespace(logs=m, authorizer=None)
    resp = describe_log_dirs(broker, None, SimpleNamespace(api_version=4), {"topics": None})
    by_dir = {r["log_dir"]: r["topics"] for r in resp["results"]}
    [cur_row] = by_dir[a][0]["partitions"]
    [fut_row] = by_dir[b][0]["partitions"]
    assert cur_row["is_future_key"] is False and fut_row["is_future_key"] is True
    assert fut_row["offset_lag"] == log.log_end_offset - fut.log_end_offset > 0
    assert fut_row["partition_size"] == fut.size_bytes
    m.shutdown()


def test_alter_dir_to_the_current_dir_drops_the_future(tmp_path):
    m, a, b, log, fut = _half_copied(tmp_path, 1)
    m.alter_dir(TP, a)
    assert not m.futures and not entries(b, FUTURE_SUFFIX)
    with pytest.raises(KeyError):
        m.alter_dir(("t", 9), b)                # not here yet: remembered for its creation
    assert m.get_or_create("t", 9) and m._dir_of[("t", 9)] == b
    m.shutdown()
