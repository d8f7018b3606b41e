"""torchspark.TorchDistributor against PySpark's own, on a local[2] Spark whose driver has
4 fake GPUs: validation errors and messages, spark.ssl.enabled (stock refuses, torchspark
goes on), input_params, logging, local mode (GPU choice, results, script mode, failures)."""
import logging
import os
import random
import sys
import time
import uuid

import pyspark
import pytest
from pyspark import cloudpickle
from pyspark.ml.torch.distributor import TorchDistributor as StockDistributor

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    gpus = tsp_spark.fake_gpu_script(tmp_path_factory.mktemp("gpu"), ["0", "1", "2", "3"])
    # Its own: the driver's 4 fake GPUs are fixed when the context starts.
    s = tsp_spark.session("local[2]", {"spark.driver.resource.gpu.amount": "4",
                                       "spark.driver.resource.gpu.discoveryScript": gpus})
    yield s
    s.stop()


@pytest.fixture
def conf(spark):
    """Sets session confs for one test and unsets them afterwards."""
    saved = {}

    def set_(key, value):
        saved.setdefault(key, spark.conf.get(key, None))
        spark.conf.set(key, value)

    yield set_
    for k, v in saved.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


@pytest.fixture
def mark(monkeypatch):
    m = uuid.uuid4().hex
    monkeypatch.setenv(tsp_spark.MARK, m)
    return m


def outcome(fn):
    try:
        d = fn()
        return ("ok", d.input_params, d.num_tasks)
    except Exception as e:  # compare type and exact text
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("kwargs,confs", [
    (dict(num_processes=2, local_mode=False, use_gpu=True), {}),  # task gpu amount unset
    (dict(num_processes=0, local_mode=False, use_gpu=False), {}),
    (dict(num_processes=-1, local_mode=True, use_gpu=False), {}),
    (dict(num_processes=3, local_mode=False, use_gpu=True), {"spark.task.resource.gpu.amount": "2"}),
    (dict(num_processes=4, local_mode=False, use_gpu=True), {"spark.task.resource.gpu.amount": "2"}),
    (dict(num_processes=2, local_mode=True, use_gpu=True), {"spark.driver.resource.gpu.amount": "0"}),
    (dict(num_processes=2, local_mode=True, use_gpu=True), {}),
    (dict(num_processes=3, local_mode=False, use_gpu=False), {}),
])
def test_construction_matches_stock(spark, conf, kwargs, confs):
    for k, v in confs.items():
        conf(k, v)
    ours, stock = outcome(lambda: TorchDistributor(**kwargs)), outcome(lambda: StockDistributor(**kwargs))
    if kwargs["num_processes"] % int(confs.get("spark.task.resource.gpu.amount", "1")) and (
            pyspark.__version__ < "4"):
        # Stock 3.5 accepts it (SPARK-41916: ceil(3 / 2) tasks for a torchrun of 3 nodes,
        # which cannot rendezvous); torchspark refuses it with Spark 4's message.
        assert stock[0] == "ok" and ours == (
            "RuntimeError", "TorchDistributor 'num_processes' value (3) must be a multiple of "
            "'spark.task.resource.gpu.amount' (2) value."), (ours, stock)
        return
    assert ours == stock


def test_too_many_local_processes_warns_like_stock(spark, caplog):
    caplog.set_level(logging.INFO)
    stock = StockDistributor(num_processes=8, local_mode=True, use_gpu=True)
    stock_msgs = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    caplog.clear()
    ours = TorchDistributor(num_processes=8, local_mode=True, use_gpu=True)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == stock_msgs
    assert stock_msgs and stock_msgs[0][0] == "TorchDistributor"
    assert ours.num_processes == stock.num_processes == 4
    assert ours.input_params == stock.input_params


def test_fractional_task_gpu_amount_is_a_clear_error(spark, conf):
    conf("spark.task.resource.gpu.amount", "0.5")
    with pytest.raises(ValueError):  # PySpark: a bare int() error
        StockDistributor(num_processes=2, local_mode=False, use_gpu=True)
    with pytest.raises(RuntimeError, match=r"'spark.task.resource.gpu.amount' is 0.5.*whole"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)


def test_bad_gpu_address_message_matches_stock():
    from tests.helpers.agentutil import gpus_owned
    with pytest.raises(ValueError) as e:
        gpus_owned(["0", "01"], None)
    assert str(e.value) == ("Found GPU addresses ['0', '01'] which are not all in the correct "
                            "format for CUDA_VISIBLE_DEVICES, which requires integers with no "
                            "zero padding.")
    assert gpus_owned(["1", "3"], "7,6,5,4") == ["6", "4"]


def _quick(x):
    return x


def test_ssl_refused_by_stock_while_torchspark_goes_on(spark, conf, caplog):
    """The session's spark.ssl.enabled as stock reads it: stock refuses; torchspark runs over
    its own TLS channel with one WARNING. (A real TLS cluster, and spark.network.crypto:
    test_spark_encryption.py.)"""
    conf("spark.ssl.enabled", "true")
    stock = StockDistributor(num_processes=1, local_mode=False, use_gpu=False)
    with pytest.raises(RuntimeError, match="This cluster has TLS encryption enabled"):
        stock._check_encryption()
    caplog.set_level(logging.INFO)
    ours = TorchDistributor(num_processes=1, local_mode=False, use_gpu=False)
    assert ours.run(_quick, 7) == 7  # distributed on the local master
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "TLS 1.3" in r.getMessage()]
    assert len(lines) == 1 and lines[0][0] == "WARNING", lines
    assert lines[0][1].startswith("Spark secures its own traffic here (spark.ssl.enabled=true); "
                                  "torchspark's own channel to the driver"), lines


def _env_of_rank0(name):
    import os
    return os.environ.get(name)


def test_local_gpu_choice_without_mask(spark, mark, monkeypatch, caplog):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    caplog.set_level(logging.INFO)
    state = random.getstate()
    d = TorchDistributor(num_processes=2, local_mode=True, use_gpu=True)
    assert d.run(_env_of_rank0, "CUDA_VISIBLE_DEVICES") == "0,1"
    assert d.run(_env_of_rank0, "LOCAL_WORLD_SIZE") == "2"
    assert random.getstate() == state  # no reseeding of the global RNG
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    msgs = [r.getMessage() for r in caplog.records if r.name == "TorchDistributor"]
    assert "Started local training with 2 processes" in msgs
    assert "Finished local training with 2 processes" in msgs


def test_local_gpu_choice_respects_existing_mask(spark, mark, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    d = TorchDistributor(num_processes=3, local_mode=True, use_gpu=True)
    assert d.run(_env_of_rank0, "CUDA_VISIBLE_DEVICES") == "4,5,6"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # restored (never changed)


def _big(n):
    return os.urandom(16) * (n // 16)


def test_local_results_small_and_300mb(spark, mark):
    d = TorchDistributor(num_processes=1, local_mode=True, use_gpu=False)
    s = d.run(lambda: "x" * (28 * 1024))
    assert s == "x" * (28 * 1024)
    big = d.run(_big, 300 * 1024 * 1024)
    assert isinstance(big, bytes) and len(big) == 300 * 1024 * 1024
    assert big[:16] * (len(big) // 16) == big


SCRIPT = """
import os, sys
with open(os.path.join(sys.argv[1], "rank%s" % os.environ["RANK"]), "w") as f:
    f.write(repr(sys.argv[2:]))
"""


def test_local_script_mode(spark, mark, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    d = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    assert d.run(str(script), str(tmp_path), 1, 2.5, "--flag") is None
    for r in (0, 1):
        assert (tmp_path / f"rank{r}").read_text() == repr(["1", "2.5", "--flag"])
    with pytest.raises(ValueError) as e:
        d.run(str(script), lr=1)
    assert str(e.value) == "Running pytorch file does not support key-word type arguments."


def _fail_on_rank1(stamp):
    import os
    import time
    if os.environ["RANK"] == "1":
        print("about to fail: the marker line", flush=True)
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        raise ValueError("boom from rank one")
    time.sleep(60)


def test_local_failure_is_one_precise_exception(spark, mark, tmp_path):
    stamp = str(tmp_path / "stamp")
    d = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_fail_on_rank1, stamp)
    raised = time.time()
    failed = float(open(stamp).read())
    assert raised - failed < 5, raised - failed
    msg = str(e.value)
    assert "rank 1" in msg and "exited with code 1" in msg and os.uname().nodename in msg
    assert "ValueError: boom from rank one" in msg  # the error file's message
    assert "about to fail: the marker line" in msg  # the rank's last output lines
    assert e.value.rank == 1 and e.value.exitcode == 1
    time.sleep(2)
    assert tsp_spark.job_processes(mark) == []


def test_local_failing_script_raises(spark, mark, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import sys\nprint('script going down')\nsys.exit(3)\n")
    d = TorchDistributor(num_processes=1, local_mode=True, use_gpu=False)
    with pytest.raises(TorchDistributorError, match="exited with code 3") as e:
        d.run(str(script))
    assert "script going down" in str(e.value)
    assert tsp_spark.wait_gone(mark, 2) == []


def _mask_of_each_rank():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, os.environ.get("CUDA_VISIBLE_DEVICES"))
    # No destroy_process_group() right after a gloo all_gather_object: before torch 2.8 it
    # can deadlock in torch itself (pytorch#154976: ~ProcessGroupGloo joins its worker
    # threads holding the GIL while a worker frees the collective's tensors, which takes
    # the GIL). Seen on torch 2.4.1 in the version matrix, and with two plain processes
    # (docs/distributor.md, supported versions). The process ends with the function.
    return everyone


def test_local_master_slices_the_driver_gpus(spark, conf, mark):
    conf("spark.task.resource.gpu.amount", "1")
    # Two tasks: the NCCL check would be on by default, and these GPUs are fake.
    conf("spark.torchspark.ncclCheck", "false")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    assert d.run(_mask_of_each_rank) == ["0", "1"]  # task i takes driver GPU i


def test_local_master_with_too_few_driver_gpus_is_an_error(spark, conf):
    conf("spark.task.resource.gpu.amount", "1")
    d = TorchDistributor(num_processes=5, local_mode=False, use_gpu=True)
    with pytest.raises(RuntimeError) as e:
        d.run(_quick, 1)
    assert str(e.value) == ("torchspark: 5 tasks \u00d7 1 GPU(s) need 5 driver GPUs, but the "
                            "driver has 4: ['0', '1', '2', '3']; lower num_processes or raise "
                            "spark.driver.resource.gpu.amount")


def test_gpu_assignment_rules_through_the_library():
    from tests.helpers.agentutil import gpus_owned
    assert gpus_owned(["1"], "1") == ["1"]  # already narrowed (R3): stock accepts it too
    assert gpus_owned(["GPU-8f2a"], None) == ["GPU-8f2a"]  # UUID prefixes (R1)
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES is set to an empty string"):
        gpus_owned(["0"], "")
    with pytest.raises(ValueError, match=r"has no 'gpu' resource from Spark"):
        gpus_owned([], None)


def test_local_empty_mask_is_an_error_not_a_cpu_run(spark, mark, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    d = TorchDistributor(num_processes=2, local_mode=True, use_gpu=True)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_env_of_rank0, "CUDA_VISIBLE_DEVICES")
    assert ("torchspark: CUDA_VISIBLE_DEVICES is set to an empty string for the executor on "
            f"host {os.uname().nodename}, which hides every GPU, but Spark gave task 0 GPU "
            "addresses ['0', '1']: unset it (spark.executorEnv.CUDA_VISIBLE_DEVICES or the "
            "executor's environment)") in str(e.value)
    assert tsp_spark.wait_gone(mark, 5) == []
