"""GPU assignment end to end (docs/gpu.md, rules R0-R8): PySpark passes Spark's raw
addresses to each agent as --gpus; the agent assigns them against the executor's own
CUDA_VISIBLE_DEVICES, resolves them with NVML (a stub NVML per executor here, the host has
no GPU) and the workers (gloo on CPU) get the mask, or the user gets the rule's message.

One local-cluster[2,1,1024] session whose discovery scripts report UUIDs under an executor
mask already narrowed to them (R3, the spark-rapids case that stock accepts). Ordinals, an
empty mask (R2) and the local master's slices run on local[2] in test_distributor_api.py
(a second local-cluster would cost a minute on the 2-core CI machine).

The NCCL preflight runs on the stub CUDA driver and NCCL: it passes on its own port (the
election's nccl_port) with one driver warning for node 1's differing NCCL settings, a
failing node is raised fast, and a node that starts too late is named as never reported.
One node's environment differs through a site wrapper in front of the agent
(TORCHSPARK_RUN), as a host whose scheduler sets NCCL variables of its own would:
spark.executorEnv is the same for every executor."""
import ctypes
import os
import socket
import sys
import time
import uuid

import pytest
from pyspark import cloudpickle

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STUBS = tsp_spark.ROOT / "build" / "tests" / "unit"
STUB_NVML = STUBS / "libnvml_stub.so"
UA = "GPU-aaaa1111-0000-0000-0000-000000000001"
UB = "GPU-bbbb2222-0000-0000-0000-000000000002"
MARK_VALUE = uuid.uuid4().hex
FAIL_FILE = f"/tmp/tsp-gpu-e2e-{MARK_VALUE}.fail"
DEVICES = (f"{UA}@00000000:3B:00.0@Stub H100@0@0;"
           f"{UB}@00000000:5E:00.0@Stub H100@0@0")


NODE_ENV = f"/tmp/tsp-gpu-e2e-{MARK_VALUE}.env"  # NODE_ENV.<node rank>: that node's own


def _agent_wrapper(directory):
    """A site's wrapper in front of the agent (TORCHSPARK_RUN), as clusters put in front of
    their launchers: it records its command line and sources NODE_ENV.<its node rank> when
    that file exists, so one node's agent (and its workers) gets its own NCCL settings, as
    a host whose scheduler set NCCL_IB_GID_INDEX differently would."""
    from torchspark.native._lib import agent_path
    path = directory / "agent-wrapper.sh"
    path.write_text(
        "#!/bin/sh\n"
        "node=\n"
        'for a in "$@"; do case "$a" in --node-rank=*) node=${a#--node-rank=};; esac; done\n'
        f'echo "$@" > "{NODE_ENV}.$node.argv"\n'
        f'if [ -f "{NODE_ENV}.$node" ]; then . "{NODE_ENV}.$node"; fi\n'
        f'exec "{agent_path()}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def _session(tmp_path_factory, addresses, executor_env):
    d = tmp_path_factory.mktemp("gpu")
    script = tsp_spark.fake_gpu_script(d, addresses)
    conf = {
        "spark.executorEnv.TORCHSPARK_RUN": _agent_wrapper(d),
        "spark.executorEnv.NCCL_IB_GID_INDEX": "3",
        "spark.worker.resource.gpu.amount": str(len(addresses)),
        "spark.worker.resource.gpu.discoveryScript": script,
        "spark.executor.resource.gpu.amount": str(len(addresses)),
        "spark.task.resource.gpu.amount": str(len(addresses)),
        "spark.executorEnv.TORCHSPARK_LIBNVML": str(STUB_NVML),
        "spark.executorEnv.STUB_NVML_DEVICES": DEVICES,
        # For the NCCL preflight: the stub driver and NCCL (both executors are this host).
        "spark.executorEnv.TORCHSPARK_LIBCUDA": str(STUBS / "libcuda_stub.so"),
        "spark.executorEnv.STUB_CUDA_DEVICES": "0000:3b:00.0,0000:5e:00.0",
        "spark.executorEnv.STUB_CUDA_UUIDS": f"{UA},{UB}",
        "spark.executorEnv.TORCHSPARK_NCCL_LIB": str(STUBS / "libnccl_stub.so"),
        "spark.executorEnv.STUB_NCCL_HOST": "@agent",  # each executor its own "host"
        "spark.executorEnv.STUB_NCCL_FAIL_FILE": FAIL_FILE,
        f"spark.executorEnv.{tsp_spark.MARK}": MARK_VALUE,
    }
    for k, v in executor_env.items():
        conf[f"spark.executorEnv.{k}"] = v
    # One per fixture: the GPUs and the executors' environment are fixed when a context starts.
    return tsp_spark.session("local-cluster[2,1,1024]", conf)


def _masks():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    mine = (os.environ.get("RANK"), os.environ.get("LOCAL_RANK"),
            os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    dist.destroy_process_group()
    return everyone


@pytest.fixture(scope="module")
def uuid_narrowed(tmp_path_factory):
    assert STUB_NVML.exists(), "build the native tree first (cmake --build build)"
    # The executor's mask lists the task's GPUs in another order: equal as sets (R3), so
    # the workers get it unchanged; stock PySpark would return early with the same mask.
    s = _session(tmp_path_factory, [UA, UB], {"CUDA_VISIBLE_DEVICES": f"{UB},{UA}"})
    yield s
    s.stop()


def _agent_argvs():
    """Each node's agent command line of the last run (recorded by the site wrapper), then
    removed."""
    argvs = []
    for n in (0, 1):
        path = f"{NODE_ENV}.{n}.argv"
        with open(path) as f:
            argvs.append(f.read().split())
        os.unlink(path)
    return argvs


def test_uuid_addresses_under_a_narrowed_mask_reach_the_workers(uuid_narrowed, capfd):
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    assert d.num_tasks == 2
    ranks = d.run(_masks)
    assert [r[0] for r in ranks] == ["0", "1", "2", "3"]
    assert [r[1] for r in ranks] == ["0", "1", "0", "1"]
    assert {r[2] for r in ranks} == {f"{UB},{UA}"}
    assert {r[3] for r in ranks} == {None}  # UUIDs need no device order
    # No spark.torchspark.ncclCheck: a GPU job of two nodes gets the NCCL check by default
    # (docs/gpu.md), with the default deadline, and it ran on both nodes.
    for argv in _agent_argvs():
        assert "--nccl-check=180" in argv, argv
    passed = [ln for ln in capfd.readouterr().err.splitlines()
              if "torchspark: NCCL check passed in " in ln]
    assert len(passed) == 2, passed


def test_the_default_nccl_check_is_turned_off_by_the_conf(uuid_narrowed, capfd):
    uuid_narrowed.conf.set("spark.torchspark.ncclCheck", "false")
    try:
        d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
        assert {r[2] for r in d.run(_masks)} == {f"{UB},{UA}"}
    finally:
        uuid_narrowed.conf.unset("spark.torchspark.ncclCheck")
    for argv in _agent_argvs():
        assert not [a for a in argv if a.startswith("--nccl-check")], argv
    assert "NCCL check" not in capfd.readouterr().err


def _from_where():
    import torch
    import torch.distributed as dist
    mine = {"rank": os.environ["RANK"], "mask": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_initialized": torch.cuda.is_initialized(),
            "bad_fork": torch.cuda._is_in_bad_fork()}
    with open(f"/proc/{os.getppid()}/comm") as f:
        mine["parent"] = f.read().strip()
    dist.init_process_group("gloo")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    dist.destroy_process_group()
    return everyone


def test_gpu_function_runs_fork_from_the_warm_pool_and_end(uuid_narrowed, capfd):
    """Issue 18: on an H200 a GPU function-mode run through the warm pool never ended (the
    agent lost its shim's exit to the CUDA driver's thread). Here the stub NVML and CUDA
    start such a thread too; every run must end promptly, with every rank forked from its
    executor's pool, CUDA not initialized there, and no fallback."""
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    for _ in range(3):
        t0 = time.monotonic()
        ranks = d.run(_from_where)
        took = time.monotonic() - t0
        assert took < 60, f"a GPU function run took {took:.1f} s"
        assert [r["rank"] for r in ranks] == ["0", "1", "2", "3"]
        assert {r["mask"] for r in ranks} == {f"{UB},{UA}"}
        assert {r["parent"] for r in ranks} == {"tsp-warm-pool"}, ranks
        assert {(r["cuda_initialized"], r["bad_fork"]) for r in ranks} == {(False, False)}
    assert "did not start this worker" not in capfd.readouterr().err


def test_uuid_addresses_in_a_cpu_run_hide_the_gpus(uuid_narrowed):
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert {r[2] for r in d.run(_masks)} == {""}
    for argv in _agent_argvs():  # no GPUs: no check
        assert not [a for a in argv if a.startswith("--nccl-check")], argv


def _train(stamp):
    with open(stamp, "a") as f:
        f.write("trained\n")
    return "trained"


@pytest.fixture
def nccl_check(uuid_narrowed, tmp_path):
    uuid_narrowed.conf.set("spark.torchspark.ncclCheck", "true")
    uuid_narrowed.conf.set("spark.torchspark.ncclCheck.timeout", "30s")
    if os.path.exists(FAIL_FILE):
        os.unlink(FAIL_FILE)
    yield str(tmp_path / "trained")
    uuid_narrowed.conf.unset("spark.torchspark.ncclCheck")
    uuid_narrowed.conf.unset("spark.torchspark.ncclCheck.timeout")
    for p in (FAIL_FILE, FAIL_FILE + ".stamp", NODE_ENV + ".1", NODE_ENV + ".0.argv",
              NODE_ENV + ".1.argv"):
        if os.path.exists(p):
            os.unlink(p)


def test_nccl_preflight_passes_then_trains_and_each_node_says_so(nccl_check, capfd):
    # Node 1's agent environment says NCCL_IB_GID_INDEX=5 and NCCL_DEBUG=INFO (its site
    # wrapper); node 0 has the executors' 3 and no NCCL_DEBUG. The check still passes (the
    # stub NCCL ignores both): the run goes on, with one warning on the driver.
    with open(NODE_ENV + ".1", "w") as f:
        f.write("export NCCL_IB_GID_INDEX=5 NCCL_DEBUG=INFO\n")
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    assert d.run(_train, nccl_check) == "trained"
    err = capfd.readouterr().err
    passed = [ln for ln in err.splitlines() if "torchspark: NCCL check passed in " in ln]
    assert any("ranks 0-1 of 4, NCCL 2.30.7 (" in ln for ln in passed), err[-3000:]
    assert any("ranks 2-3 of 4, NCCL 2.30.7 (" in ln for ln in passed), err[-3000:]
    assert all("all_reduce 32 MiB float32: " in ln for ln in passed), passed
    # The check's NCCL_COMM_ID port is the election's second port (record key nccl_port),
    # beside MASTER_PORT, on both nodes.
    argvs = [open(f"{NODE_ENV}.{n}.argv").read().split() for n in (0, 1)]
    ports = [{a.split("=", 1)[0]: a.split("=", 1)[1] for a in v if a.startswith("--")
              and "=" in a} for v in argvs]
    assert ports[0]["--nccl-comm-port"] == ports[1]["--nccl-comm-port"], ports
    assert ports[0]["--nccl-comm-port"] != ports[0]["--master-port"], ports
    warnings = [ln for ln in err.splitlines() if "differ from rank 0's" in ln]
    host = socket.gethostname()
    assert warnings == [
        f"torchspark: WARNING: the NCCL settings of node 1 (host {host}) differ from rank 0's "
        f"node 0 (host {host}): NCCL_DEBUG is 'INFO' there and unset on node 0; "
        "NCCL_IB_GID_INDEX is '5' there and '3' on node 0"], err[-3000:]


def test_nccl_preflight_failure_on_one_node_is_raised_fast_and_nothing_is_left(nccl_check):
    # Node 1's first rank (global rank 2) fails at init; node 0's check processes would wait
    # for it until the 30 s deadline: the driver must stop them.
    with open(FAIL_FILE, "w") as f:
        f.write("2:2:NET/Socket : No usable listening interface found\n")
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_train, nccl_check)
    raised = time.time()
    with open(FAIL_FILE + ".stamp") as f:
        failed = float(f.read())
    text = str(e.value)
    assert "torchspark: NCCL check failed before training: rank 2 (host " in text, text
    # local rank 0 is the first entry of the executors' mask, UB (bus 5e)
    assert ("local rank 0, GPU 0000:5e:00.0) could not join the communicator of 4 ranks: "
            "ncclCommInitRankConfig returned 'unhandled system error") in text, text
    assert "NCCL found no usable interface on " in text
    assert e.value.node_rank == 1 and e.value.rank == 2 and e.value.local_rank == 0
    # Issue 29, fault A: the check's own reason and advice (the executor's driver, NCCL or
    # network, or the switch), not the training code's, and no "printed nothing".
    assert "failed: the NCCL check of rank 2 (node 1, local rank 0) on host " in text, text
    assert ("To fix it: the NCCL check failed before training started, so the training code "
            "did not run: fix the NVIDIA driver, NCCL or the network of the executor on host "
            ) in text, text
    assert "spark.torchspark.ncclCheck=false" in text, text
    assert "training code or its inputs" not in text and "printed nothing" not in text, text
    # Well before node 0's 30 s deadline: the driver stopped it (the same bound as a failing
    # rank's in test_distributor_cluster.py, doubled for the check processes' start on a
    # loaded 2-core machine; measured 5.3 s at load average 23).
    print(f"preflight failure raised {raised - failed:.2f} s after it happened")
    assert raised - failed < 10, f"raised {raised - failed:.2f} s after the failure"
    assert not os.path.exists(nccl_check)  # training never started
    assert tsp_spark.wait_gone(MARK_VALUE, 2) == []


def test_without_a_driver_the_check_is_skipped_with_one_warning_and_training_runs(
        nccl_check, capfd):
    # Issue 29, fault B: GPUs from a discovery script on a host with no NVIDIA driver at all
    # (PySpark's own test_gpu_env_via_run_distributed on a CPU machine): stock trains, and so
    # must torchspark, with one warning per node that names the missing library. The site
    # wrapper takes the stub driver away from both agents: libcuda.so.1 itself is loaded,
    # and this host has none (its CUDA toolkit and libnccl are there).
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this host has a CUDA driver")
    except OSError:
        pass
    for n in (0, 1):
        with open(f"{NODE_ENV}.{n}", "w") as f:
            f.write("unset TORCHSPARK_LIBCUDA\n")
    try:
        d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
        assert d.run(_train, nccl_check) == "trained"
    finally:
        os.unlink(NODE_ENV + ".0")
    err = capfd.readouterr().err
    skipped = [ln for ln in err.splitlines() if "NCCL check skipped on host " in ln]
    assert len(skipped) == 2, err[-3000:]  # one per node
    for ln in skipped:
        assert ("torchspark: WARNING: NCCL check skipped on host " in ln
                and ": no NVIDIA driver there (libcuda.so.1: cannot open shared object file"
                in ln and "spark.torchspark.ncclCheck=false" in ln), ln
    assert "NCCL check failed" not in err and "NCCL check passed" not in err, err[-3000:]
    with open(nccl_check) as f:
        assert f.read().split() == ["trained"] * 4  # every rank trained


def test_nccl_check_timeout_names_the_node_that_never_reported(nccl_check):
    # Node 1's agent starts 5 s late (its site wrapper sleeps): node 0's check gives up at
    # its 2 s deadline, and the driver names node 1 as never reported (no agent of it had
    # connected yet); node 1's agent, once up, is stopped at once.
    with open(NODE_ENV + ".1", "w") as f:
        f.write("sleep 5\n")
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    d.spark.conf.set("spark.torchspark.ncclCheck.timeout", "2s")
    t0 = time.monotonic()
    with pytest.raises(TorchDistributorError) as e:
        d.run(_train, nccl_check)
    took = time.monotonic() - t0
    text = str(e.value)
    assert "torchspark: NCCL check timed out after 2 s before training: rank(s) 0,1 on " in text, \
        text
    assert text.rstrip().endswith(
        "NCCL check across the job: node 1 (no agent connected from it) never reported: its "
        "check never started, so its ranks never joined and the other nodes waited until the "
        "deadline; see that node's executor's log."), text
    print(f"raised after {took:.2f} s")
    assert not os.path.exists(nccl_check)  # training never started
    assert tsp_spark.wait_gone(MARK_VALUE, 10) == []
