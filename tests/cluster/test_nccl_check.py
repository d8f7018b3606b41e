"""The NCCL preflight on the namespace cluster (docs/gpu.md, design C1): two worker hosts, each
with one fake GPU (Spark's discovery script) and the tests' stub CUDA driver and NCCL (the
host has no GPU). In one Spark application:

1. the check passes on both hosts, bootstrapped over the network through NCCL_COMM_ID on the
   election's second port (record key nccl_port), then training runs;
2. the stub NCCL fails every rank of one host only (its worker daemon's environment, which
   its executors inherit): run() raises naming that host within a few seconds, long before
   the other host's 30 s check deadline (the driver stops it), training never starts, and no
   agent, check process or training process is left on any host.
"""

import json
import time
from pathlib import Path

from tests.helpers.cluster_harness import finish_driver, start_driver, wait_no_training_processes, write_config

from tests.helpers import netns_cluster as nc

STUBS = nc.ROOT / "build" / "tests" / "unit"
VICTIM = "worker2"
START_TIMEOUT = 300  # driver and executors up, then both runs
FAIL_FAST_BOUND = 10  # goal 2 s (design C1/F7); generous for a loaded 2-core CI machine
CLEANUP_BOUND = 10


def test_nccl_check_failing_on_one_host_is_raised_fast_naming_it(make_cluster, tmp_path,
                                                                   record_property):
    for lib in ("libcuda_stub.so", "libnccl_stub.so"):
        assert (STUBS / lib).exists(), f"build the native tree first ({lib})"
    fail_file = str(tmp_path / "nccl-fail")
    # Only the victim host's daemon (hence its executor, agent and check processes) knows the
    # failure file: the stub fails every rank there once the file exists.
    c = make_cluster(workers=2, gpus=1, worker_env={VICTIM: {"STUB_NCCL_FAIL_FILE": fail_file}})
    conf = {
        "spark.executor.resource.gpu.amount": "1",
        "spark.task.resource.gpu.amount": "1",
        "spark.torchspark.ncclCheck": "true",
        "spark.torchspark.ncclCheck.timeout": "30s",
        "spark.executorEnv.TORCHSPARK_LIBCUDA": str(STUBS / "libcuda_stub.so"),
        "spark.executorEnv.STUB_CUDA_DEVICES": "0000:3b:00.0",
        "spark.executorEnv.TORCHSPARK_NCCL_LIB": str(STUBS / "libnccl_stub.so"),
        "spark.executorEnv.TORCHSPARK_LIBNVML": "/nonexistent/libnvidia-ml.so.1",
    }
    train = {"steps": 1, "sleep": 0.0}
    runs = [{"tag": "pass", "num_processes": 2, "use_gpu": True, "train": train},
            {"tag": "fail", "num_processes": 2, "use_gpu": True, "train": train,
             "files_before": {fail_file: "*:2:NET/Socket : No usable listening interface found\n"}}]
    cfg = write_config(c, "torchspark", runs, conf=conf, tag="nccl")
    t0 = time.monotonic()
    r = finish_driver(cfg, start_driver(c, cfg), t0, START_TIMEOUT)
    left = wait_no_training_processes(c, CLEANUP_BOUND)

    ok = r.result("pass")
    assert ok["ok"], ok["error"]
    passed = [ln for ln in r.output.splitlines() if "torchspark: NCCL check passed in " in ln]
    assert len(passed) == 2, r.output[-4000:]
    assert {"tsp-worker1", "tsp-worker2"} == {ln.split(" on ", 1)[1].split(":")[0]
                                              for ln in passed}, passed
    assert all("ranks " in ln and " of 2, NCCL 2.30.7 (" in ln and "interface net0" in ln
               for ln in passed), passed

    res = r.result("fail")
    victim = c.hosts[VICTIM].name
    assert not res["ok"] and res["error"], res
    assert "torchspark: NCCL check failed before training: rank " in res["error"], res["error"]
    assert f"(host {victim}, local rank 0, GPU 0000:3b:00.0) could not join the communicator " \
           "of 2 ranks" in res["error"], res["error"]
    assert f"NCCL found no usable interface on {victim}" in res["error"], res["error"]
    failed_at = float(Path(fail_file + ".stamp").read_text())
    latency = res["raised_at"] - failed_at
    observed = {"raised_after_failure_s": round(latency, 3), "run_s": round(res["elapsed"], 2),
                "left": [(x["host"], x["cmdline"][:100]) for x in left]}
    record_property("observed", json.dumps(observed))
    print("OBSERVED " + json.dumps(observed))
    assert 0 <= latency < FAIL_FAST_BOUND, f"raised {latency:.2f} s after the failure"
    assert "TSPLOG run=fail" not in r.output  # training never started
    assert not left, f"left running: {left}"
