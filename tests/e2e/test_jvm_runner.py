"""The JVM half end to end, on real Spark (spark-submit of the pyspark package,
local-cluster[2,1,1024]) and real torch: a Java application trains the DDP example across
2 executors through TorchSparkRunner, rank 0's election record going through the driver's
rendezvous (allGather when it is off or unreachable); TorchSparkPlugin stops a cancelled job's training
processes, for TorchSparkRunner (a barrier stage or a gang launch) and for PySpark's
TorchDistributor, within the issue's 1 s
(jvmutil.GONE_BOUND_MS; measured from the cancel call, printed; the median goal of 200 ms is
measured by bench/jvm_cancel_bench.py), also when the job is cancelled while its tasks start,
and the plugin's shutdown() stops what an executor still runs when the executor stops; the
hang doctor (hangTimeout, hangAction=cancel) names a sleeping rank and cancels the run."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import jvmutil, tsp_spark

pytestmark = pytest.mark.skipif(not jvmutil.built(), reason="the JVM part was not built "
                                "(needs javac 17 and junit4: bash tests/setup.sh)")


class _ProcWatch:
    """From outside, as another process of the same user: every 50 ms, /proc/<pid>/environ
    and cmdline of every process that descends from spark-submit's and from a torchspark-run
    agent (the agent itself, the workers) and of every sentinel (double-forked out of the
    agent's tree: one of this run's has its agent's environment block), kept per pid
    (docs/security.md, "The executor host"). The run's secret lives only in the driver
    JVM's memory, so what is looked for is any 64-hex-digit run (the secret's form on a pipe
    or in an environment variable) and a TORCHSPARK_LOG_SECRET value that is not all NULs."""

    HEX64 = re.compile(rb"(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])")

    def __init__(self) -> None:
        import threading
        self.seen: dict = {}  # pid -> (comm, environ + cmdline), the last read
        self.stop = threading.Event()
        self.root = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self, pid: int) -> None:
        self.root = pid
        self.thread.start()

    def _tree(self) -> dict:
        parent, comm = {}, {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            comm[int(d)] = st[st.index("(") + 1:st.rindex(")")]
            parent[int(d)] = int(st[st.rindex(")") + 2:].split()[1])
        return {p: c for p, c in comm.items()
                if c == "tsp-sentinel" or self._under(p, parent, comm)}

    def _under(self, pid: int, parent: dict, comm: dict) -> bool:
        agent = False
        while pid > 1:
            agent = agent or comm.get(pid) == "torchspark-run"
            if pid == self.root:
                return agent
            pid = parent.get(pid, 0)
        return False

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            for pid, comm in self._tree().items():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read()
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        data = env + b"\n" + f.read()
                except OSError:
                    continue
                self.seen[pid] = (comm, data, env)

    def check(self) -> None:
        self.stop.set()
        self.thread.join(10)
        agents = {env for c, _, env in self.seen.values() if c == "torchspark-run"}
        self.seen = {p: v for p, v in self.seen.items()
                     if v[0] != "tsp-sentinel" or v[2] in agents}  # this run's sentinels
        comms = [c for c, _, _ in self.seen.values()]
        assert comms.count("torchspark-run") >= 2 and comms.count("tsp-sentinel") >= 2, comms
        assert len(comms) - comms.count("torchspark-run") - comms.count("tsp-sentinel") >= 2, comms
        for pid, (comm, data, _) in self.seen.items():
            assert not self.HEX64.search(data), (pid, comm, self.HEX64.search(data))
            for var in re.findall(rb"(?:^|\0)TORCHSPARK_LOG_SECRET=([^\0]*)", data):
                assert var.strip(b"\0") == b"", (pid, comm)


# The runner tests on a local-cluster with the driver's rendezvous as a user gets it (no
# plugin) share one application (one start of spark-submit, its local-cluster and its
# executors instead of three): TrainApp runs their modes one after another, each test reading
# its own mode's lines (jvmutil.split_text); the driver's 3 GPUs (a discovery script, given
# only when localgpu runs) are used by localgpu alone (local mode); election last (it leaves
# the JVM on allGather). Only the selected tests' modes run (the version matrix picks train).
_RUNNER_MODES = {"test_java_application_trains_across_two_executors": "train",
                 "test_runner_local_mode_uses_the_driver_gpus": "localgpu",
                 "test_runner_election_through_the_rendezvous_falls_back_to_all_gather_once":
                     "election"}


@pytest.fixture(scope="module")
def runner_app(request, tmp_path_factory):
    """(each mode's lines, each mode's stderr, the _ProcWatch of the whole application)."""
    chosen = {item.name for item in request.session.items}
    modes = [m for t, m in _RUNNER_MODES.items() if t in chosen]
    conf = {}
    if "localgpu" in modes:
        disc = tmp_path_factory.mktemp("gpus") / "gpus.sh"
        disc.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1", "2"]}\'\n')
        disc.chmod(0o755)
        conf = {"spark.driver.resource.gpu.amount": "3",
                "spark.driver.resource.gpu.discoveryScript": str(disc)}
    # Meanwhile, another process of the same user reads /proc of the agents, their
    # sentinels and workers: the run's secret is in none (test_executor_secrets.py does the
    # same for TorchDistributor).
    watch = _ProcWatch()
    outs, errs = jvmutil.spark_submit_modes(modes, plugin=False, conf=conf, on_start=watch.start,
                                            env={"TORCHSPARK_RENDEZVOUS": None})
    return outs, errs, watch


def test_java_application_trains_across_two_executors(runner_app):
    out, err, watch = runner_app[0]["train"], runner_app[1]["train"], runner_app[2]
    watch.check()
    # The election record went through the driver's rendezvous (the default), not allGather.
    assert out["ELECTION"] == ["rendezvous"], out
    # Rank 0's output (the JSON metrics ddp_train.py writes to --out) came back as bytes.
    assert out["OUTPUT"][0].startswith('{"world_size": 2, "steps": 12'), out
    # Every line reached the driver rank-tagged (the log, or stderr when the app's log is WARN).
    assert re.search(r"\[rank 0\] step +0 +loss", err), err[-3000:]
    assert re.search(r"\[rank 0\] rank 0 done: \{\"world_size\": 2", err), err[-3000:]
    # torchspark.report() of Python ranks reaches onReport and reports(), whole, in order.
    assert out["REPORTS"] == ["60 60 0.0"], out
    got = out["REPORT_STEPS"][0].rstrip(",").split(",")
    for rank in (0, 1):
        assert [int(x.split(":")[1]) for x in got if x.startswith(f"{rank}:")] == list(range(30))
    # A failing rank throws one exception naming rank, host and exit code, with its lines.
    fail = out["FAILURE"][0]
    assert re.match(r"rank=1 host=\S+ exit=5 lines=\[rank one gives up\]", fail), fail
    assert "rank 1 (node 1, local rank 0) on host" in out["MESSAGE"][0]
    assert "exited with code 5" in out["MESSAGE"][0]
    # The hang doctor (spark.torchspark.hangTimeout 3s, cancel): rank 1 asleep before the
    # second all_reduce is named with its frame, rank 0 waits in all_reduce #2 (its flight
    # recorder), and the exception carries the line and every rank's stacks.
    # A failure shows which path threw, in full (the whole `out` is cut by pytest): the
    # exception's rank, the doctor's diagnoses and lines, and the driver's last lines.
    why = "\n".join([f"HANG: {out.get('HANG')}", f"HANG_DIAGNOSES: {out.get('HANG_DIAGNOSES')}",
                     f"HANG_MESSAGE: {out.get('HANG_MESSAGE')}",
                     f"HANG_LINES: {out.get('HANG_LINES')}", "stderr's tail:", err[-6000:]])
    assert out["HANG"][0].startswith("rank=1 host="), why
    line = out["HANG_LINES"][0]
    # torch without gloo's flight recorder (before 2.8: the version matrix's 2.4.1) names
    # the collective without its number.
    fr = _gloo_flight_recorder()
    assert re.fullmatch(r"rank 1 \(host \S+, pid \d+\) is in hang_worker\.py:18 `time\.sleep\(hold\)  "
                        r"# HANG-SLEEP` \(sleeps_before_the_collective\)"
                        + (r", its last collective all_reduce #1; rank 0 waits in all_reduce #2"
                           if fr else r"; rank 0 waits in all_reduce") + " for it", line), why
    msg = out["HANG_MESSAGE"][0]
    assert msg.startswith("TorchSparkRunner (distributed) was cancelled by the hang doctor: no rank "
                          "printed or reported for 3s (spark.torchspark.hangTimeout); " + line), msg
    # its number: #1 unless a dump came while the workers were starting (no stack yet)
    assert re.search(r"\|\[rank 1\] torchspark: stack dump #\d+ of rank 1 \(host ", msg), msg
    assert ("[rank 0] torchspark: flight recorder: pg 0 (default_pg): all_reduce #2: not completed"
            if fr else "[rank 0] torchspark: flight recorder: ") in msg, msg
    assert f"torchspark: hang doctor: no rank printed or reported for 3s; {line}" in err
    # Its report: the C core's hang document, the layout of TorchDistributorError.report.
    report = json.loads(out["HANG_REPORT"][0])
    assert list(report) == ["version", "kind", "culprits", "message", "waiting", "stacks"], report
    assert (report["kind"], report["culprits"], report["message"]) == ("hang", [1], line), report
    assert report["stacks"]["1"][0].startswith("torchspark: stack dump #"), report
    # Every rank's stacks in a private file that the driver names: removed here, as the
    # driver JVM's java.io.tmpdir is the host's shared /tmp (one more file per test run).
    tag = "torchspark: every rank's stacks (hang doctor): "
    stacks = next(ln[len(tag):] for ln in err.splitlines() if ln.startswith(tag))
    assert os.stat(stacks).st_mode & 0o077 == 0, stacks
    os.unlink(stacks)
    print("JVM hang doctor: cancelled after", out["HANG_MS"][0], "ms of the run (hangTimeout 3s)")
    # Nothing left running: rank 0's sleeping node was stopped through the control channel.
    assert out["LEFT"] == ["0"], out


def _gloo_flight_recorder() -> bool:
    """Whether the ranks' torch (this interpreter's) records gloo's collectives."""
    r = subprocess.run([sys.executable, "-c", "import torch; "
                        "print(hasattr(torch._C._distributed_c10d, '_dump_fr_trace_json'))"],
                       capture_output=True, text=True, timeout=300)
    return r.stdout.strip().endswith("True")


def _elections(err):
    """Per run (TORCHELASTIC_RUN_ID), what each rank got: {run_id: {rank: (addr, port)}}."""
    runs = {}
    for m in re.finditer(r"^\[rank (\d)\] ELECT (\d) (\S+) (\d+) (\S+)$", err, re.M):
        assert m.group(1) == m.group(2), m.group(0)
        runs.setdefault(m.group(5), {})[int(m.group(1))] = (m.group(3), int(m.group(4)))
    return runs


def _check_elections(out, err):
    runs = _elections(err)
    # 3 runs of 2 tasks, each rank of a run with the one record rank 0 elected.
    assert len(runs) == 3, err[-3000:]
    for got in runs.values():
        assert sorted(got) == [0, 1] and got[0] == got[1], got
    print("runner runs, ms (election through " + ", ".join(out["ELECTION"]) + "): " + ", ".join(out["RUN_MS"]))
    return [ln for ln in err.splitlines() if "WARN TorchSparkRunner" in ln]


def test_runner_election_through_the_rendezvous_falls_back_to_all_gather_once(runner_app):
    # The second run's tasks are told a port where nothing listens (a test-only local
    # property): they fail before training, the driver runs the job again through allGather
    # with one warning and keeps to allGather for the later runs of its JVM.
    out, err = runner_app[0]["election"], runner_app[1]["election"]
    assert out["ELECTION"] == ["rendezvous", "allGather", "allGather"], out
    warned = _check_elections(out, err)
    assert len(warned) == 1, warned
    assert "could not reach torchspark's rendezvous" in warned[0] and "allGather" in warned[0], warned
    assert "TORCHSPARK_RENDEZVOUS_UNREACHABLE" not in warned[0] and "127.0.0.1:" in warned[0], warned


def test_runner_election_through_all_gather_when_the_rendezvous_is_off():
    # Where Spark authenticates and encrypts its RPC (allGather goes through it): the runner
    # goes on and logs the C core's one line, as the PySpark glue (docs/security.md,
    # "Clusters where Spark encrypts").
    out, err = jvmutil.spark_submit("election", plugin=False, env={"TORCHSPARK_RENDEZVOUS": "0"},
                                    conf={"spark.authenticate": "true",
                                          "spark.authenticate.secret": os.urandom(16).hex(),
                                          "spark.network.crypto.enabled": "true"})
    assert out["ELECTION"] == ["allGather"] * 3, out
    assert [w for w in _check_elections(out, err) if "Spark secures" not in w] == []
    line = ("WARN TorchSparkRunner: Spark secures its own traffic here (spark.network.crypto."
            "enabled=true, spark.authenticate=true); torchspark's own channel to the driver")
    assert err.count(line) == 3, err[-3000:]  # one per distributed run


def test_runner_local_mode_uses_the_driver_gpus(runner_app):
    # Local mode with useGpu: the first numProcesses of the driver's GPUs (Spark's
    # addresses from a discovery script; no GPU needed: the agent assigns them against the
    # driver's mask, docs/gpu.md), never a silent CPU run; too few is an error.
    out, err = runner_app[0]["localgpu"], runner_app[1]["localgpu"]
    assert out.get("LOCAL_GPU_RUN") == ["ok"], err[-3000:]
    lines = sorted(ln for ln in err.splitlines() if "GPUS " in ln)
    assert lines == ["[rank 0] GPUS 0 0,1", "[rank 1] GPUS 1 0,1"], err[-3000:]
    assert out["TOO_FEW"] == ["torchspark: local mode with useGpu runs 4 process(es), one per GPU, but "
                              "the driver has 3 GPU(s): [0, 1, 2]; lower numProcesses or raise "
                              "spark.driver.resource.gpu.amount"], out


def test_runner_gang_launch_trains_from_zero_executors_under_dynamic_allocation():
    # Dynamic allocation from 0 executors (at most 2): TorchSparkRunner.launch("barrier") is
    # refused at submission as stock TorchDistributor is (SPARK-24942); the default (auto ->
    # gang: ordinary tasks that JOIN through the driver's rendezvous) trains the DDP example;
    # one failing rank ends the run; a job group cancel ends a training gang and a waiting one;
    # 3 nodes where 2 executors of 1 core fit fail at the gang's 8 s deadline with the C
    # core's sentence, the job gone, no task running, no process left.
    out, err = jvmutil.spark_submit("gang", plugin=False, env={"TORCHSPARK_RENDEZVOUS": None}, conf={
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.initialExecutors": "0",
        "spark.dynamicAllocation.maxExecutors": "2",
        "spark.dynamicAllocation.executorIdleTimeout": "60s"})
    assert out["EXECUTORS_BEFORE"] == ["0"], out
    assert "SPARK-24942" in out["BARRIER"][0], out
    assert out["OUTPUT"][0].startswith('{"world_size": 2, "steps": 12'), (out, err[-3000:])
    print(f"\nJVM runner, gang launch from 0 executors: {out['GANG_MS'][0]} ms")
    # One task's failure ends every task: rank 1's exit 5 is the error, rank 0's sleep is
    # stopped with it (no process of the run left within 10 s).
    assert out["FAILURE"] == ["rank=1 exit=5"], out
    assert out["FAILURE_MS"][0].endswith(" 0"), out
    # A cancel (its job group) leaves no process and no task waiting: a gang that trains
    # (its processes gone within 5 s, no plugin here: the agents' parent-death signal and
    # sentinel), and one whose 2 started tasks of 3 wait in their JOIN (no process yet: the
    # deadline is 600 s, so only the cancel ends them); run() throws, no job stays active.
    for nodes in ("2", "3"):
        print(f"JVM runner, gang of {nodes} cancelled: {out[f'GANG_CANCEL_{nodes}'][0]}")
        threw, gone, seen, running, active, error = out[f"GANG_CANCEL_{nodes}"][0].split()
        # 2 agents, their sentinels and 2 sleeps; none while the tasks wait in their JOIN
        assert (int(seen) >= 4 if nodes == "2" else seen == "0"), (nodes, out[f"GANG_CANCEL_{nodes}"])
        assert (running, active) == ("0", "0"), (nodes, out[f"GANG_CANCEL_{nodes}"], err[-3000:])
        assert 0 <= int(threw) < 15000 and 0 <= int(gone) <= 5000, (nodes, out[f"GANG_CANCEL_{nodes}"])
        assert error != "none", out[f"GANG_CANCEL_{nodes}"]
    msg = out["DEADLINE"][0]
    assert re.match(r"torchspark: gang launch: only [0-2] of the attempt's 3 tasks started "
                    r"within 8 s \(tasks started: (none|node [01] on host )", msg), msg
    assert "spark.dynamicAllocation.maxExecutors is 2" in msg and "2 core(s)" in msg, msg
    assert int(out["DEADLINE_MS"][0]) < 18000, out
    assert out["ACTIVE_JOBS"] == ["0"] and out["LEFT"] == ["0"], out
    # No executor held by a task of the run: Spark's kill of its tasks comes after the job's
    # end, within seconds (TrainApp waits up to 10 s; Spark's listener bus, which its status
    # store reads, lags seconds more under load).
    running, took = out["RUNNING_TASKS"][0].split()[:2]
    assert running == "0", out["RUNNING_TASKS"]
    print(f"JVM runner, gang deadline: run() threw after {out['DEADLINE_MS'][0]} ms, no task "
          f"running {took} ms after that")


# The runner tests that need only the plugin share one application (one start of
# spark-submit, its local-cluster and its executors instead of three): TrainApp runs their
# modes one after another, each counting the executors' log lines from its own start;
# killexec last (it stops an executor). Only the selected tests' modes run (the version
# matrix picks one).
_PLUGIN_MODES = {"test_plugin_stops_a_cancelled_runner_job": "cancel",
                 "test_plugin_runner_job_cancelled_while_its_tasks_start": "early",
                 "test_plugin_stops_a_cancelled_gang_launch": "gangcancel",
                 "test_plugin_executor_stopped_normally_leaves_nothing": "killexec"}


@pytest.fixture(scope="module")
def plugin_app(request):
    chosen = {item.name for item in request.session.items}
    return jvmutil.spark_submit_modes([m for t, m in _PLUGIN_MODES.items() if t in chosen],
                                      plugin=True)


def test_plugin_stops_a_cancelled_runner_job(plugin_app):
    out, err = plugin_app[0]["cancel"], plugin_app[1]["cancel"]
    assert int(out["BEFORE"][0]) >= 4, out
    gone = int(out["GONE_MS"][0])
    print(f"runner job: every training process gone {gone} ms after cancelAllJobs")
    assert 0 <= gone < jvmutil.GONE_BOUND_MS, (out, err[-3000:])
    # The plugin itself stopped the agents (the executors' logs say so).
    assert int(out["PLUGIN_STOPS"][0]) >= 1, out


def test_plugin_stops_a_cancelled_gang_launch(plugin_app):
    """launch("gang") (ordinary tasks that JOIN through the driver; here without dynamic
    allocation) cancelled by its job group mid-training: the plugin stops the agents as for
    a barrier stage, run() throws, no process, task or job is left (TrainApp gangCancel)."""
    out, err = plugin_app[0]["gangcancel"], plugin_app[1]["gangcancel"]
    threw, gone, seen, running, active, error = out["GANG_CANCEL_2"][0].split()
    print(f"gang launch: every training process gone {gone} ms after cancelJobGroup")
    assert int(seen) >= 4 and (running, active) == ("0", "0"), (out, err[-3000:])
    assert 0 <= int(gone) < jvmutil.GONE_BOUND_MS and 0 <= int(threw) < 15000, out
    assert error == "TorchSparkException", out
    assert int(out["PLUGIN_STOPS"][0]) >= 1, out


# The PySpark tests of the plugin share one application (one interpreter, one session with
# the plugin, one local-cluster instead of three): a child process runs their phases one
# after another, only the selected tests' (the version matrix picks one), in this order:
# - cancel: a cancelled running job;
# - early: jobs cancelled while their tasks start (with TORCHSPARK_RENDEZVOUS=0, read at each
#   run(); unset again after);
# - frozen: the driver freezes (SIGSTOP) while every rank prints a line every 2 ms; the
#   parent, once it sees it stopped, cancels every job through the driver's JVM (its Py4J
#   gateway), times the job's processes from that call, then thaws it (a driver that
#   cancelled and then froze itself raced the agents: descheduled for a few tens of ms
#   between the two, its log server acknowledged their last lines before it froze);
# - frozen_ddp: the same mid-DDP (as a driver stuck in a long GC pause or a debugger): its
#   log server tells no agent to stop, so only the executors' plugin can (the interrupt
#   listener on Spark 4.3+, the 20 ms poll before); the parent times it from the cancel.
# Each phase starts once the previous one's processes are gone and counts the executors'
# log lines from its own start. In a fresh interpreter: the plugin's class must be on the
# driver JVM's classpath when that JVM starts (spark.jars at launch, as `pyspark --jars` or
# a first session's config gives it); this pytest process's JVM gateway may already be up
# from an earlier session.
_PYSPARK_PHASES = {"test_plugin_stops_a_cancelled_pyspark_job": "cancel",
                   "test_plugin_pyspark_job_cancelled_while_its_tasks_start": "early",
                   "test_plugin_stops_agents_of_a_frozen_driver_within_the_bound": "frozen",
                   "test_plugin_stops_a_cancelled_pyspark_job_while_its_driver_is_frozen":
                       "frozen_ddp"}
_PYSPARK_APP = """
import json, os, signal, sys, threading, time
from tests.helpers import jvmutil, tsp_spark
mark, steady, phases = sys.argv[1], sys.argv[2], sys.argv[3:]
spark = jvmutil.pyspark_session(plugin=True, mark=mark)
app = spark.sparkContext.applicationId
NEEDLES = {"stops": "torchspark plugin: stopped",
           "warnings": "did not acknowledge the last lines",
           "polls": "found by polling every 20 ms",
           "early": "killed with no agent running",
           "late": "(started after the kill)",
           "errors": "torchspark plugin: stopping a task's processes failed"}
def counts():
    return {k: jvmutil.plugin_stops(app, n) for k, n in NEEDLES.items()}
def since(base):
    return {k: v - base[k] for k, v in counts().items()}
def train(*args):
    from torchspark import TorchDistributor
    def run():
        try:
            TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(*args)
        except Exception:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 600
    while len(tsp_spark.job_processes(mark)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # mid-training: lines flowing
    return t
try:
    print("APP " + app, flush=True)
    for phase in phases:
        base = counts()
        print("PHASE " + json.dumps([phase, base]), flush=True)
        if phase == "frozen":
            t = train(steady)
            gw = spark.sparkContext._gateway.gateway_parameters  # the parent cancels through it
            print("FROZEN " + json.dumps([gw.port, gw.auth_token]), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(1)  # thawed: the executors' log lines
            res = since(base)
            t.join(30)
        elif phase == "frozen_ddp":
            t = train(str(jvmutil.DDP), "--steps", "100000000")
            print("FREEZE", flush=True)
            t0 = time.monotonic()
            spark.sparkContext.cancelAllJobs()
            os.kill(os.getpid(), signal.SIGSTOP)
            print(f"CANCELLED {t0}", flush=True)  # once thawed; CLOCK_MONOTONIC, as the test's
            time.sleep(1)
            res = {}
        elif phase == "cancel":
            (gone,) = jvmutil.cancel_pyspark(spark, mark)
            time.sleep(1)  # the executors' log lines
            res = dict(since(base), gone=gone)
        else:
            os.environ["TORCHSPARK_RENDEZVOUS"] = "0"
            rounds = jvmutil.cancel_early_pyspark(spark, mark, base=base["early"])
            time.sleep(0.5)  # the executors' log lines
            res = dict(since(base), rounds=rounds,
                       after=spark.sparkContext.parallelize(range(4), 2).count())
            del os.environ["TORCHSPARK_RENDEZVOUS"]
        left = tsp_spark.wait_gone(mark, 15)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        print("RESULT " + json.dumps([phase, dict(res, left=len(left))]), flush=True)
finally:
    spark.stop()
"""


def _state(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def _workers(pids):
    """The training processes among pids (not the torchspark-run agents)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"torchspark-run" not in f.read().split(b"\0")[0]:
                    out.append(pid)
        except OSError:
            pass
    return out


def _time_frozen(p, mark):
    """The frozen phase, from outside: once the driver's Python is stopped, every job
    cancelled through its JVM (Py4J, as the driver's own call would); the ms from that call
    until no process of the job is left (-1: not within 15 s), and whether the driver was
    still stopped then."""
    from py4j.java_gateway import GatewayParameters, JavaGateway

    for line in p.stdout:
        if line.startswith("FROZEN "):
            port, token = json.loads(line[len("FROZEN "):])
            break
    else:
        raise AssertionError("the application ended before its driver froze")
    deadline = time.monotonic() + 60
    while _state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert _state(p.pid) == "T", "the driver did not freeze"
    gw = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=token))
    try:
        t0 = time.monotonic()
        gw.jvm.org.apache.spark.SparkContext.getOrCreate().cancelAllJobs()
        while time.monotonic() - t0 < 15:
            if not tsp_spark.job_processes(mark):
                return {"gone": (time.monotonic() - t0) * 1000, "frozen_at_gone": _state(p.pid) == "T"}
            time.sleep(0.005)
        return {"gone": -1.0, "frozen_at_gone": _state(p.pid) == "T"}
    finally:
        gw.close()


def _time_frozen_ddp(p, mark, app, base):
    """The frozen_ddp phase, from outside, while the driver is frozen: when the training
    processes and when every process of the job were gone (monotonic), whether the driver
    was still frozen then, and the plugin's lines of the phase."""
    for line in p.stdout:
        if line.startswith("FREEZE"):
            break
    else:
        raise AssertionError("the application ended before its driver froze")
    deadline = time.monotonic() + 60
    while _state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert _state(p.pid) == "T", "the driver did not freeze"
    workers_gone = gone = -1.0
    while time.monotonic() < deadline:
        left = tsp_spark.job_processes(mark)
        if workers_gone < 0 and not _workers(left):
            workers_gone = time.monotonic()
        if not left:
            gone = time.monotonic()
            break
        time.sleep(0.005)
    frozen_at_gone = _state(p.pid) == "T"
    time.sleep(0.5)  # the executors' log lines
    return {"workers_gone": workers_gone, "gone": gone, "frozen_at_gone": frozen_at_gone,
            "stops": jvmutil.plugin_stops(app) - base["stops"],
            "polls": jvmutil.plugin_stops(app, "found by polling every 20 ms") - base["polls"]}


@pytest.fixture(scope="module")
def pyspark_app(request, tmp_path_factory):
    """{phase: what the child and the parent measured}."""
    chosen = {item.name for item in request.session.items}
    phases = [ph for t, ph in _PYSPARK_PHASES.items() if t in chosen]
    steady = tmp_path_factory.mktemp("steady") / "steady.py"
    steady.write_text(_STEADY)
    mark = jvmutil.new_mark()
    err = open(tmp_path_factory.mktemp("driver") / "driver.err", "w+")
    p = subprocess.Popen([sys.executable, "-c", _PYSPARK_APP, mark, str(steady), *phases],
                         cwd=jvmutil.ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    res, outside, bases = {}, {}, {}
    try:
        app = p.stdout.readline().strip()
        assert app.startswith("APP "), app
        app = app[len("APP "):]
        for line in p.stdout:
            if line.startswith("PHASE "):
                phase, base = json.loads(line[len("PHASE "):])
                bases[phase] = base
                try:
                    if phase == "frozen":
                        outside[phase] = _time_frozen(p, mark)
                    elif phase == "frozen_ddp":
                        outside[phase] = _time_frozen_ddp(p, mark, app, base)
                finally:
                    os.kill(p.pid, signal.SIGCONT)
            elif line.startswith("CANCELLED "):
                outside["frozen_ddp"]["t0"] = float(line.split()[1])
            elif line.startswith("RESULT "):
                phase, r = json.loads(line[len("RESULT "):])
                res[phase] = dict(r, base=bases[phase], **outside.get(phase, {}))
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
        for pid in tsp_spark.job_processes(mark):
            os.kill(pid, signal.SIGKILL)
        err.seek(0)
        tail = err.read()[-3000:]
        err.close()
    assert p.returncode == 0 and set(res) == set(phases), (p.returncode, res, tail)
    return res


def test_plugin_stops_a_cancelled_pyspark_job(pyspark_app):
    res = pyspark_app["cancel"]
    print(f"PySpark job: every training process gone {res['gone']} ms after cancelAllJobs")
    assert 0 <= res["gone"] < jvmutil.GONE_BOUND_MS, res
    assert res["stops"] >= 1, "the executors' logs do not show the plugin stopping the agents"


# Every rank prints a line every 2 ms: lines are in flight when the driver freezes.
_STEADY = "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.002)\n"


def test_plugin_stops_agents_of_a_frozen_driver_within_the_bound(pyspark_app):
    # Issue 20: the agents lived 1.02-1.04 s here, waiting for the frozen driver to
    # acknowledge their last lines until the plugin's SIGKILL; now they give up after
    # 100 ms and write those lines to the executor's log with one warning.
    res = pyspark_app["frozen"]
    gone = res["gone"]
    print(f"frozen driver: every training process and agent gone {gone:.0f} ms after "
          f"cancelAllJobs (called once the driver was frozen); {res}")
    assert res["frozen_at_gone"], res  # the driver never acknowledged their last lines
    assert 0 <= gone < jvmutil.GONE_BOUND_MS, (gone, res)
    assert res["stops"] >= 1, res  # the plugin's kill path did it
    assert res["warnings"] >= 1, res  # and the agents did not wait for the driver


def test_plugin_stops_a_cancelled_pyspark_job_while_its_driver_is_frozen(pyspark_app):
    import pyspark

    res = pyspark_app["frozen_ddp"]
    stops, polls = res["stops"], res["polls"]
    workers_ms, gone_ms = ((t - res["t0"]) * 1000 if t > 0 else -1
                           for t in (res["workers_gone"], res["gone"]))
    print(f"PySpark {pyspark.__version__}, driver frozen: training processes gone {workers_ms:.0f} "
          f"ms, agents {gone_ms:.0f} ms after cancelAllJobs (plugin stops: {stops}, polling "
          f"executors: {polls})")
    assert res["frozen_at_gone"], "the driver thawed before the processes were gone"
    assert 0 <= workers_ms < jvmutil.GONE_BOUND_MS, (workers_ms, gone_ms)
    # The agents outlive their workers here: at exit an agent waits for the log server's
    # acknowledgement of its last events (up to 5 s; docs/jvm.md), which a frozen driver
    # never sends; the plugin's SIGKILL after its grace (2 s by default, counted from its
    # TERM, when the workers went) ends them.
    assert 0 <= gone_ms - workers_ms < 2000 + jvmutil.GONE_BOUND_MS, (workers_ms, gone_ms)
    assert stops >= 1, "the executors' logs do not show the plugin stopping the agents"
    # Spark before 4.3 has no interrupt listener: the plugin's poll found the kill.
    old = tuple(int(x) for x in pyspark.__version__.split(".")[:2]) < (4, 3)
    assert (polls > 0) == old, polls


def test_plugin_two_jobs_on_one_executor_only_the_cancelled_one_dies():
    # One executor with 2 cores runs both jobs; then stopping the application (spark.stop())
    # stops the other (the failed job's driver tells its agent to stop; the executor's
    # stop is tested with the plugin's shutdown() alone below).
    out, err = jvmutil.spark_submit("concurrent", plugin=True, master="local-cluster[1,2,1024]")
    a, b = (int(x) for x in out["BEFORE"][0].split())
    assert a >= 2 and b >= 2, out
    gone = int(out["GONE_MS"][0])
    print(f"job A: gone {gone} ms after cancelJobGroup; job B: gone "
          f"{out['STOP_GONE_MS'][0]} ms after spark.stop() was called")
    assert 0 <= gone < jvmutil.GONE_BOUND_MS, (out, err[-3000:])
    assert int(out["OTHER_ALIVE"][0]) == b, out
    # The plugin saw job A's task killed: it stopped its agent, or found it already stopped
    # by the run's own STOP (the driver stops every agent of a failed job; the two race).
    assert int(out["PLUGIN_STOPS"][0]) + int(out["PLUGIN_EARLY"][0]) >= 1, out
    assert int(out["STOP_GONE_MS"][0]) >= 0, (out, err[-3000:])


def test_plugin_executor_stopped_normally_leaves_nothing(plugin_app):
    # SparkContext.killExecutor while a runner job's agent runs: the worker sends the executor
    # JVM SIGTERM, Spark's shutdown hook stops the Executor, which calls the plugin's
    # shutdown(): it stops every tagged process and waits for them, so they are gone BEFORE
    # the executor JVM (without the plugin they die after it, by their parent-death signal:
    # measured 664 ms vs the JVM's 649 ms; with it 283 ms vs 481 ms). The executor's own log
    # cannot show it: the worker stops copying the executor's output before killing it.
    out, err = plugin_app[0]["killexec"], plugin_app[1]["killexec"]
    assert int(out["BEFORE"][0]) >= 2 and int(out["EXECUTOR_PID"][0]) > 1, out
    assert out["KILLED"] == ["true"], out
    gone, jvm_gone = int(out["GONE_MS"][0]), int(out["EXECUTOR_GONE_MS"][0])
    print(f"killExecutor: the job's processes gone after {gone} ms, the executor JVM after {jvm_gone} ms")
    assert 0 <= gone < jvm_gone, (out, err[-3000:])
    assert out["LEFT"] == ["0"], out


def test_plugin_runner_job_cancelled_while_its_tasks_start(plugin_app):
    # Cancelled 0-1400 ms after the driver launched the first task: before Task.run, in the
    # election (waiting for rank 0's record in the driver's rendezvous, where a task checks
    # its kill flag every 100 ms), or just after the agents started. Nothing may be left,
    # then or 2 s later (a late agent).
    out, err = plugin_app[0]["early"], plugin_app[1]["early"]
    rounds = [[int(x) for x in r.split()] for r in out["ROUND"]]
    print("rounds (delay ms, processes at the cancel, gone ms, left 2 s later):", rounds)
    for _delay, _before, gone, left in rounds:
        assert 0 <= gone < jvmutil.GONE_BOUND_MS, (rounds, err[-3000:])
        assert left == 0, (rounds, err[-3000:])
    # The window held open (TrainApp's frozen round: rank 0's executor stopped by SIGSTOP,
    # rank 1's task waiting in the election for its record): the plugin saw a torchspark task
    # killed before its agent existed, and nothing was left once rank 0's executor went on.
    early, before, gone, left = (int(x) for x in out["FROZEN"][0].split())
    print("frozen round (early kills, processes at the cancel, gone ms, left 2 s later):",
          early, before, gone, left)
    assert early >= 1 and before == 0, (out, err[-3000:])
    assert 0 <= gone < jvmutil.GONE_BOUND_MS and left == 0, (out, err[-3000:])
    assert int(out["EARLY_KILLS"][0]) >= 1, out
    assert int(out["PLUGIN_ERRORS"][0]) == 0, out
    assert out["AFTER"] == ["ok"], out  # the executors and the plugin still run a job


def test_plugin_pyspark_job_cancelled_while_its_tasks_start(pyspark_app):
    # PySpark's task cannot see its own kill: a task killed while in the barrier's allGather
    # (which still returns) starts its agent after the cancel; the plugin watches a killed
    # attempt and stops such a late agent within its 100 ms sweep, long before PySpark
    # would kill the Python worker (2 s poll + spark.python.task.killTimeout). Cancels 0,
    # 0.01, 0.02, ... 0.11, then 0.15, 0.2, ... 1.5 s after the launch, until one lands
    # before an agent existed. The election goes through allGather here
    # (TORCHSPARK_RENDEZVOUS=0, a supported setting): its 1 s poll keeps the tasks
    # agent-less long enough to land there; with the driver's rendezvous the agents are
    # up within ~10 ms of the launch on a quiet machine and no delay reliably hits it.
    res = pyspark_app["early"]
    print("rounds (delay s, processes at the cancel, gone ms, a late agent first and last "
          "seen ms, left):", res)
    for _delay, _before, gone, first, last, left in res["rounds"]:
        assert 0 <= gone < jvmutil.GONE_BOUND_MS, res
        # A late agent (started up to ~1 s after the cancel: allGather's poll) is stopped
        # within 1 s of its start (the watch sweeps every 100 ms); PySpark alone would
        # leave it until it kills the Python worker, >= 2 s after the cancel.
        assert last - first < jvmutil.GONE_BOUND_MS, res
        assert left == 0, res
    # The window was hit: a cancel came while no process of the job existed yet (the task
    # killed before it starts), or the plugin saw a killed task with no agent running.
    assert res["early"] >= 1 or any(rnd[1] == 0 for rnd in res["rounds"]), res
    assert res["errors"] == 0 and res["after"] == 4, res
