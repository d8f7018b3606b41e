"""Where the recovery time of a killed executor goes, and how fast each restart path is
(issue 20): runs of resume_train.py on local-cluster[2,1,1024], each with one SIGKILL of an
executor JVM (rank 0's node or the other's) after 8 steps and max_restarts=1, in two modes:

- replacement: the next attempt waits for the standalone worker's replacement executor
  (all 2 nodes again);
- survivors: min_nodes=1, the next attempt starts at once on the surviving executor;
- either with "-fn": function mode (the same script run by runpy in the training
  process), whose workers fork from the executors' warm pools (torch imported already);
- any with "+grace": the driver waits, as before, up to 3 s for Spark's own failure
  (the barrier abort) after the log channel named the root cause, instead of submitting
  the next attempt at once (torchspark.driver._job.RESTART_GRACE_S, the side-by-side "before");
- jvm, jvm-survivors: the JVM runner instead (TorchSparkRunner.script, maxRestarts(1);
  minNodes(1) for jvm-survivors), the same script and kill: a Java application of its
  own (spark-submit of tests/java's TrainApp "restart" on its own local-cluster[2,1,1024],
  through tests/e2e/test_jvm_restart.py), one per run, while the PySpark session's
  executors stay up and idle. Its driver's attempts come from the application's ATTEMPT
  lines; Spark's view of its executors is not polled (another process).

The runs are interleaved (node, run, mode) so that the modes share the machine's load.

Per kill, from the driver's process (one clock): the kill; Spark's view (the executor
gone from the driver's executor list, a replacement registered; polled every 20 ms);
the driver's (the log channel naming the root cause, Spark's job ending, the next
attempt's barrier job submitted); the workers' (resume_train.py --phases: process start,
torch imported, gloo process group up, checkpoint loaded) and the first resumed step.
Stock PySpark TorchDistributor on the same kill fails (test_restart's stock test, run
at the end in the same session).

    .venv/bin/python -m bench.restart_recovery [RUNS_PER_CASE=3] \
        [MODES=replacement,survivors,replacement-fn,survivors-fn]
    e.g. .venv/bin/python -m bench.restart_recovery 3 survivors-fn,survivors-fn+grace
         .venv/bin/python -m bench.restart_recovery 3 jvm,replacement,jvm-survivors,survivors
"""
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import harness
from bench.restart_bench import restart_session, stock_on_the_same_kill

tsp_spark, tr, _, tjr = harness.helpers("tsp_spark", "test_restart", "jvmutil", "test_jvm_restart")


class ExecutorWatch:
    """Polls the driver's executor list and stages: [(time, "removed"|"added", executor)]
    and [(time, "running", stage id)] when a stage first has a running task."""

    def __init__(self, spark):
        self.sc = spark.sparkContext._jsc.sc()
        self.tracker = spark.sparkContext.statusTracker()
        self.events, self.stop = [], threading.Event()
        self.stages = set()
        self.known = self._ids()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _ids(self):
        infos = self.sc.statusTracker().getExecutorInfos()
        return {f"{i.host()}:{i.port()}" for i in infos if int(i.port()) > 0}

    def _run(self):
        while not self.stop.is_set():
            try:
                now = self._ids()
            except Exception:
                return
            t = time.time()
            self.events += [(t, "removed", x) for x in self.known - now]
            self.events += [(t, "added", x) for x in now - self.known]
            self.known = now
            try:
                for sid in self.tracker.getActiveStageIds():
                    info = self.tracker.getStageInfo(sid)
                    if sid not in self.stages and info and info.numActiveTasks > 0:
                        self.stages.add(sid)
                        self.events.append((time.time(), "running", sid))
            except Exception:
                pass
            time.sleep(0.02)

    def first(self, what, after):
        return next((t for t, w, _ in self.events if w == what and t >= after), None)


def _phases(path: Path, attempt: str):
    """{phase: (earliest over ranks, latest over ranks)} of one attempt."""
    out = {}
    if not path.exists():
        return out
    for ln in path.read_text().splitlines():
        a, _rank, k, t = ln.split()
        if a == attempt:
            lo, hi = out.get(k, (float("inf"), 0.0))
            out[k] = (min(lo, float(t)), max(hi, float(t)))
    return out


def _worker_phases(ph: dict, rel) -> dict:
    """The resumed attempt's worker phases (_phases) as times after the kill (rel): the
    first rank's start, the last rank's torch import, process group and checkpoint."""
    return {k: rel(ph[p][i]) if p in ph else None
            for k, p, i in (("workers_started", "start", 0), ("torch_imported", "torch", 1),
                            ("process_group_up", "pg", 1), ("checkpoint_loaded", "ckpt", 1))}


def one_run(tmp: Path, name: str, node: int, watch: ExecutorWatch, min_nodes, fn,
            grace: bool = False):
    from torchspark.driver import _job

    _job.RESTART_GRACE_S = _job.SPARK_GRACE_S if grace else 0.0
    steps = tr.STEPS_PER_ATTEMPT + 12
    extra = {} if min_nodes is None else {"min_nodes": min_nodes}
    box = {}
    files, killed, error = tr.run_with_kills(tmp, name, [node], steps, 1, box=box, fn=fn,
                                             **extra)
    assert error is None, f"the run failed: {error!r}"
    recovery = tr.check_resumed(tr._steplog(files["steplog"]), killed, 1, steps)[0]
    kill = killed[0][0]
    att = box["dist"].attempts
    ph = _phases(files["phases"], "1")
    first_step = next(ts for a, _, ts in tr._steplog(files["steplog"]) if a == "1")
    noticed = [t for t in (att[0].get("root_at"), att[0].get("ended_at")) if t]

    def rel(t):
        return None if t is None else round(t - kill, 2)

    row = {
        "node": node, "nodes_after": att[1]["nodes"], "recovery_s": round(recovery, 2),
        "spark_executor_removed": rel(watch.first("removed", kill)),
        "channel_root_cause": rel(att[0].get("root_at")),
        "driver_noticed": rel(min(noticed) if noticed else None),
        "spark_job_ended": rel(att[0].get("ended_at")),
        "replacement_registered": rel(watch.first("added", kill)),
        "next_job_submitted": rel(att[1]["started"]),
        "spark_task_running": rel(watch.first("running", kill)),
        **_worker_phases(ph, rel), "first_step": rel(first_step),
    }
    # Function mode with TORCHSPARK_TIMING=1: the resumed attempt's task-side marks
    # (rank 0's task, from torchspark/driver/_timing.py).
    marks = box["dist"]._clock.marks
    for k in ("tasks_started", "election_done", "agents_started", "worker_exec"):
        if k in marks:
            row[k] = rel(marks[k])
    assert tsp_spark.wait_gone(tr.MARK_VALUE, 15) == []
    return row


def one_run_jvm(tmp: Path, name: str, node: int, survivors: bool):
    """The same run through the JVM runner (TrainApp restart, maxRestarts(1))."""
    d = tmp / name
    d.mkdir()
    steps = tr.STEPS_PER_ATTEMPT + 12
    opts = ("phases", "elastic" if survivors else "attempts")
    out, err, killed = tjr._run_and_kill(d, 1, steps, tr.STEPS_PER_ATTEMPT, fail_run=False,
                                         opts=opts, node=node)
    assert out["RESTART"] == ["ok"], (out, err[-4000:])
    assert out["LEFT"] == ["0"], out
    log = tr._steplog(d / "steplog")
    recovery = tr.check_resumed(log, killed[:1], 1, steps)[0]
    kill = killed[0][0]
    att = [json.loads(a) for a in out["ATTEMPT"]]
    ph = _phases(d / "phases", "1")

    def rel(t):
        return None if t is None else round(t - kill, 2)

    def ms(k):  # the runner's times are ms since the epoch
        return None if att[0][k] is None else att[0][k] / 1000

    noticed = [t for t in (ms("root_at"), ms("ended_at")) if t]
    return {
        "node": node, "nodes_after": att[1]["nodes"], "recovery_s": round(recovery, 2),
        "channel_root_cause": rel(ms("root_at")),
        "driver_noticed": rel(min(noticed) if noticed else None),
        "spark_job_ended": rel(ms("ended_at")),
        "next_job_submitted": rel(att[1]["started"] / 1000),
        **_worker_phases(ph, rel), "first_step": rel(next(ts for a, _, ts in log if a == "1")),
    }


def main() -> None:
    known = {"replacement", "survivors", "replacement-fn", "survivors-fn"}
    known |= {m + "+grace" for m in known} | {"jvm", "jvm-survivors"}
    ap = harness.cli(__doc__, runs=None, quick={"runs": 1, "modes": "survivors-fn"})
    ap.add_argument("runs", nargs="?", type=int, default=3, help="runs per case (default 3)")
    ap.add_argument("modes", nargs="?", default="replacement,survivors,replacement-fn,survivors-fn",
                    help=f"comma-separated, some of {','.join(sorted(known))}")
    args = harness.parse(ap)
    runs, modes = args.runs, args.modes.split(",")
    bad = [m for m in modes if m not in known]
    if bad:
        sys.exit(f"unknown mode(s) {bad}: use some of {sorted(known)}, comma-separated")
    run = harness.Run("restart_recovery", args)
    if any(m.startswith("jvm") for m in modes) and not tjr.jvmutil.built():
        sys.exit("the jvm modes need the JVM part built (javac 17 and junit4: bash tests/setup.sh)")
    os.environ["TORCHSPARK_TIMING"] = "1"  # the task-side marks of function mode
    spark = restart_session()
    tmp = Path(tempfile.mkdtemp(prefix="restart-recovery-"))
    watch = ExecutorWatch(spark)
    rows, failed = {}, {}
    try:
        for node in (1, 0):
            for i in range(runs):
                for mode in modes:
                    # Both executors up again before each run (a replacement may be late).
                    tr_slots = 0
                    deadline = time.monotonic() + 180
                    while time.monotonic() < deadline:
                        from torchspark.driver import _restart

                        tr_slots = _restart.free_slots(spark)
                        if tr_slots >= 2:
                            break
                        time.sleep(0.2)
                    base, grace = mode.split("+")[0], "+grace" in mode
                    try:
                        if base.startswith("jvm"):
                            row = one_run_jvm(tmp, f"{mode}-{node}-{i}", node,
                                              base == "jvm-survivors")
                        else:
                            row = one_run(tmp, f"{mode}-{node}-{i}", node, watch,
                                          1 if base.startswith("survivors") else None,
                                          base.endswith("-fn"), grace)
                    except Exception as e:  # a failed run is a result too: counted, shown
                        print(json.dumps({"mode": mode, "node": node, "failed": repr(e)[:2000]}),
                              flush=True)
                        failed[(mode, node)] = failed.get((mode, node), 0) + 1
                        continue
                    print(json.dumps({"mode": mode, **row}), flush=True)
                    rows.setdefault((mode, node), []).append(row)
        stock = stock_on_the_same_kill(spark, tmp)
    finally:
        watch.stop.set()
        spark.stop()
    summaries = []
    for (mode, node), rs in rows.items():
        med = {k: harness.median(r[k] for r in rs if r.get(k) is not None)
               for k in rs[0] if k not in ("node",)
               and any(r.get(k) is not None for r in rs)}
        run.figure(f"{mode}, node {node}'s executor killed: kill -> first resumed step",
                   [r["recovery_s"] for r in rs], "s", 2)
        summaries.append({"mode": mode, "node": node, "runs": len(rs),
                          "failed": failed.get((mode, node), 0),
                          "recovery_s": [r["recovery_s"] for r in rs],
                          "median": {k: round(v, 2) for k, v in med.items()}})
        print(json.dumps(summaries[-1]))
    print(json.dumps(stock))
    # Recovery side by side: per mode, node 1's kill and node 0's (median [runs]).
    print("| mode | node 1's executor | node 0's executor (rank 0's) |\n|---|---|---|")
    for mode in modes:
        cells = []
        for node in (1, 0):
            r = [x["recovery_s"] for x in rows.get((mode, node), [])]
            n = failed.get((mode, node), 0)
            cells.append((f"{harness.median(r):.2f} {r}" if r else "-")
                         + (f", {n} failed" if n else ""))
        print(f"| {mode} | " + " | ".join(cells) + " |")
    run.results = {"summaries": summaries, "failed": {f"{m} {n}": k for (m, n), k in failed.items()},
                   "rows": {f"{m} {n}": rs for (m, n), rs in rows.items()}, **stock}
    run.finish()


if __name__ == "__main__":
    main()
