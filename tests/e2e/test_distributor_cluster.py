"""torchspark.TorchDistributor on a real multi-executor Spark: local-cluster[2,2,1024]
whose workers each have 2 fake GPUs, every task holding 2 of them (so a task owns a whole
executor). Real gloo DDP compared with torchrun, GPU assignment, results, script mode,
failures, cancellation and concurrent runs."""
import logging
import os
import runpy
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch
from pyspark import cloudpickle
from pyspark.ml.torch.distributor import TorchDistributor as StockDistributor

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError

cloudpickle.register_pickle_by_value(sys.modules[__name__])
MARK_VALUE = uuid.uuid4().hex
DDP_SCRIPT = str(tsp_spark.EXAMPLES / "ddp_train.py")
# No process of the job may be alive this long after run() raised (issue 4): the failing
# agent reports its root cause over the log channel and the driver's server sends STOP to
# every other agent at once (docs/protocol.md 1.7), without waiting for Spark's kill path.
SPARK_TEARDOWN_S = 2


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    gpus = tsp_spark.fake_gpu_script(tmp_path_factory.mktemp("gpu"), ["0", "1"])
    # Its own: 2-core executors with fake GPUs, fixed when the context starts.
    s = tsp_spark.session("local-cluster[2,2,1024]", {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": gpus,
        "spark.executor.resource.gpu.amount": "2",
        "spark.task.resource.gpu.amount": "2",
        "spark.driver.memory": "2g",
        f"spark.executorEnv.{tsp_spark.MARK}": MARK_VALUE,
        # Fake GPUs: no CUDA driver or NCCL to check. The NCCL check, on by default for a
        # GPU job of more than one node, runs on the stubs in test_gpu_assign.py.
        "spark.torchspark.ncclCheck": "false",
    })
    _first_task_failure(s)
    yield s
    s.stop()


def _first_task_failure(s):
    """Spark's first failed task in a fresh application takes it seconds once (2.5-4.6 s
    measured at load ~17 on this 2-core machine, with a plain PySpark barrier job as with
    torchspark's, with or without the driver's rendezvous; a second failure: 0.1-0.4 s),
    longer than torchspark's grace for Spark's own abort (_job.SPARK_GRACE_S), which the
    failure tests below see as the exception's cause. Paid here, once, on every executor,
    by a plain failing barrier job: the tests then time torchspark, not that."""
    def fail(_):
        raise ValueError("the session's first task failure")

    with pytest.raises(Exception, match="first task failure"):
        s.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(fail).collect()


def torchrun_state(tmp_path, nproc, steps):
    """The reference: the same training under stock torchrun. Stock's own gloo exit race
    (docs/cli.md) can SIGABRT a torchrun worker at exit; such a reference run is tried
    again (up to 3 attempts), never the run under test."""
    out = tmp_path / "torchrun.pt"
    for _ in range(3):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={nproc}", DDP_SCRIPT, "--steps", str(steps),
                            "--save", str(out)], capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            return torch.load(out)
    raise AssertionError(f"stock torchrun failed 3 times (exit {r.returncode}):\n{r.stderr[-4000:]}")


def _ddp_fn(steps, save):
    sys.argv = ["ddp_train.py", "--steps", str(steps), "--save", save]
    runpy.run_path(DDP_SCRIPT, run_name="__main__")
    import torch
    if os.environ["RANK"] != "0":
        return None
    return {k: v.tolist() for k, v in torch.load(save).items()}


def assert_same_state(ours, ref):
    assert set(ours) == set(ref)
    for k in ref:
        assert torch.equal(torch.as_tensor(ours[k]), ref[k]), k


def test_ddp_two_executors_one_process_each_equals_torchrun(spark, tmp_path):
    ref = torchrun_state(tmp_path, 2, 20)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    state = d.run(_ddp_fn, 20, str(tmp_path / "fn.pt"))
    assert_same_state(state, ref)
    # Script mode, same training: rank 0 saves its state dict.
    assert d.run(DDP_SCRIPT, "--steps", 20, "--save", tmp_path / "script.pt") is None
    assert_same_state(torch.load(tmp_path / "script.pt"), ref)


def _topology():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    mine = {k: os.environ.get(k) for k in keys}
    with open(f"/proc/{os.getppid()}/comm") as f:
        mine["parent"] = f.read().strip()
    mine["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    # No destroy_process_group() here: a torch < 2.8 deadlock (test_distributor_api.py's
    # _mask_of_each_rank).
    return everyone


def test_gpu_tasks_run_one_process_per_gpu(spark):
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    assert d.num_tasks == 2
    ranks = d.run(_topology)
    assert [r["RANK"] for r in ranks] == ["0", "1", "2", "3"]
    assert [r["LOCAL_RANK"] for r in ranks] == ["0", "1", "0", "1"]
    assert [r["GROUP_RANK"] for r in ranks] == ["0", "0", "1", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"4"}
    assert {r["CUDA_VISIBLE_DEVICES"] for r in ranks} == {"0,1"}  # the task's GPUs
    master = ranks[0]["MASTER_ADDR"]
    assert master and not master.startswith("127.")  # reachable by other hosts
    from torchspark.native._lib import json_call
    ifname = json_call("tsp_elect_call", {"op": "ifname_of", "addr": master})["ifname"]
    assert {r["GLOO_SOCKET_IFNAME"] for r in ranks} == {ifname}
    assert {r["NCCL_SOCKET_IFNAME"] for r in ranks} == {ifname}
    # Two processes per task, forked from their executor's warm pool, which was started
    # with torchrun's OMP_NUM_THREADS=1 for more than one process per node.
    assert {r["parent"] for r in ranks} == {"tsp-warm-pool"}
    assert {r["OMP_NUM_THREADS"] for r in ranks} == {"1"}


def test_one_executor_two_processes_equals_torchrun(spark, tmp_path):
    ref = torchrun_state(tmp_path, 2, 20)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    assert d.num_tasks == 1
    assert_same_state(d.run(_ddp_fn, 20, str(tmp_path / "fn.pt")), ref)


def _big(n):
    return os.urandom(16) * (n // 16)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "TorchDistributor" and r.levelname == "WARNING"]


def test_results_small_and_300mb(spark, caplog):
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.run(lambda: "y" * (28 * 1024)) == "y" * (28 * 1024)
    # 300 MB is over what the collect() path could carry in these 1 GiB executors.
    big = d.run(_big, 300 * 1024 * 1024)
    assert len(big) == 300 * 1024 * 1024 and big[:16] * (len(big) // 16) == big
    assert _warnings(caplog) == []  # the channel was used: no fallback


def test_without_the_channel_results_fall_back_to_collect_with_a_warning(spark, caplog,
                                                                         monkeypatch):
    from torchspark import distributor
    def no_server(*args, **kwargs):
        raise OSError("cannot listen (simulated)")

    monkeypatch.setattr(distributor._native, "LogServer", no_server)  # the channel cannot start
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.run(lambda: "z" * (28 * 1024)) == "z" * (28 * 1024)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "collect()" in warned[0], warned


def test_a_node_works_in_the_executors_local_root_and_removes_it(spark):
    """A node's work directory lives in the executor's local root (SPARK_LOCAL_DIRS' parent,
    removed by Spark with the application), not in /tmp: an executor killed before the
    task's cleanup leaves nothing behind; after a run it is gone (_task.work_root)."""
    req = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        lambda: os.environ["TORCHSPARK_CHECKPOINT_REQUEST"])
    workdir = os.path.dirname(req)
    assert "/executor-" in workdir and os.path.basename(workdir).startswith("torchspark-"), req
    assert not os.path.exists(workdir), workdir


def test_refused_output_falls_back_to_collect_from_the_agents_status(spark, caplog,
                                                                     monkeypatch):
    """The channel works but the driver refuses rank 0's output (it was never told to expect
    one): the agent's status says "failed", and the task, reading it, sends the result
    through collect() (docs/cli.md --output-file)."""
    from torchspark.native import _native
    monkeypatch.setattr(_native.LogServer, "expect_output", lambda self, path=None: None)
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.run(lambda: "w" * (28 * 1024)) == "w" * (28 * 1024)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "came through collect() instead" in warned[0], warned


def test_no_driver_gpu_message_matches_stock(spark):
    with pytest.raises(RuntimeError) as stock:
        StockDistributor(num_processes=1, local_mode=True, use_gpu=True)
    with pytest.raises(RuntimeError) as ours:
        TorchDistributor(num_processes=1, local_mode=True, use_gpu=True)
    assert str(ours.value) == str(stock.value) == "GPUs were unable to be found on the driver."


def _failing(how, stamp):
    import signal
    import sys
    import time
    if os.environ["RANK"] == "1":
        print(f"rank one going down by {how}", flush=True)
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        if how == "raise":
            raise RuntimeError("boom from rank one")
        if how == "exit3":
            sys.exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


@pytest.mark.parametrize("how,expect", [
    ("raise", "exited with code 1"), ("exit3", "exited with code 3"),
    ("sigkill", "was killed by SIGKILL (9)")])
def test_rank_failure_raises_fast_and_leaves_nothing(spark, tmp_path, how, expect):
    stamp = str(tmp_path / "stamp")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_failing, how, stamp)
    raised = time.time()
    assert raised - float(open(stamp).read()) < 5
    msg = str(e.value)
    assert "rank 1 (node 1, local rank 0)" in msg and expect in msg, msg
    assert f"rank one going down by {how}" in msg
    if how == "raise":
        assert "RuntimeError: boom from rank one" in msg
    assert "Could not recover from a failed barrier ResultStage" in str(e.value.__cause__)
    assert tsp_spark.wait_gone(MARK_VALUE, SPARK_TEARDOWN_S) == []


def test_failing_script_raises(spark, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import os, sys, time\nprint('script rank', os.environ['RANK'], flush=True)\n"
                      "sys.exit(3) if os.environ['RANK'] == '0' else time.sleep(60)\n")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    t0 = time.time()
    with pytest.raises(TorchDistributorError, match="rank 0 .*exited with code 3"):
        d.run(str(script))
    assert time.time() - t0 < 60
    assert tsp_spark.wait_gone(MARK_VALUE, SPARK_TEARDOWN_S) == []


def test_chained_traceback_of_a_record_worker_in_the_exception(spark):
    # A real torch @record worker (rank 1) raises RuntimeError from ValueError: the whole
    # chain reaches TorchDistributorError, the root ValueError included (docs/cli.md).
    script = os.path.join(os.path.dirname(__file__), "agent_scripts", "chained_error.py")
    tag = uuid.uuid4().hex[:8]
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run(script, "chain", tag)
    msg = str(e.value)
    assert msg.index(f"ValueError: root-{tag}") < msg.index(
        "The above exception was the direct cause") < msg.index(f"RuntimeError: outer-{tag}"), msg
    assert e.value.rank == 1 and e.value.exitcode == 1, e.value.report
    assert e.value.error_message == f"RuntimeError: outer-{tag}"
    assert f"ValueError: root-{tag}" in e.value.traceback
    assert tsp_spark.wait_gone(MARK_VALUE, SPARK_TEARDOWN_S) == []


def _sleepy(started):
    import os
    import time
    open(os.path.join(started, os.environ["RANK"]), "w").close()
    time.sleep(120)


def test_cancel_all_jobs_kills_training_within_5s(spark, tmp_path):
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    errors = []
    t = threading.Thread(target=lambda: errors.append((_catch(d.run, _sleepy, str(tmp_path)),
                                                       time.monotonic())))
    t.start()
    # Cancelled while both ranks train (each wrote its file): 4 marked processes alone were
    # the 2 agents and their 2 sentinels, before any worker, and a cancel then, while the
    # agents still start, left them to Spark's kill of the task (about 4 s later).
    deadline = time.monotonic() + 120
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline and t.is_alive():
        time.sleep(0.05)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["0", "1"], errors
    cancelled = time.monotonic()
    spark.sparkContext.cancelAllJobs()
    left = tsp_spark.wait_gone(MARK_VALUE, 5)
    took = time.monotonic() - cancelled
    t.join(60)
    # A cancelled job has no node to wait for: its agents are stopped at once (before, the
    # driver waited 2 s for a lost node that cannot come, _job._await_fact: run() raised
    # after 2.1 s), and run() raises well before the 2 s Spark gives a killed task's worker.
    print(f"cancelAllJobs: run() raised after {errors[0][1] - cancelled:.2f}s, processes gone "
          f"after {took:.2f}s")
    assert left == [], f"still alive {took:.1f}s after cancelAllJobs: {left}"
    assert errors and isinstance(errors[0][0], TorchDistributorError)
    assert errors[0][1] - cancelled < 1.5, errors[0][1] - cancelled


def _catch(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        return e
    return None


def _rank0_port():
    return int(os.environ["MASTER_PORT"])


def test_two_concurrent_runs_both_succeed(spark):
    results = [None, None]

    def go(i):
        d = TorchDistributor(num_processes=1, local_mode=False, use_gpu=False)
        try:
            results[i] = d.run(_rank0_port)
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert all(isinstance(r, int) for r in results), results
    assert results[0] != results[1]


def test_classic_through_map_in_arrow_as_connect_does(spark, monkeypatch):
    """The DataFrame.mapInArrow(barrier=True) path that Connect and input DataFrames use,
    on this classic session: a result as collected rows, and a failure's root cause."""
    from torchspark import distributor
    from torchspark.driver import _job
    monkeypatch.setattr(_job, "CLASSIC_VIA_ARROW", True)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    n = 9 * 1024 * 1024 + 16
    with monkeypatch.context() as m:  # no channel: the result comes back as rows
        def no_server(*args, **kwargs):
            raise OSError("cannot listen (simulated)")

        m.setattr(distributor._native, "LogServer", no_server)
        big = d.run(_big, n)
    assert len(big) == n and big[:16] * (n // 16) == big
    with pytest.raises(TorchDistributorError, match="rank 1 .*exited with code 3"):
        d.run(_failing, "exit3", "/dev/null")
    assert tsp_spark.wait_gone(MARK_VALUE, SPARK_TEARDOWN_S) == []
