"""perf/replication_bench.py's measurement plumbing: the classes of the leader's kernel stacks
(--perf-rounds) and the per-broker network namespaces (--netns)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading

import pytest

from kbroker.perf.replication_bench import NetnsNet, classify_script, classify_stack, in_netns

K = "[kernel.kallsyms]"


def script(*samples):
    """perf script -F ip,sym,dso text of ``samples`` (each a list of (symbol, dso), leaf first)."""
    return "".join("\n" + "".join(f"\tffffffff81000000 {sym} ({dso})\n" for sym, dso in s) + "\n" for s in samples)


# A follower's data segment received in the leader's softirq on loopback (sendfile -> tcp transmit ->
# loopback -> local_bh_enable -> net_rx_action -> tcp_v4_rcv -> the follower's wakeup).
FOLLOWER_WAKEUP = ["try_to_wake_up", "__wake_up_sync_key", "sock_def_readable", "tcp_data_queue",
                   "tcp_rcv_established", "tcp_v4_rcv", "ip_local_deliver", "process_backlog", "__napi_poll",
                   "net_rx_action", "handle_softirqs", "__local_bh_enable_ip", "__dev_queue_xmit",
                   "__tcp_transmit_skb", "tcp_write_xmit", "tcp_sendmsg_locked", "splice_to_socket",
                   "do_splice_direct", "do_sendfile", "__x64_sys_sendfile64", "do_syscall_64"]


def test_classes_of_kernel_stacks():
    k = lambda names: [(n, True) for n in names]     # noqa: E731
    assert classify_stack(k(FOLLOWER_WAKEUP)) == "rx softirq: reader wakeups"
    assert classify_stack(k(["tcp_clean_rtx_queue", "tcp_ack"] + FOLLOWER_WAKEUP[4:])) == "rx softirq: ack processing"
    assert classify_stack(k(["tcp_data_queue"] + FOLLOWER_WAKEUP[4:])) == "rx softirq: ip/tcp data receive"
    # The same transmit without the receive below it is the sender's own.
    assert classify_stack(k(FOLLOWER_WAKEUP[14:])) == "tcp transmit"
    assert classify_stack(k(["filemap_splice_read", "splice_direct_to_actor"] + FOLLOWER_WAKEUP[17:])) == \
        "sendfile/splice/page cache"
    assert classify_stack(k(["copy_folio_from_iter_atomic", "generic_perform_write", "ext4_buffered_write_iter",
                             "vfs_write", "ksys_write", "do_syscall_64"])) == "file write/read"
    assert classify_stack(k(["ep_poll", "do_epoll_wait", "do_syscall_64"])) == "epoll"
    assert classify_stack(k(["run_timer_softirq", "handle_softirqs", "irq_exit_rcu"])) == "other softirq"
    assert classify_stack([("_PyEval_EvalFrameDefault", False), ("[unknown]", False)]) == "user"


def test_script_parsing_counts_samples_and_strips_suffixes():
    text = script([(f"{n}+0x1f", K) for n in FOLLOWER_WAKEUP],
                  [("finish_task_switch.isra.0", K), ("do_nanosleep", K), ("hrtimer_nanosleep", K)],
                  [("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0"), ("[unknown]", "[unknown]")],
                  [("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0")])
    assert classify_script(text) == {"rx softirq: reader wakeups": 1, "scheduler": 1, "user": 2}


def _ns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def _schedstat_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2")
def test_netns_receive_runs_in_napi_threads_and_close_removes_everything():
    net = NetnsNet(2, 7)
    names, bridge = list(net.names), net.bridge
    try:
        assert all(_ns_exists(n) for n in names) and len(net.napi) == 4
        with in_netns(names[1]):
            srv = socket.create_server(("", 0))
        port = srv.getsockname()[1]
        got = []

        def rx():
            c, _ = srv.accept()
            with c:
                n = 0
                while d := c.recv(1 << 20):
                    n += len(d)
                got.append(n)
        th = threading.Thread(target=rx)
        th.start()
        before = {t: _schedstat_ns(t) for t in net.napi}
        with in_netns(names[0]):
            s = socket.create_connection((net.addr(1), port), timeout=10)
        with s:
            for _ in range(64):
                s.sendall(bytes(1 << 20))
        th.join(30)
        srv.close()
        assert got == [64 << 20]
        # The segments crossed the bridge and were received by the napi kernel threads (not the
        # sender's softirq): every veth end's thread ran.
        assert all(_schedstat_ns(t) > before[t] for t in net.napi)
    finally:
        net.close()
    assert not any(_ns_exists(n) for n in names)
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0


def _dead_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2")
def test_remove_stale_deletes_only_the_leftovers_of_dead_runs():
    dead, alive = f"rb{_dead_pid()}a", f"rb{os.getpid()}z"
    made = [("netns", f"{dead}-0"), ("link", f"{dead}br"), ("netns", f"{alive}-0"), ("link", f"{alive}br")]
    try:
        for kind, name in made:
            cmd = ["netns", "add", name] if kind == "netns" else ["link", "add", name, "type", "bridge"]
            subprocess.run(["ip", *cmd], check=True, capture_output=True)
        NetnsNet.remove_stale()
        assert not _ns_exists(f"{dead}-0")
        assert subprocess.run(["ip", "link", "show", f"{dead}br"], capture_output=True).returncode != 0
        assert _ns_exists(f"{alive}-0")          # this process is alive: its run is not stale
        assert subprocess.run(["ip", "link", "show", f"{alive}br"], capture_output=True).returncode == 0
    finally:
        for kind, name in made:
            subprocess.run(["ip", kind, "del", name], capture_output=True)


# ---- --sched: run-queue waits from perf sched timehist ----------------------------------------------------

TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
  79371.874569 [0001]  python[4100]                        0.014      0.250      1.148
  79371.874601 [0000]  rdk:broker1[4207/4200]              0.100      3.500      0.020
  79371.874700 [0001]  python[4101/4100]                   0.000      9.000      0.010
  79371.874800 [0000]  python[4300]                        2.000      0.040      0.300
  79371.874900 [0001]  java[5000]                          0.000     50.000      0.300
  79371.875000 [0000]  python[4200]                        0.010      0.125      0.050
"""


def test_timehist_parsing_keeps_each_roles_waits_and_main_threads_when_asked():
    from kbroker.perf.sched_delay import describe, parse_timehist, summary
    waits = parse_timehist(TIMEHIST, {"leader loop": (4100, True), "follower loop": (4300, True),
                                      "producer threads": (4200, False)})
    # the leader's executor thread (4101) is not its loop; every thread of the producer counts; ZooKeeper
    # (5000, not asked for) and the header lines are skipped
    assert waits == {"leader loop": [0.25], "follower loop": [0.04], "producer threads": [3.5, 0.125]}
    figures = summary(waits)
    assert figures["producer threads"] == {"runs": 2, "p50_ms": 3.5, "p99_ms": 3.5, "max_ms": 3.5}
    assert "producer threads: 2 runs" in describe(figures)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("perf") is None, reason="needs root and perf")
def test_sched_record_sees_a_process_that_wakes():
    from kbroker.perf.sched_delay import SchedRecord, sched_delays
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "sched.data"
        with SchedRecord(data):
            child = subprocess.Popen(["python3", "-c", "import time\nfor _ in range(50): time.sleep(0.002)"])
            try:
                child.wait(timeout=30)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        waits = sched_delays(data, {"child": (child.pid, True)})
    # 50 sleeps: at least that many wake-ups of its main thread (probe: perf must have seen the child)
    assert len(waits["child"]) >= 50, len(waits["child"])
