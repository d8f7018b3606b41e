"""Restarts on the driver (issue 20): a run survives losing an executor JVM (SIGKILL)
mid-training, resumes from its last torchspark.checkpoint, and ends with weights
bit-identical to an uninterrupted run's (CPU, gloo, fixed seeds and data order).

local-cluster[2,1,1024]: two workers with one core each, so each task owns an executor and
a killed executor is replaced by its worker at once (Spark's standalone master), as on a
real standalone cluster. Stock TorchDistributor on the same kill: the job fails (the
barrier ResultStage is never retried, SPARK-25161)."""
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from pyspark.ml.torch.distributor import TorchDistributor as StockDistributor

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError, checkpoint

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "agent_scripts" / "resume_train.py")
MARK_VALUE = tsp_spark.SHARED_MARK
EVERY = 5  # steps between checkpoints
STEPS_PER_ATTEMPT = 8  # steps an attempt runs (after its resume) before the next kill


@pytest.fixture(scope="module")
def spark(spark_cluster):
    # A replacement executor JVM starts in seconds on a quiet machine, but can take
    # a minute on a loaded 2-core CI runner.
    with tsp_spark.runtime_conf(spark_cluster, {"spark.torchspark.job.replacementTimeout": "180s"}):
        yield spark_cluster
    tsp_spark.discard_shared()  # its executors were killed and replaced: the next module's is new


def _cmdline(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def executor_of(pid: int) -> int:
    """The executor JVM that pid descends from (0: none). Only this test's executors are
    ever killed: other sessions may run Spark on the same machine."""
    p = pid
    while p > 1:
        if any(b"CoarseGrainedExecutorBackend" in a for a in _cmdline(p)):
            return p
        try:
            p = _ppid(p)
        except OSError:
            return 0
    return 0


def executor_of_node(node_rank: int, mark: str = MARK_VALUE) -> int:
    """The pid of the executor JVM whose task runs node node_rank's agent (0: none), among
    the processes of the job marked mark (tsp_spark.MARK)."""
    for pid in tsp_spark.job_processes(mark):
        cmd = _cmdline(pid)
        if cmd and b"torchspark-run" in cmd[0] and f"--node-rank={node_rank}".encode() in cmd:
            return executor_of(pid)
    return 0


def _steplog(path: Path) -> list:
    """[(attempt, step, time)] rank 0 wrote, in order."""
    if not path.exists():
        return []
    out = []
    for ln in path.read_text().splitlines():
        parts = ln.split()
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), float(parts[2])))
    return out


# Function mode (warm worker pools: torch already imported): the script run by runpy in
# the training process. Defined in a "__main__" namespace so that cloudpickle ships it by
# value (this test module is not importable on the executors).
_NS = {"__name__": "__main__"}
exec("def run_script(argv):\n"
     "    import runpy, sys\n"
     "    sys.argv = list(argv)\n"
     "    runpy.run_path(argv[0], run_name='__main__')\n", _NS)
run_script = _NS["run_script"]


def _train(tmp: Path, name: str, steps: int, distributor, fn: bool = False) -> dict:
    files = {k: tmp / f"{name}.{k}" for k in ("ckpt", "steplog", "out", "phases")}
    argv = [SCRIPT, "--ckpt", str(files["ckpt"]), "--steps", str(steps), "--every",
            str(EVERY), "--sleep", "0.1", "--steplog", str(files["steplog"]), "--out",
            str(files["out"]), "--phases", str(files["phases"])]
    if fn:
        distributor.run(run_script, argv)
    else:
        distributor.run(*argv)
    return files


def run_with_kills(tmp: Path, name: str, kills: list, steps: int, max_restarts: int,
                   after: list = (), box: dict = None, fn: bool = False, **extra):
    """Runs resume_train.py with restarts and SIGKILLs the executor of node kills[i] once
    attempt i has run after[i] steps (default STEPS_PER_ATTEMPT); returns (files, [(kill
    time, newest checkpoint step then)], error). box gets the distributor ("dist");
    fn: function mode (_train); extra goes to its constructor."""
    box = {} if box is None else box
    files = {k: tmp / f"{name}.{k}" for k in ("ckpt", "steplog", "out", "phases")}

    def train():
        try:
            box["dist"] = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                           max_restarts=max_restarts, **extra)
            _train(tmp, name, steps, box["dist"], fn)
        except BaseException as e:  # noqa: B902 - checked by the caller
            box["error"] = e

    t = threading.Thread(target=train, daemon=True)
    t.start()
    killed = []
    for i, node in enumerate(kills):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and t.is_alive():
            done = [s for a, s, _ in _steplog(files["steplog"]) if a == str(i)]
            if len(done) >= (after[i] if i < len(after) else STEPS_PER_ATTEMPT):
                break
            time.sleep(0.02)
        pid = executor_of_node(node)
        assert pid, f"kill {i}: no executor runs node {node} (run ended: {box})"
        os.kill(pid, signal.SIGKILL)
        killed.append((time.time(), checkpoint.latest_step(str(files["ckpt"]))))
    t.join(600)
    assert not t.is_alive(), "the run did not end in 600 s"
    return files, killed, box.get("error")


def check_resumed(log: list, killed: list, nkills: int, steps: int) -> list:
    """Checks rank 0's step log of a run killed nkills times: one attempt after each kill,
    each resumed right after a checkpoint its predecessor reached (no step skipped, at most
    the steps since that checkpoint done twice), each step once from there, up to the last.
    Returns the recovery times: kill -> the next attempt's first step, in seconds."""
    attempts = [str(i) for i in range(nkills + 1)]
    assert [a for a in dict.fromkeys(a for a, _, _ in log)] == attempts, log
    recovery = []
    for i in range(1, len(attempts)):
        prev = [s for a, s, _ in log if a == attempts[i - 1]]
        mine = [(s, ts) for a, s, ts in log if a == attempts[i]]
        start = mine[0][0]
        assert (start - 1) % EVERY == 0 and start - 1 <= prev[-1], (i, start, prev[-3:])
        assert prev[-1] - (start - 1) <= EVERY + 1, (i, start, prev[-3:])
        assert [s for s, _ in mine] == list(range(start, start + len(mine))), mine
        recovery.append(mine[0][1] - killed[i - 1][0])
    assert log[-1][1] == steps - 1
    return recovery


def test_killed_executors_resume_from_the_last_checkpoint_bit_identical(spark, tmp_path):
    # A kill of a non-rank-0 executor, then one of rank 0's, each waiting for the replacement
    # executor (TSP_RESTART_KILLS: another list, e.g. 1,0,1,0,1,0). Three faults of each kind
    # run on the namespace cluster (tests/cluster/test_faults.py); the 20-kill series is
    # bench/restart_bench.py.
    kills = [int(k) for k in os.environ.get("TSP_RESTART_KILLS", "1,0").split(",")]
    steps = STEPS_PER_ATTEMPT * (len(kills) + 1)
    ref = _train(tmp_path, "ref", steps,
                 TorchDistributor(num_processes=2, local_mode=False, use_gpu=False))
    ref_hash = ref["out"].read_text()
    assert [s for _, s, _ in _steplog(ref["steplog"])] == list(range(steps))

    files, killed, error = run_with_kills(tmp_path, "killed", kills, steps, len(kills))
    assert error is None, f"the run failed: {error!r}"
    recovery = check_resumed(_steplog(files["steplog"]), killed, len(kills), steps)
    assert files["out"].read_text() == ref_hash, "the resumed run's weights differ"
    left = tsp_spark.wait_gone(MARK_VALUE, 15)
    assert left == [], left
    print("recovery (kill -> first resumed step), s, kills of nodes "
          f"{kills}: {[round(r, 2) for r in recovery]}")


def test_restarts_used_up_list_each_attempts_root_cause(spark, tmp_path):
    bad = tmp_path / "fail.py"
    bad.write_text("import os, sys\n"
                   "if os.environ['RANK'] == '1':\n"
                   "    raise SystemExit(f\"boom in attempt {os.environ['TORCHSPARK_ATTEMPT']} "
                   "after {os.environ.get('TORCHSPARK_RESTART_CAUSE', 'nothing')[:20]}\")\n")
    with pytest.raises(TorchDistributorError) as ei:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         max_restarts=2).run(str(bad))
    text = str(ei.value)
    assert "failed after 3 attempt(s) (max_restarts=2)" in text, text
    for i in range(3):
        assert f"  attempt {i}: " in text, text
    assert len(ei.value.report["attempts"]) == 3
    assert tsp_spark.wait_gone(MARK_VALUE, 15) == []


# A comparison, not a test of torchspark: CI's budget skips it (bench/restart_bench.py runs
# it beside its series, as tests/cluster's stock runs under TSP_CLUSTER_FULL=1).
@pytest.mark.skipif(os.environ.get("TSP_STOCK_COMPARISONS") != "1",
                    reason="stock comparison run (~35 s); set TSP_STOCK_COMPARISONS=1 to run it")
def test_stock_fails_on_the_same_kill(spark, tmp_path):
    box = {}
    steplog = tmp_path / "stock.steplog"

    def train():
        try:
            StockDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                SCRIPT, "--ckpt", str(tmp_path / "stock.ckpt"), "--steps", "400", "--every",
                str(EVERY), "--sleep", "0.1", "--steplog", str(steplog), "--out",
                str(tmp_path / "stock.out"))
            box["ok"] = True
        except BaseException as e:  # noqa: B902
            box["error"] = e

    t = threading.Thread(target=train, daemon=True)
    t.start()
    deadline = time.monotonic() + 300
    while len(_steplog(steplog)) < STEPS_PER_ATTEMPT and time.monotonic() < deadline:
        time.sleep(0.05)
    # A training process of this job (stock's workers carry the mark too): its executor.
    pid = next((e for e in map(executor_of, tsp_spark.job_processes(MARK_VALUE)) if e), 0)
    assert pid, "no executor of this job found"
    os.kill(pid, signal.SIGKILL)
    t.join(600)
    for p in tsp_spark.job_processes(MARK_VALUE):  # stock leaves its other node's processes
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    assert "error" in box, box
    assert "barrier" in str(box["error"]).lower() or "lost" in str(box["error"]).lower(), box


def _tree(root: int) -> list:
    """root and every process descending from it (by /proc's parent links)."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                children.setdefault(_ppid(int(p)), []).append(int(p))
            except (OSError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def executor_id(jvm: int) -> str:
    """The executor id of an executor JVM (its --executor-id)."""
    cmd = _cmdline(jvm)
    return cmd[cmd.index(b"--executor-id") + 1].decode()


def kill_all(pids: list) -> None:
    """SIGKILLs each of pids (a frozen one too); those gone already are skipped."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def start_until_steps(train, steplog: Path, box: dict) -> tuple:
    """Starts train in a thread and waits (300 s at most) until rank 0 logged
    STEPS_PER_ATTEMPT steps; returns the thread and the pid of node 1's executor JVM."""
    t = threading.Thread(target=train, daemon=True)
    t.start()
    deadline = time.monotonic() + 300
    while len(_steplog(steplog)) < STEPS_PER_ATTEMPT and time.monotonic() < deadline:
        time.sleep(0.02)
    jvm = executor_of_node(1)
    assert jvm, f"no executor runs node 1 ({box})"
    return t, jvm


def test_silent_executor_is_noticed_within_the_bound(spark, tmp_path):
    """A frozen host: node 1's executor JVM, its Python workers, agent and training
    processes all SIGSTOPped (the kernel still answers TCP keepalives). The driver notices
    it through the log channel's PINGs (docs/protocol.md 1.7: 5 s + the 1 s lost grace),
    cancels the attempt itself (Spark would wait for its 120 s heartbeat timeout), and
    goes on on the other executor (min_nodes=1). The silent executor is excluded by its
    id (SparkContext.killAndReplaceExecutor), not only left out of the slot count: Spark
    stops scheduling on it at once, long before its heartbeat timeout."""
    steps = STEPS_PER_ATTEMPT + 10
    box, files = {}, {k: tmp_path / f"silent.{k}" for k in ("steplog",)}

    def train():
        try:
            box["dist"] = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                           max_restarts=1, min_nodes=1)
            _train(tmp_path, "silent", steps, box["dist"])
        except BaseException as e:  # noqa: B902 - checked below
            box["error"] = e

    t, jvm = start_until_steps(train, files["steplog"], box)
    eid = executor_id(jvm)
    backend = spark.sparkContext._jsc.sc().schedulerBackend()
    assert backend.isExecutorActive(eid)
    frozen = _tree(jvm)
    for p in frozen:
        os.kill(p, signal.SIGSTOP)
    stopped = time.time()
    try:
        t.join(300)
        # Still frozen (Spark's heartbeat timeout is 120 s): inactive only by our exclusion.
        active_after = backend.isExecutorActive(eid)
    finally:
        kill_all(frozen)  # the standalone worker replaces the executor it lost
    assert not t.is_alive(), "the run did not end in 300 s"
    assert "error" not in box, f"the run failed: {box['error']!r}"
    att = box["dist"].attempts
    assert [a["nodes"] for a in att] == [2, 1], att
    noticed = att[0]["root_at"] - stopped
    assert att[0].get("silent_node") == 1, att
    assert "went silent" in att[0]["cause"] and "node 1" in att[0]["cause"], att
    assert att[0].get("excluded_executor") == eid and not active_after, att
    # The documented bound: 5 s of silence + 1 s lost grace (+ a sweep), with slack for a
    # loaded 2-core machine.
    assert noticed <= 10.0, f"noticed after {noticed:.2f} s"
    log = _steplog(files["steplog"])
    assert log[-1][1] == steps - 1 and [a for a, _, _ in log][-1] == "1", log[-3:]
    assert tsp_spark.wait_gone(MARK_VALUE, 15) == []
    print(f"silent node noticed {noticed:.2f} s after the SIGSTOP; next attempt submitted "
          f"{att[1]['started'] - stopped:.2f} s after; first step of attempt 1 "
          f"{next(ts for a, _, ts in log if a == '1') - stopped:.2f} s after")


def test_restarted_job_asks_for_offers_until_its_tasks_run(spark):
    """A restarted attempt's barrier job waits for cores that the failed attempt's tasks
    give back one executor at a time; the driver asks Spark for an offer of every executor
    (reviveOffers) until its tasks run, then stops asking (torchspark.driver._job)."""
    from torchspark.driver import _job

    sc = spark.sparkContext
    tag = f"torchspark-{uuid.uuid4().hex}"
    held = threading.Event()

    def hold(_it):  # defined here: pickled by value (the executors cannot import tests)
        import time
        time.sleep(2)
        yield 0

    def blocker():  # one executor's core busy, as a failed attempt's task being killed
        held.set()
        sc.parallelize([0], 1).mapPartitions(hold).collect()

    b = threading.Thread(target=blocker)
    b.start()
    held.wait(10)
    time.sleep(0.5)  # the blocker's task is running
    done, box = threading.Event(), {}

    def revive():
        box["asked"] = _job.revive_until_running(spark, tag, done, 0.1, 60)
        box["done_then"] = done.is_set()

    r = threading.Thread(target=revive)
    r.start()
    sc.addJobTag(tag)
    try:
        assert sc.parallelize(range(2), 2).barrier().mapPartitions(
            lambda it: [1]).collect() == [1, 1]
    finally:
        sc.removeJobTag(tag)
        done.set()
    r.join(10)
    b.join(30)
    # It asked while the barrier stage waited for the blocker's core, and stopped on
    # seeing the stage's tasks running, before the job ended.
    assert box.get("asked", 0) >= 1 and box.get("done_then") is False, box


def grow_back(spark, tmp: Path, name: str, nodes: int = 2, after_grow: int = 6) -> dict:
    """Elastic that grows back (issue 31): `nodes` nodes, min_nodes=nodes-1; node 1's
    executor is SIGKILLed, the run goes on with one node less at once, the standalone
    worker starts a replacement executor, and the driver asks the smaller attempt to
    checkpoint and stop (the run controller's checkpoint_and_stop, CHECKPOINT to its
    agents) and goes on with every node from that step; attempt 2 then ends after
    after_grow steps. Returns the distributor's attempts, rank 0's step log, the kill's
    time and when Spark had the slots again (the replacement registered)."""
    box, files = {}, {k: tmp / f"{name}.{k}" for k in ("ckpt", "steplog", "out")}

    def train():
        try:
            box["dist"] = TorchDistributor(num_processes=nodes, local_mode=False,
                                           use_gpu=False, max_restarts=1, min_nodes=nodes - 1)
            box["dist"].run(SCRIPT, "--ckpt", str(files["ckpt"]), "--steps", "100000",
                            "--every", str(EVERY), "--sleep", "0.1", "--steplog",
                            str(files["steplog"]), "--out", str(files["out"]), "--on-request",
                            "--end-attempt", "2", "--end-after", str(after_grow))
        except BaseException as e:  # noqa: B902 - checked by the caller
            box["error"] = e

    t, pid = start_until_steps(train, files["steplog"], box)
    deadline = time.monotonic() + 300
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    from torchspark.driver import _restart

    back = None
    while t.is_alive() and time.monotonic() < deadline + 300:
        if back is None and time.time() > killed + 1 and _restart.free_slots(spark) >= nodes:
            back = time.time()
        time.sleep(0.1)
    t.join(1)
    assert not t.is_alive(), "the run did not end"
    assert "error" not in box, f"the run failed: {box['error']!r}"
    return {"attempts": box["dist"].attempts, "log": _steplog(files["steplog"]),
            "killed": killed, "back": back, "box": box}


def test_survivors_go_on_at_once_with_min_nodes_then_grow_back(spark, tmp_path):
    """Elastic: with min_nodes=1 the next attempt starts at once on the surviving executor
    (1 node, world size 1) instead of waiting for the replacement executor; once Spark has
    registered the replacement, the run grows back to 2 nodes from the step it
    checkpointed on request (0 steps lost, not a restart: max_restarts=1 is used by the
    kill). Fails on a controller without grow: the run stays at 1 node to its end."""
    got = grow_back(spark, tmp_path, "grow")
    att, log, box = got["attempts"], got["log"], got["box"]
    assert [a["nodes"] for a in att] == [2, 1, 2], att
    assert att[0]["cause"] and att[2]["cause"] is None, att
    # No wait for a replacement: the next job follows the failure at once (a replacement
    # executor JVM takes 10 s or more to register on this machine).
    assert att[1]["started"] - att[0]["ended"] < 2.0, att
    last1 = [s for a, s, _ in log if a == "1"][-1]
    check_resumed([r for r in log if r[0] in ("0", "1")], [(got["killed"], None)], 1, last1 + 1)
    assert box["dist"].num_tasks == 2 and box["dist"].num_processes == 2  # restored
    # Grown back with 0 steps lost: attempt 2 starts right after attempt 1's last step,
    # the step it checkpointed on request.
    assert f"grows back to more nodes: step {last1} was checkpointed" in att[1]["cause"], att
    mine = [s for a, s, _ in log if a == "2"]
    assert mine == list(range(last1 + 1, last1 + 1 + len(mine))) and mine, (last1, mine)
    assert tsp_spark.wait_gone(MARK_VALUE, 15) == []
    k, back = got["killed"], got["back"]
    assert back is not None, "Spark never had 2 slots again"
    first2 = next(ts for a, _, ts in log if a == "2")
    print(f"grew back: slots back {back - k:.1f} s after the kill, attempt 1 stopped "
          f"{att[1]['ended'] - back:.1f} s after that, attempt 2's first step "
          f"{first2 - back:.1f} s after it (its start: {first2 - att[2]['started']:.1f} s)")
    # The driver's part, from the slots to the attempt stopped at its checkpoint: the
    # watch's 3 s period, one step, the save and the agent's stop (the next attempt's
    # start is a restart's: bench/grow_bench.py measures the whole cycle).
    assert att[1]["ended"] - back <= 15.0, (att, back)
