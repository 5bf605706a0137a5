"""What the jobs share: a SparkSession that works under spark-submit and plain python, a progress
bar fed by Spark's status tracker, and phase timing with a timeline of the phase's Spark jobs."""
from __future__ import annotations

import os
import sys
import threading
import time


def session(app: str, master: str | None = None, conf: dict | None = None):
    """Under spark-submit, its master and settings win; run with plain python, ``master``
    (default local[*]) is used. Executors run this interpreter unless PYSPARK_PYTHON says else."""
    from . import ensure_python_env, register
    ensure_python_env()
    from pyspark.sql import SparkSession
    # our own bar replaces Spark's console progress
    b = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not under_submit:
        b = b.master(master or "local[*]")
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    register(spark)
    return spark


def _process_tree(root: int) -> dict | None:
    """{pid: /proc/<pid>/stat fields after the command name} of ``root`` and its live
    descendants; None where /proc is missing or ``root`` is gone."""
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    stats, children = {}, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue        # exited meanwhile
        stats[pid] = fields
        children.setdefault(int(fields[1]), []).append(pid)
    if root not in stats:
        return None
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid]
            todo.extend(children.get(pid, ()))
    return out


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """CPU seconds (user + system) of process ``root`` (default: this one) and every live
    descendant, plus what their reaped children used; None where /proc is missing. Run with a
    local master this covers the whole of Spark (driver JVM, executors, Python workers) and any
    broker this process started: a cost that, unlike wall time, does not grow when other work
    takes the cores."""
    tree = _process_tree(os.getpid() if root is None else root)
    if tree is None:
        return None
    ticks = sum(int(x) for fields in tree.values() for x in fields[11:15])   # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_run_queue_seconds(root: int | None = None) -> dict | None:
    """{(pid, tid): seconds spent runnable but waiting for a CPU} for every live thread of process
    ``root`` and its descendants (``/proc/<pid>/task/<tid>/schedstat``, second field); None where
    schedstat is missing. The difference of two snapshots is how long the tree's threads waited
    for a core: the part of a phase's wall time that other work on the machine takes, not ours."""
    root = os.getpid() if root is None else root
    if not os.path.exists(f"/proc/{root}/task/{root}/schedstat"):
        return None
    tree = _process_tree(root)
    if tree is None:
        return None
    out = {}
    for pid in tree:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[(pid, int(tid))] = int(f.read().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                continue
    return out


def run_queue_delta(before: dict | None, after: dict | None) -> float | None:
    """Seconds of run-queue wait between two tree_run_queue_seconds snapshots (threads that ended
    in between are not counted; threads that started count whole)."""
    if before is None or after is None:
        return None
    return sum(v - before.get(k, 0.0) for k, v in after.items())


def _opt_ms(opt):
    """Scala Option[java.util.Date] -> epoch ms or None."""
    return opt.get().getTime() if opt.isDefined() else None


def last_job_id(sc) -> int:
    """The highest job id the status store holds, -1 when none (jobs are numbered in order)."""
    jobs = sc._jsc.sc().statusStore().jobsList(None)
    n = jobs.size()
    return max(jobs.apply(0).jobId(), jobs.apply(n - 1).jobId()) if n else -1


def phase_timeline(sc, after_job: int, t0_ms: float, t1_ms: float, settle: float = 5.0) -> dict:
    """Where a phase's wall time went, from Spark's status store (the data behind its UI and event
    log; kept with the UI disabled too): the jobs numbered above ``after_job``, each with its
    stages, and for each stage when it was submitted, when its first task started, when it ended,
    and the sums over its tasks of run time, executor CPU, deserialization and scheduler delay
    (launch to start of run, plus result fetch), with the tasks' locality levels. Times in seconds
    from the phase start ``t0_ms`` (epoch ms). ``plan_s`` is phase start to the first job
    (planning, including Python data source planning), ``between_jobs_s`` the driver's time
    between jobs, ``after_jobs_s`` last job end to phase end (writer commit, result handling).
    The store is filled by an asynchronous listener: waits up to ``settle`` s for the phase's
    jobs and stages to show as ended (``complete`` false if they did not)."""
    store = sc._jsc.sc().statusStore()
    deadline = time.monotonic() + settle

    def rel(ms):
        return None if ms is None else round((ms - t0_ms) / 1000, 3)

    while True:
        jobs = store.jobsList(None)
        found = [jobs.apply(i) for i in range(jobs.size())]
        found = sorted((j for j in found if j.jobId() > after_job), key=lambda j: j.jobId())
        complete = all(j.completionTime().isDefined() for j in found)
        stages = {}
        if complete:
            for j in found:
                ids = j.stageIds()
                for k in range(ids.size()):
                    st = store.lastStageAttempt(ids.apply(k))
                    stages[st.stageId()] = st
                    if st.status().toString() in ("ACTIVE", "PENDING"):
                        complete = False
        if complete or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out_jobs, ends = [], []
    for j in found:
        jstages = []
        ids = j.stageIds()
        for k in range(ids.size()):
            st = stages.get(ids.apply(k))
            if st is None or st.status().toString() == "SKIPPED":
                continue
            tasks = store.taskList(st.stageId(), st.attemptId(), st.numTasks() + 64)
            locality: dict = {}
            delay = longest = 0.0
            for i in range(tasks.size()):
                t = tasks.apply(i)
                loc = t.taskLocality()
                locality[loc] = locality.get(loc, 0) + 1
                delay += t.schedulerDelay() / 1000
                if t.duration().isDefined():
                    longest = max(longest, t.duration().get() / 1000)
            jstages.append({
                "stage": st.stageId(), "tasks": st.numTasks(), "submit_s": rel(_opt_ms(st.submissionTime())),
                "first_task_s": rel(_opt_ms(st.firstTaskLaunchedTime())), "end_s": rel(_opt_ms(st.completionTime())),
                "task_run_s": round(st.executorRunTime() / 1000, 3),
                "task_cpu_s": round(st.executorCpuTime() / 1e9, 3),
                "task_deserialize_s": round(st.executorDeserializeTime() / 1000, 3),
                "scheduler_delay_s": round(delay, 3), "longest_task_s": round(longest, 3), "locality": locality})
        end = _opt_ms(j.completionTime())
        ends.append((_opt_ms(j.submissionTime()), end))
        out_jobs.append({"job": j.jobId(), "submit_s": rel(ends[-1][0]), "end_s": rel(end), "stages": jstages})
    tl = {"complete": complete, "jobs": out_jobs}
    if ends and all(a is not None and b is not None for a, b in ends):
        tl["plan_s"] = rel(ends[0][0])
        tl["between_jobs_s"] = round(sum(max(0, ends[i + 1][0] - ends[i][1]) for i in range(len(ends) - 1)) / 1000, 3)
        tl["after_jobs_s"] = round((t1_ms - max(b for _, b in ends)) / 1000, 3)
    return tl


def timeline_summary(tl: dict | None) -> dict:
    """A phase timeline's wall time by part: before the first job (``plan_s``), inside stages
    (``stages_s``, submit to end, summed), of which waiting for the first task (``to_first_task_s``),
    and the driver's time between and after jobs; {} without a complete timeline."""
    if not tl or not tl.get("complete") or "plan_s" not in tl:
        return {}
    stages = [s for j in tl["jobs"] for s in j["stages"] if s["submit_s"] is not None and s["end_s"] is not None]
    return {"plan_s": tl["plan_s"], "stages_s": round(sum(s["end_s"] - s["submit_s"] for s in stages), 3),
            "to_first_task_s": round(sum((s["first_task_s"] or s["submit_s"]) - s["submit_s"] for s in stages), 3),
            "between_jobs_s": tl["between_jobs_s"], "after_jobs_s": tl["after_jobs_s"]}


def format_timeline(phase: str, tl: dict) -> str:
    """One line per phase: planning, each stage (tasks, time to the first task, span, task time
    sums), the driver's time between and after the jobs."""
    parts = [f"{phase:<9} plan {tl.get('plan_s', '?')} s"]
    for j in tl["jobs"]:
        for s in j["stages"]:
            span = None if s["end_s"] is None or s["submit_s"] is None else round(s["end_s"] - s["submit_s"], 3)
            first = None if s["first_task_s"] is None or s["submit_s"] is None else \
                round(s["first_task_s"] - s["submit_s"], 3)
            parts.append(f"stage {s['stage']} x{s['tasks']}: first task +{first} s, {span} s "
                         f"(tasks run {s['task_run_s']} cpu {s['task_cpu_s']} deser {s['task_deserialize_s']} "
                         f"sched {s['scheduler_delay_s']} s)")
    parts.append(f"between jobs {tl.get('between_jobs_s', '?')} s, after {tl.get('after_jobs_s', '?')} s")
    return " | ".join(parts)


class Progress:
    """Prints ``phase [#####.....] done/total tasks, MB/s`` to stderr while a phase runs, from
    the status tracker of the stages started since ``start``. Quiet when stderr is not a tty
    unless ``force``."""

    def __init__(self, spark, phase: str, nbytes: int | None = None, interval: float = 0.5,
                 stream=None, force: bool = False, timeline: bool = True):
        self.sc = spark.sparkContext
        self.phase = phase
        self.nbytes = nbytes
        self.interval = interval
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self._stop = threading.Event()
        self._thread = None
        self.t0 = 0.0
        self.seconds = 0.0
        self.cpu0 = None
        self.cpu_seconds = None     # tree_cpu_seconds() over the phase, when /proc tells
        self.run_queue_seconds = None   # run-queue wait of the tree's threads over the phase
        self.want_timeline = timeline
        self.timeline = None        # phase_timeline() of the phase's jobs
        self.job0 = -1
        self.rq0 = None

    def __enter__(self):
        if self.want_timeline:
            self.job0 = last_job_id(self.sc)
        self.rq0 = tree_run_queue_seconds()
        self.cpu0 = tree_cpu_seconds()
        self.wall0 = time.time()
        self.t0 = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _line(self) -> str:
        tracker = self.sc.statusTracker()
        done = total = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        width = 30
        filled = int(width * done / total) if total else 0
        elapsed = time.monotonic() - self.t0
        rate = ""
        if self.nbytes and total:
            rate = f", ~{self.nbytes * done / total / 1e6 / max(elapsed, 1e-9):.1f} MB/s"
        return f"\r{self.phase:<10} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks, {elapsed:.0f}s{rate}"

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.stream.write(self._line())
                self.stream.flush()
            except Exception:       # the tracker can race with SparkContext shutdown
                return

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.t0
        cpu1 = tree_cpu_seconds()
        if self.cpu0 is not None and cpu1 is not None:
            self.cpu_seconds = cpu1 - self.cpu0
        self.run_queue_seconds = run_queue_delta(self.rq0, tree_run_queue_seconds())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write(f"\r{self.phase:<10} done in {self.seconds:.1f}s" + " " * 40 + "\n")
            self.stream.flush()
        if self.want_timeline and exc[0] is None:
            t0_ms = self.wall0 * 1000
            self.timeline = phase_timeline(self.sc, self.job0, t0_ms, t0_ms + self.seconds * 1000)
        return False
