"""torchspark.TorchDistributor from a Spark Connect client, on a real local Connect server
(local-cluster[2,1,1024], conftest.connect_server) whose executors lack torchspark (it
ships itself as a session artifact): function and script mode, logs on the client, a
failure, a cancellation through the session, a result larger than a gRPC message over the
output channel, the collected-rows path (result and reports) when the executors cannot
reach the client, and a decommissioned executor's checkpoint on request, restart and
growing back (last: the server has its two executors again when it ends)."""
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark import cloudpickle

from tests.helpers import jvmutil
from tests.helpers import tsp_spark
from tests.e2e.test_restart import _steplog, executor_of_node
from torchspark import TorchDistributor, TorchDistributorError
from torchspark.driver import _ship

cloudpickle.register_pickle_by_value(sys.modules[__name__])
TEARDOWN_S = 2  # as on classic: nothing of a failed run may live longer


@pytest.fixture(scope="module")
def spark(connect_spark):
    return connect_spark


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "TorchDistributor" and r.levelname == "WARNING"]


def _allreduce(tag):
    import torch
    import torch.distributed as dist
    print(f"{tag} from rank {os.environ['RANK']}", flush=True)
    dist.init_process_group("gloo")
    t = torch.tensor([float(os.environ["RANK"]) + 1])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"sum": t.item(), "world": int(os.environ["WORLD_SIZE"])}


SCRIPT = """import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(os.environ["RANK"]) + 1])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:
    f.write(str(t.item()))
"""


def test_function_and_script_mode_with_logs_on_the_client(spark, tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.is_remote
    assert d.run(_allreduce, "hello") == {"sum": 3.0, "world": 2}
    err = capsys.readouterr().err
    assert "hello from rank 0" in err and "hello from rank 1" in err, err[-2000:]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert d.run(str(script), tmp_path) is None
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["3.0", "3.0"]
    assert _warnings(caplog) == []


def _where():
    import os
    import sys

    with open(f"/proc/{os.getppid()}/comm") as f:
        return sys.modules["torchspark"].__file__, f.read().strip()


def _reporting(steps):
    import torchspark
    for s in range(steps):
        torchspark.report({"v": s * 2}, step=s)
    return int(os.environ["RANK"])


def test_reports_reach_the_client(spark):
    """torchspark.report() under Connect: over the channel to this client's log server."""
    seen = []
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         on_report=seen.append, progress=False)
    assert d.run(_reporting, 20) == 0
    for rank in (0, 1):
        assert [(r.step, r.metrics) for r in d.reports if r.rank == rank] == [
            (s, {"v": 2 * s}) for s in range(20)]
    assert seen == d.reports and len(seen) == 40


def test_driver_only_install_ships_as_a_session_artifact(spark, caplog):
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    where, parent = d.run(_where)
    _, name = _ship.archive()
    assert f"/{name}/torchspark/" in where, where  # the workers used the shipped copy
    assert parent == "tsp-warm-pool"  # forked from the executor's warm pool (shipped too)
    assert _ship.shipped(spark, True) is not None
    shipped = [r.getMessage() for r in caplog.records if "is not installed" in r.getMessage()]
    assert len(shipped) <= 1  # once per session, whichever test ran first


def _failing(stamp):
    if os.environ["RANK"] == "1":
        print("rank one going down", flush=True)
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        raise RuntimeError("boom from rank one")
    time.sleep(120)


def test_failure_names_the_root_cause_and_leaves_nothing(spark, tmp_path):
    stamp = str(tmp_path / "stamp")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_failing, stamp)
    assert time.time() - float(open(stamp).read()) < 10
    msg = str(e.value)
    assert "rank 1 (node 1, local rank 0)" in msg and "exited with code 1" in msg, msg
    assert "RuntimeError: boom from rank one" in msg and "rank one going down" in msg
    assert tsp_spark.wait_gone(tsp_spark.CONNECT_MARK, TEARDOWN_S) == []


def _sleepy():
    time.sleep(120)


def test_interrupt_all_kills_training_within_5s(spark):
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    errors = []

    def go():
        try:
            d.run(_sleepy)
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=go)
    t.start()
    assert len(tsp_spark.wait_present(tsp_spark.CONNECT_MARK, 4, 120)) >= 4
    spark.interruptAll()
    left = tsp_spark.wait_gone(tsp_spark.CONNECT_MARK, 5)
    t.join(60)
    assert left == []
    assert errors and isinstance(errors[0], TorchDistributorError), errors
    # The executors' TorchSparkPlugin took the killed tasks for torchspark's (their job tag
    # inside Connect's session tag; before, it ignored Connect's tasks): it stopped their
    # agents, or logged the kill with no agent left to stop (torchspark's own driver was
    # first).
    app = spark.conf.get("spark.app.id")
    deadline = time.monotonic() + 10
    while jvmutil.plugin_stops(app, "killed task attempt") + jvmutil.plugin_stops(
            app, "killed with no agent running") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert jvmutil.plugin_stops(app, "killed task attempt") + jvmutil.plugin_stops(
        app, "killed with no agent running") >= 2


def _big(n):
    return os.urandom(16) * (n // 16)


def test_result_larger_than_a_grpc_message_comes_over_the_channel(spark, caplog):
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    n = 160 * 1024 * 1024  # over the Connect client's 128 MiB message limit
    big = d.run(_big, n)
    assert len(big) == n and big[:16] * (n // 16) == big
    assert _warnings(caplog) == []


def _big_reporting(n, steps):
    _reporting(steps)
    return _big(n)


def test_unreachable_client_result_and_reports_as_rows_and_one_warning(spark, caplog,
                                                                       monkeypatch):
    # 127.0.0.2 is this host, but the log server listens on 127.0.0.1 only: refused.
    monkeypatch.setenv("TORCHSPARK_CLIENT_ADDRESS", "127.0.0.2")
    caplog.set_level(logging.INFO)
    seen = []
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         on_report=seen.append, progress=False)
    n = 24 * 1024 * 1024 + 16  # several rows, the last one short
    big = d.run(_big_reporting, n, 20)
    assert len(big) == n and big[:16] * (n // 16) == big
    warned = _warnings(caplog)
    assert len(warned) == 1 and "127.0.0.2" in warned[0], warned
    # The agents wrote the reports to their stderr; they came back with the result.
    for rank in range(2):
        assert [(r.step, r.metrics) for r in d.reports if r.rank == rank] == [
            (s, {"v": s * 2}) for s in range(20)]
    assert seen == d.reports and len(seen) == 40


def test_a_held_slot_on_connect_runs_until_released_then_frees_it(spark):
    """Connect's hold (issue 31: _connect.Probe keeps the slots it found under dynamic
    allocation, else the idle timeout releases the replacement while the smaller attempt
    stops): its task runs, tagged, until released; then it is interrupted by its tag at
    once and both slots are free (a 2-task barrier job runs). Fails on a hold that only knew
    classic sessions (its job was never submitted: the thread ended at once)."""
    import threading

    from torchspark.driver import _connect

    held, done = _connect.Hold(spark, 1, 86_400_000), threading.Event()
    held.begin(done)
    time.sleep(3)
    assert held.thread.is_alive()  # its one task sleeps in the JVM
    ended = time.monotonic()
    done.set()
    held.thread.join(15)
    assert not held.thread.is_alive()
    rows = spark.range(0, 2, 1, 2).mapInArrow(_first_rows, "id long", barrier=True).collect()
    assert sorted(r.id for r in rows) == [0, 1] and time.monotonic() - ended < 30


def _first_rows(batches):
    yield from batches


def _train_on_request(ckpt, steplog, steps, every, end_attempt=None, end_after=0):
    """Function mode (forked from the executors' warm pools): a gloo training that resumes
    from torchspark.checkpoint, saves every `every` steps and when
    checkpoint.requested() says so (a decommission notice, or the driver's request to grow
    back: docs/distributor.md). Rank 0 appends "ATTEMPT STEP TIME" to steplog after each
    step. Attempt `end_attempt` ends after `end_after` steps (the test's end)."""
    import torch
    import torch.distributed as dist

    from torchspark import checkpoint

    attempt = os.environ.get("TORCHSPARK_ATTEMPT", "-")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ck = checkpoint.load_latest(ckpt)
    start = 0 if ck is None else ck.step + 1
    if attempt == end_attempt:
        steps = min(steps, start + end_after)
    if ck is not None:
        model.load_state_dict(ck.state["model"])
        opt.load_state_dict(ck.state["opt"])
    for step in range(start, steps):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + rank))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if rank == 0:
            with open(steplog, "a") as f:
                f.write(f"{attempt} {step} {time.time():.6f}\n")
        if step % every == 0 or checkpoint.requested():
            checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict()}, step,
                            dir=ckpt)
        time.sleep(0.1)
    return {"attempt": attempt, "start": start,
            "cause": os.environ.get("TORCHSPARK_RESTART_CAUSE")}


def _executors() -> set:
    """The Connect server's executor JVMs (their environment carries its mark)."""
    needle = f"{tsp_spark.MARK}={tsp_spark.CONNECT_MARK}".encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in cmd and needle in env:
            found.add(int(pid))
    return found


def _registered(server) -> set:
    """The executor ids the Connect server's driver registered so far (its log)."""
    return set(re.findall(r"Registered executor .* with ID (\d+)",
                          server.log_path.read_text(errors="replace")))


def _train_until_step(n, ckpt, steplog, *args):
    """run(_train_on_request, ckpt, steplog, *args) on 2 nodes (max_restarts=1, min_nodes=1)
    in a thread of its own, once rank 0 logged n steps (or the run ended, or 120 s): (box,
    thread), box getting "dist" and "result", or "error"."""
    box: dict = {}

    def go():
        try:
            box["dist"] = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                           max_restarts=1, min_nodes=1)
            box["result"] = box["dist"].run(_train_on_request, ckpt, str(steplog), *args)
        except BaseException as e:  # noqa: B902 - checked by the caller
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while len(_steplog(steplog)) < n and time.monotonic() < deadline and t.is_alive():
        time.sleep(0.02)
    return box, t


def test_decommission_of_a_function_run_checkpoints_and_resumes(spark, connect_server,
                                                                 tmp_path, caplog):
    """Spark Connect and function mode at once: SIGPWR to node 1's executor JVM
    (spark.decommission.enabled on the server: Spark's Kubernetes path) while the
    function trains. The plugin creates the node's request file, every rank's
    checkpoint.requested() says so at the same step, save() checkpoints and acknowledges,
    the plugin stops the node, and attempt 1 resumes right after that step. min_nodes=1:
    the client cannot see the executors, but knows the node it lost, so attempt 1 starts
    at once on the other one rather than waiting for the replacement executor. Then the
    run grows back (issue 31 on Connect: the client's probe job, docs/protocol.md 11): once
    the standalone master's replacement registered, the probe's barrier task runs there,
    the client asks attempt 1 to checkpoint and stop, and attempt 2 runs on 2 nodes from
    the next step (0 steps lost; the server has its two executors again when it ends).
    Fails on a client without the probe: attempt 1 goes on on 1 node to its end (1200
    steps)."""
    steps, every = 1200, 5
    ckpt, steplog = str(tmp_path / "ckpt"), tmp_path / "steplog"
    before, registered = _executors(), _registered(connect_server)
    assert len(before) == 2, before
    # The server's log may trail its executors (a module run with this test alone).
    deadline = time.monotonic() + 30
    while len(registered) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        registered = _registered(connect_server)
    assert len(registered) == 2, registered
    caplog.set_level(logging.WARNING, logger="TorchDistributor")
    box, t = _train_until_step(8, ckpt, steplog, steps, every, "2", 6)
    jvm = executor_of_node(1, tsp_spark.CONNECT_MARK)
    assert jvm in before, (jvm, before, box)
    os.kill(jvm, signal.SIGPWR)
    noticed = time.time()
    # When each checkpoint is first seen complete (10 ms polls), until attempt 1's first step.
    seen: dict = {}
    while time.time() - noticed < 30 and t.is_alive():
        for c in Path(ckpt).glob("step-*/COMPLETE"):
            seen.setdefault(int(c.parent.name[5:]), time.time())
        if any(a == "1" for a, _, _ in _steplog(steplog)):
            break
        time.sleep(0.01)
    # When the server's driver registered the replacement executor (its log, 0.1 s polls).
    back = None
    while t.is_alive() and time.time() - noticed < 240:
        if back is None and _registered(connect_server) - registered:
            back = time.time()
        time.sleep(0.1)
    t.join(5)
    assert not t.is_alive() and "error" not in box, box
    log = _steplog(steplog)
    first = [s for a, s, _ in log if a == "0"]
    second = [s for a, s, _ in log if a == "1"]
    third = [s for a, s, _ in log if a == "2"]
    # The checkpoint on request is attempt 0's last step; attempt 1 starts right after it,
    # attempt 2 right after attempt 1's last (checkpointed on the grow request): 0 steps
    # lost, none repeated or skipped.
    ckpt_step, last1 = first[-1], second[-1]
    assert [a for a in dict.fromkeys(a for a, _, _ in log)] == ["0", "1", "2"], log
    assert first == list(range(ckpt_step + 1)) and second == list(range(ckpt_step + 1, last1 + 1))
    assert third == list(range(last1 + 1, last1 + 7)), log
    took = seen[ckpt_step] - noticed
    assert 0 < took <= 5.0, (took, ckpt_step, seen)
    att = box["dist"].attempts
    cause = att[0]["cause"]
    assert re.search(rf"node 1's executor is being decommissioned: step {ckpt_step} was "
                     r"checkpointed on request|Executor \d+ is decommissioned", cause), cause
    assert [a["nodes"] for a in att] == [2, 1, 2], att
    assert f"grows back to more nodes: step {last1} was checkpointed" in att[1]["cause"], att
    assert box["result"] == {"attempt": "2", "start": last1 + 1, "cause": att[1]["cause"]}, box
    asked = [w for w in _warnings(caplog) if "asking it to checkpoint and stop" in w]
    assert len(asked) == 1 and "2 slot(s) now, attempt 1 runs on 1 of 2 nodes" in asked[0], asked
    assert back is not None and att[1]["ended"] > back, (back, att)
    restart = att[1]["started"] - noticed
    app = spark.conf.get("spark.app.id")
    assert jvmutil.plugin_stops(app, "checkpointed on request") >= 1
    assert tsp_spark.wait_gone(tsp_spark.CONNECT_MARK, TEARDOWN_S) == []
    # The server has its 2 executors: the survivor and the replacement (registered before
    # the run grew back); the decommissioned JVM exited by itself.
    deadline = time.monotonic() + 60
    while jvm in _executors() and time.monotonic() < deadline:
        time.sleep(0.1)
    after = _executors()
    assert len(after) == 2 and jvm not in after, (jvm, before, after)
    assert len(_registered(connect_server) - registered) == 1, registered
    # The client's part, from the replacement registered to attempt 1 stopped: the watch's
    # 3 s period, the probe's task on the new executor, one step, the save, the stop.
    assert att[1]["ended"] - back <= 30.0, (att, back)
    print(f"Connect, function mode: decommission notice -> checkpoint complete {took:.2f} s "
          f"(step {ckpt_step}); restart {restart:.1f} s after the notice; replacement "
          f"registered {back - noticed:.1f} s after it, attempt 1 stopped at step {last1} "
          f"{att[1]['ended'] - back:.1f} s after that (grown back, 0 steps lost); "
          f"attempt 0's cause: {cause}")


def test_sigkill_of_an_executor_goes_on_with_the_survivors(spark, connect_server, tmp_path,
                                                           caplog):
    """Issue 31 on Spark Connect: node 1's executor JVM SIGKILLed mid-training (no notice,
    no checkpoint on request). The client has no view of the executors, and the first root
    record it gets may be node 0's gloo error ("Connection reset by peer"); but its log
    server saw node 1's channel close without a goodbye (docs/protocol.md 1.7, "Nodes
    lost"), and the run controller counts that node lost: attempt 1 starts at once on the
    survivor (min_nodes=1), its cause naming node 1. Fails on a controller without the
    fact: its cause is the gloo error (attempt 1 then waits for 2 slots and runs on 2 nodes)
    or, when Spark's text came in time, only the executor's. Last
    of the module, since it kills an executor: it ends once the standalone master's
    replacement registered (the server has its 2 executors again)."""
    ckpt, steplog = str(tmp_path / "ckpt"), tmp_path / "steplog"
    before, registered = _executors(), _registered(connect_server)
    assert len(before) == 2, before
    caplog.set_level(logging.WARNING, logger="TorchDistributor")
    box, t = _train_until_step(8, ckpt, steplog, 400, 5, "1", 3)
    jvm = executor_of_node(1, tsp_spark.CONNECT_MARK)
    assert jvm in before, (jvm, before, box)
    os.kill(jvm, signal.SIGKILL)
    t.join(120)
    assert not t.is_alive() and "error" not in box, box
    att = box["dist"].attempts
    assert [a["nodes"] for a in att] == [2, 1] and att[0]["lost_nodes"] == [1], att
    # What the log server saw, with Spark's text of the executor when it came in time.
    assert re.match(r"node 1 was lost: (its executor or host went away|executor \d+ "
                    r"exited .*ExecutorLostFailure)", att[0]["cause"]), att
    assert box["result"]["cause"] == att[0]["cause"], box
    restarted = [w for w in _warnings(caplog) if "restarting as attempt 1" in w]
    assert len(restarted) == 1 and "on 1 of 2 nodes (min_nodes=1)" in restarted[0], restarted
    assert tsp_spark.wait_gone(tsp_spark.CONNECT_MARK, TEARDOWN_S) == []
    # The standalone master replaces the killed executor: the server has 2 again.
    deadline = time.monotonic() + 90
    while (len(_executors()) < 2 or not _registered(connect_server) - registered) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_executors()) == 2 and jvm not in _executors(), (jvm, before, _executors())
