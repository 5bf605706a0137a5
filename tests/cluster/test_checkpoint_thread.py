"""The periodic offset checkpoints are written off the event loop.

Invariant: every fsync of a checkpoint file made by the periodic job runs on a thread other than the
broker's event-loop thread (the process's main thread), and the files still follow the log: the high
watermark checkpoint reaches the produced record count. Violations counted: checkpoint fsyncs seen on
the loop thread (0 expected). Eight fsyncs every few seconds on the loop held every connection for
their duration (tens of ms on a real disk). Observed with strace -f -y attached to a real broker.
"""
import re
import uuid

from kbroker.testing import LocalCluster, wait_until

from checkers import strace_attached, wait_for_topic

N = 500
_FSYNC = re.compile(r"^(\d+)\s+fsync\(\d+<([^>]*-checkpoint\.tmp)>\)", re.M)


def _hw_checkpointed(data_dir, topic) -> int:
    path = data_dir / "replication-offset-checkpoint"
    if not path.exists():
        return -1
    for line in path.read_text().splitlines()[2:]:
        t, p, off = line.split()
        if t == topic and p == "0":
            return int(off)
    return -1


def test_periodic_checkpoints_fsync_off_the_loop_thread(tmp_path):
    import confluent_kafka as ck

    with LocalCluster(tmp_path / "c", overrides={"log.flush.offset.checkpoint.interval.ms": 300}) as cluster:
        broker = cluster.brokers[0]
        topic = f"ckpt-{uuid.uuid4().hex[:8]}"
        wait_for_topic(cluster.bootstrap, topic, 1)
        trace_out = tmp_path / "strace.out"
        with strace_attached(broker.pid, "fsync", trace_out, "-y") as tracer:
            p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
            for i in range(N):
                p.produce(topic, partition=0, value=b"%d" % i)
            assert p.flush(30) == 0
            del p

            def seen():
                if tracer.poll() is not None:
                    raise RuntimeError(f"strace exited: {tracer.stderr.read()!r}")
                text = trace_out.read_text() if trace_out.exists() else ""
                return len(_FSYNC.findall(text)) >= 8 and _hw_checkpointed(broker.data_dir, topic) == N
            wait_until(seen, 30, "periodic checkpoints of the produced records under strace", interval=0.1)
        fsyncs = _FSYNC.findall(trace_out.read_text())
        on_loop = [path for tid, path in fsyncs if int(tid) == broker.pid]
        assert fsyncs, "no checkpoint fsync seen"
        assert not on_loop, f"{len(on_loop)} of {len(fsyncs)} checkpoint fsyncs ran on the loop thread: {on_loop[:4]}"
