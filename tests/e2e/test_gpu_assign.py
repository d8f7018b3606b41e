"""GPU assignment end to end (docs/gpu.md, rules R0-R8): PySpark passes Spark's raw
addresses to each agent as --gpus; the agent assigns them against the executor's own
CUDA_VISIBLE_DEVICES, resolves them with NVML (a stub NVML per executor here, the host has
no GPU) and the workers (gloo on CPU) get the mask, or the user gets the rule's message.

One local-cluster[2,1,1024] session whose discovery scripts report UUIDs under an executor
mask already narrowed to them (R3, the spark-rapids case that stock accepts). Ordinals, an
empty mask (R2) and the local master's slices run on local[2] in test_distributor_api.py
(a second local-cluster would cost a minute on the 2-core CI machine)."""
import os
import sys

import pytest
from pyspark import cloudpickle

import tsp_spark
from torchspark import TorchDistributor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STUB_NVML = tsp_spark.ROOT / "build" / "tests" / "unit" / "libnvml_stub.so"
UA = "GPU-aaaa1111-0000-0000-0000-000000000001"
UB = "GPU-bbbb2222-0000-0000-0000-000000000002"
DEVICES = (f"{UA}@00000000:3B:00.0@Stub H100@0@0;"
           f"{UB}@00000000:5E:00.0@Stub H100@0@0")


def _session(tmp_path_factory, addresses, executor_env):
    script = tsp_spark.fake_gpu_script(tmp_path_factory.mktemp("gpu"), addresses)
    conf = {
        "spark.worker.resource.gpu.amount": str(len(addresses)),
        "spark.worker.resource.gpu.discoveryScript": script,
        "spark.executor.resource.gpu.amount": str(len(addresses)),
        "spark.task.resource.gpu.amount": str(len(addresses)),
        "spark.executorEnv.TORCHSPARK_LIBNVML": str(STUB_NVML),
        "spark.executorEnv.STUB_NVML_DEVICES": DEVICES,
    }
    for k, v in executor_env.items():
        conf[f"spark.executorEnv.{k}"] = v
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


def test_uuid_addresses_under_a_narrowed_mask_reach_the_workers(uuid_narrowed):
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    assert d.num_tasks == 2
    ranks = d.run(_masks)
    assert [r[0] for r in ranks] == ["0", "1", "2", "3"]
    assert [r[1] for r in ranks] == ["0", "1", "0", "1"]
    assert {r[2] for r in ranks} == {f"{UB},{UA}"}
    assert {r[3] for r in ranks} == {None}  # UUIDs need no device order


def test_uuid_addresses_in_a_cpu_run_hide_the_gpus(uuid_narrowed):
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert {r[2] for r in d.run(_masks)} == {""}
