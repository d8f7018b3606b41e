"""Warm worker pools (torchspark/worker/_warm.py, docs/protocol.md §6): function-mode training
processes forked from a per-executor process that has torch imported.

Through TorchDistributor.run on local-cluster[2,1,1024]: the workers come from the pool,
see what a fresh interpreter would, stream their lines, fail and get cancelled as fresh
workers do; TORCHSPARK_WARM=0 and a changed environment start them fresh. Then the pool
alone, with the real agent and shim: its lifetime (anchor, idle timeout, SIGTERM), a shim
SIGKILLed, a pool killed under a running worker, and a socket directory others can use."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from pyspark import cloudpickle

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError
from torchspark.worker import _warm

cloudpickle.register_pickle_by_value(sys.modules[__name__])
MARK_VALUE = tsp_spark.SHARED_MARK
MARK_NAME = tsp_spark.MARK


@pytest.fixture(scope="module")
def spark(warm_pool_spark):
    return warm_pool_spark


def _whoami(tag):
    """What the function sees of its process."""
    import random
    import sys as _sys

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    with open(f"/proc/{os.getppid()}/comm") as f:
        parent = f.read().strip()
    print(f"warm-line {tag} rank {dist.get_rank()}", flush=True)
    out = {"parent": parent, "pid": os.getpid(), "sum": t.item(),
           "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"],
           "argv0": os.path.basename(_sys.argv[0]), "main": _sys.modules["__main__"].__name__,
           "random": random.random(), "np": float(np.random.random()),
           "unbuffered": not hasattr(_sys.stdout, "buffer") or
           not hasattr(_sys.stdout.buffer, "raw"),
           "mark": os.environ.get(MARK_NAME)}
    dist.destroy_process_group()
    return out


def _run(spark, tag, **env):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
            _whoami, tag)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_runs_fork_from_the_executors_warm_pool(spark, capfd):
    first = _run(spark, "a")
    second = _run(spark, "b")
    for r in (first, second):
        assert r["parent"] == _warm.POOL_COMM, r
        assert r["sum"] == 3.0 and r["rank"] == "0" and r["world"] == "2"
        assert r["argv0"] == "_fn_runner.py" and r["main"] == "__main__"
        assert r["mark"] == MARK_VALUE and r["unbuffered"]
    # A fresh interpreter's generators: no two runs share them.
    assert first["random"] != second["random"] and first["np"] != second["np"]
    assert first["pid"] != second["pid"]
    err = capfd.readouterr().err
    for tag in "ab":
        for rank in (0, 1):
            assert f"warm-line {tag} rank {rank}" in err


def test_local_mode_forks_from_a_pool_of_the_driver(spark):
    r = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(_whoami, "l")
    assert r["parent"] == _warm.POOL_COMM and r["sum"] == 3.0 and r["world"] == "2"


def test_without_warm_workers_the_workers_start_fresh(spark):
    r = _run(spark, "c", TORCHSPARK_WARM="0")
    assert r["parent"] == "torchspark-run" and r["sum"] == 3.0


def test_the_pool_key_is_the_environment_without_per_run_variables():
    env = {"PATH": "/bin", "A": "1"}
    key = _warm.pool_key(sys.executable, os.getpid(), env)
    same = {**env, "RANK": "1", "MASTER_PORT": "1234", "TORCHSPARK_TASK_ATTEMPT_ID": "7",
            "CUDA_VISIBLE_DEVICES": "1", "TORCHELASTIC_RUN_ID": "x",
            # a wrapper script in front of the agent (TORCHSPARK_RUN) is a shell
            "PWD": "/elsewhere", "OLDPWD": "/", "SHLVL": "2", "_": "/bin/sh",
            # train_on_dataframe's partition files differ per task
            "SPARK_PARTITION_ARROW_DATA_FILE": "/proc/1/fd/5",
            "SPARK_DATAFRAME_SCHEMA_FILE": "/proc/1/fd/6"}
    assert _warm.pool_key(sys.executable, os.getpid(), same) == key
    assert _warm.pool_key(sys.executable, os.getpid(), {**env, "A": "2"}) != key
    assert _warm.pool_key(sys.executable, os.getppid(), env) != key
    assert _warm.worker_env(env, 2)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in _warm.worker_env(env, 1)


def _fails():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("warm rank 1 fails")
    dist.barrier()


def test_a_failing_warm_worker_is_the_root_cause(spark):
    t0 = time.monotonic()
    with pytest.raises(TorchDistributorError) as e:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_fails)
    msg = str(e.value)
    assert "warm rank 1 fails" in msg and "ValueError" in msg, msg
    assert "rank 1" in msg, msg
    assert time.monotonic() - t0 < 60
    assert tsp_spark.wait_gone(MARK_VALUE, 10) == []


def _sleeps():
    import time as _t

    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("warm-sleeping", flush=True)
    _t.sleep(600)


def test_a_cancelled_run_leaves_no_warm_worker(spark):
    tag = "warm-cancel-" + uuid.uuid4().hex[:8]
    box = {}

    def run():
        spark.sparkContext.setJobGroup(tag, "warm cancel", interruptOnCancel=True)
        try:
            TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_sleeps)
        except Exception as e:  # noqa: BLE001 - the cancel's error is what is expected
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert _wait(lambda: len([p for p in tsp_spark.job_processes(MARK_VALUE)
                              if tsp_spark.warm_pool_child(p)]) == 2, 120), \
        tsp_spark.job_processes(MARK_VALUE)
    time.sleep(1)
    spark.sparkContext.cancelJobGroup(tag)
    t.join(60)
    assert "error" in box
    assert tsp_spark.wait_gone(MARK_VALUE, 10) == []


# ---- the pool alone, with the real agent and shim ----------------------------------------


def _wait(cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _fn_files(tmp_path, fn):
    fn_file = tmp_path / "fn.pickle"
    fn_file.write_bytes(cloudpickle.dumps((fn, (), {})))
    return str(fn_file), str(tmp_path / "out.pickle")


def _agent(run_bin, sock, fn_file, out_file, env):
    return subprocess.Popen(
        [str(run_bin), "--standalone", "--nproc-per-node=1", "--python", sys.executable,
         "--warm-socket", sock, "-m", "torchspark.worker._fn_runner", fn_file, out_file],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _parent_comm():
    with open(f"/proc/{os.getppid()}/comm") as f:
        return f.read().strip()


def _report_pid():
    with open(os.environ["WARM_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    import time as _t

    _t.sleep(600)


@pytest.fixture
def anchor():
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def test_the_pool_ends_with_its_anchor_and_takes_its_workers(run_bin, tmp_path, anchor):
    env = {**os.environ, "WARM_PID_FILE": str(tmp_path / "pid"), "UNIQUE": uuid.uuid4().hex}
    sock = _warm.ensure(env, 1, anchor.pid, 600, clients=os.getpid())
    assert sock and os.path.exists(sock)
    agent = _agent(run_bin, sock, *_fn_files(tmp_path, _report_pid), env)
    assert _wait(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), 60)
    worker = int((tmp_path / "pid").read_text())
    assert tsp_spark.warm_pool_child(worker), "the worker was not forked by a pool"
    anchor.kill()
    assert _wait(lambda: not os.path.exists(f"/proc/{worker}/comm")
                 or _state(worker) == "Z", 5), "the worker outlived its pool's anchor"
    assert _wait(lambda: not os.path.exists(sock), 5)
    assert agent.wait(30) != 0  # the shim died with the worker
    assert "warm worker pool ended" in agent.stdout.read()


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return "gone"


def test_an_idle_pool_ends_and_the_next_run_starts_another(run_bin, tmp_path, anchor):
    env = {**os.environ, "UNIQUE": uuid.uuid4().hex}
    sock = _warm.ensure(env, 1, anchor.pid, 1.0, clients=os.getpid())
    fn_file, out_file = _fn_files(tmp_path, _parent_comm)
    agent = _agent(run_bin, sock, fn_file, out_file, env)
    assert agent.wait(120) == 0, agent.stdout.read()
    assert cloudpickle.loads(open(out_file, "rb").read()) == _warm.POOL_COMM
    assert _wait(lambda: not os.path.exists(sock), 10), "the idle pool did not end"
    # Nothing of it is left in the pool directory (a host's executors come and go).
    base = sock[:-len(".sock")]
    assert _wait(lambda: not any(os.path.exists(base + x) for x in (".lock", ".log")), 5), \
        os.listdir(os.path.dirname(sock))
    sock2 = _warm.ensure(env, 1, anchor.pid, 1.0, clients=os.getpid())
    assert sock2 == sock and os.path.exists(sock)


def test_a_shim_killed_takes_its_worker(run_bin, tmp_path, anchor):
    env = {**os.environ, "WARM_PID_FILE": str(tmp_path / "pid"), "UNIQUE": uuid.uuid4().hex}
    sock = _warm.ensure(env, 1, anchor.pid, 600, clients=os.getpid())
    agent = _agent(run_bin, sock, *_fn_files(tmp_path, _report_pid), env)
    assert _wait(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), 60)
    worker = int((tmp_path / "pid").read_text())
    agent.send_signal(signal.SIGKILL)  # the shim has a parent-death SIGKILL
    agent.wait(10)
    assert _wait(lambda: _state(worker) in ("gone", "Z"), 5), "the worker outlived its shim"


def test_a_pool_refusing_the_environment_means_a_fresh_worker(run_bin, tmp_path, anchor):
    env = {**os.environ, "UNIQUE": uuid.uuid4().hex}
    sock = _warm.ensure(env, 1, anchor.pid, 600, clients=os.getpid())
    fn_file, out_file = _fn_files(tmp_path, _parent_comm)
    agent = _agent(run_bin, sock, fn_file, out_file, {**env, "UNIQUE": "other"})
    assert agent.wait(120) == 0, agent.stdout.read()
    assert cloudpickle.loads(open(out_file, "rb").read()) == "torchspark-run"


# ---- other processes of the same user (docs/security.md, "The executor host") -------------

_REQUEST = r"""
import os, socket, struct, sys, time
sock, boot, fn_file, out_file, result = sys.argv[1:6]
drip = float(os.environ.get("DRIP", "0"))
argv = [sys.executable, "-u", "-c", boot, "-m", "torchspark.worker._fn_runner", fn_file, out_file]
parts = ["/", str(len(argv)), *argv, *(f"{k}={v}" for k, v in os.environ.items())]
payload = b"".join(p.encode() + b"\0" for p in parts)
head = struct.pack(">4sIII", b"TSPW", 1, len(payload), 3)
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(sock)
if drip:
    open(result + ".connected", "w").close()
    for b in (head + payload)[:30]:  # one byte per drip, never a whole request
        try:
            c.send(bytes([b]))
        except OSError:
            break
        time.sleep(drip)
    sys.exit(0)
socket.send_fds(c, [head], [0, 1, 2])
c.sendall(payload)
tag = c.recv(1)
open(result, "w").write(tag.decode() + (c.recv(4096)[4:].decode(errors="replace") if tag else ""))
"""


def _agent_boot(run_bin):
    data = Path(run_bin).read_bytes()
    i = data.index(b"def _tsp_boot(m):")
    return data[i:data.index(b"\0", i)].decode()


def _request(env, sock, boot, fn_file, out_file, result, detach=False):
    cmd = [sys.executable, "-c", _REQUEST, sock, boot, fn_file, out_file, str(result)]
    # setsid -f: the requester's parent exits at once, so it descends from nobody of ours.
    return subprocess.Popen(["setsid", "-f", *cmd] if detach else cmd, env=env)


def _touch_marker():
    open(os.environ["MARKER"], "w").close()


def test_a_process_not_descending_from_the_agents_is_refused(run_bin, tmp_path, anchor):
    # The real bootstrap and a function file: everything a shim sends, but from a process
    # that another application's task could be (same user, not under the executor).
    env = {**os.environ, "UNIQUE": uuid.uuid4().hex, "MARKER": str(tmp_path / "ran")}
    sock = _warm.ensure(env, 1, anchor.pid, 600, clients=os.getpid())
    fn_file, out_file = _fn_files(tmp_path, _touch_marker)
    result = tmp_path / "reply"
    _request(env, sock, _agent_boot(run_bin), fn_file, out_file, result, detach=True).wait(10)
    assert _wait(lambda: result.exists() and result.read_text(), 60), "no reply"
    assert result.read_text().startswith("R") and "does not descend" in result.read_text()
    time.sleep(1)
    assert not (tmp_path / "ran").exists(), "the pool ran a stranger's request"
    # The same function through the agent, a descendant: served (the check above refused).
    agent = _agent(run_bin, sock, fn_file, out_file, env)
    assert agent.wait(120) == 0, agent.stdout.read()
    assert (tmp_path / "ran").exists()


def test_a_bootstrap_other_than_the_agents_is_refused(run_bin, tmp_path, anchor):
    env = {**os.environ, "UNIQUE": uuid.uuid4().hex}
    sock = _warm.ensure(env, 1, anchor.pid, 600, clients=os.getpid())
    marker = tmp_path / "ran"
    boot = f"open({str(marker)!r}, 'w').close()  # " + "x" * 80
    fn_file, out_file = _fn_files(tmp_path, _parent_comm)
    result = tmp_path / "reply"
    _request(env, sock, boot, fn_file, out_file, result).wait(60)
    assert result.read_text().startswith("R"), result.read_text()
    assert "BOOT is not the bootstrap of the agent's own executable" in result.read_text()
    time.sleep(1)
    assert not marker.exists(), "the pool ran a BOOT that is not the agent's"


def test_a_peer_dripping_bytes_does_not_stall_the_pool(run_bin, tmp_path, anchor):
    env = {**os.environ, "UNIQUE": uuid.uuid4().hex}
    sock = _warm.ensure(env, 1, anchor.pid, 600, clients=os.getpid())
    fn_file, out_file = _fn_files(tmp_path, _parent_comm)
    agent = _agent(run_bin, sock, fn_file, out_file, env)  # the pool is warm after this
    assert agent.wait(120) == 0, agent.stdout.read()
    os.unlink(out_file)
    t0 = time.monotonic()  # the control: a warm run with no dripper, at this host's load
    agent = _agent(run_bin, sock, fn_file, out_file, env)
    assert agent.wait(60) == 0, agent.stdout.read()
    control = time.monotonic() - t0
    result = tmp_path / "drip"
    dripper = _request({**env, "DRIP": "1"}, sock, "x", fn_file, out_file, result)
    try:
        assert _wait(lambda: Path(f"{result}.connected").exists(), 30)
        time.sleep(0.3)  # accepted first: the pool reads its request now
        os.unlink(out_file)
        t0 = time.monotonic()
        agent = _agent(run_bin, sock, fn_file, out_file, env)
        assert agent.wait(60) == 0, agent.stdout.read()
        took = time.monotonic() - t0
    finally:
        dripper.kill()
        dripper.wait()
    assert cloudpickle.loads(open(out_file, "rb").read()) == _warm.POOL_COMM
    # At most the dripper's deadline more than the control (and 2 s of this host's load).
    assert took < control + _warm.REQUEST_TIMEOUT_S + 2, (took, control)


def test_a_socket_directory_others_can_use_is_not_used(monkeypatch):
    import shutil
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="tw", dir="/tmp"))  # short: a socket's path
    d = tmp_path / f"torchspark-warm-{os.geteuid()}"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert _warm.pool_dir() is None
    assert _warm.ensure(dict(os.environ), 1, os.getpid(), 10) is None
    d.chmod(0o700)
    assert _warm.pool_dir() == str(d)
    shutil.rmtree(tmp_path)


def test_a_tmpdir_too_long_for_a_socket_path_means_tmp(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    assert _warm.pool_dir() == f"/tmp/torchspark-warm-{os.geteuid()}"


def test_the_pool_refuses_what_it_cannot_run():
    base = {"PATH": "/bin", "X": "1"}
    argv = [sys.executable, "-u", "-c", "BOOT", "-m", _warm.FN_RUNNER, "a", "b"]
    assert _warm.refusal(argv, {**base, "RANK": "3", "TORCHSPARK_Y": "z"}, base) is None
    assert "differs in X" in _warm.refusal(argv, {**base, "X": "2"}, base)
    assert "another Python" in _warm.refusal(["/bin/sh", *argv[1:]], base, base)
    assert "not a function-mode worker" in _warm.refusal(
        [sys.executable, "-u", "-c", "BOOT", "script.py"], base, base)
    assert json.dumps(_warm.stable_env({"RANK": "1", "A": "b"})) == '{"A": "b"}'


def _executor_jvm(app_id, exec_id):
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if (b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd
                and app_id.encode() in cmd
                and cmd[cmd.index(b"--executor-id") + 1] == exec_id.encode()):
            return int(pid)
    return None


def _pools_anchored_on(pid):
    found = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/comm", "rb") as f:
                if f.read().strip() != _warm.POOL_COMM.encode():
                    continue
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if str(pid).encode() in args:  # main()'s arguments: socket, fds, anchor, idle
            found.append(int(p))
    return found


def test_an_executor_stopped_mid_run_leaves_no_pool_and_no_worker(spark, request):
    """Last of the Spark tests here: the session loses an executor. SparkContext's
    killExecutor while a run's workers (forked from the pools) train: the executor JVM
    ends; its pool ends with it and takes its worker; the run fails; nothing is left."""
    request.addfinalizer(tsp_spark.discard_shared)  # the next module's cluster is whole
    sc = spark.sparkContext
    app = sc.applicationId
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", _run_catching()), daemon=True)
    t.start()
    assert _wait(lambda: len([p for p in tsp_spark.job_processes(MARK_VALUE)
                              if tsp_spark.warm_pool_child(p)]) == 2, 120)
    jvm = _executor_jvm(app, "0")
    assert jvm and _pools_anchored_on(jvm), "executor 0 has no warm pool"
    assert sc._jsc.sc().killExecutor("0")
    assert _wait(lambda: _state(jvm) in ("gone", "Z"), 60), "the executor did not end"
    assert _wait(lambda: not _pools_anchored_on(jvm), 5), "the executor's pool outlived it"
    t.join(120)
    assert isinstance(box.get("r"), Exception), box
    assert tsp_spark.wait_gone(MARK_VALUE, 15) == []


def _run_catching():
    try:
        return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_sleeps)
    except Exception as e:  # noqa: BLE001 - the lost executor's error is what is expected
        return e
