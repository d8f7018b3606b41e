"""torchspark installed on the driver only: local-cluster[2,1,1024] whose executors run a
Python that sees pyspark and torch and another version of torchspark (0.0.1; executors
without any torchspark are tested under Connect and on the namespace cluster). The
distributor ships its own
package through Spark's file distribution (one INFO line, once per session); a script
that exists only on the driver travels with the job; a script that exists nowhere, and an
executor of another platform, get one clear error."""
import logging
import os
import sys

import pytest
from pyspark import cloudpickle

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError
from torchspark.driver import _ship

cloudpickle.register_pickle_by_value(sys.modules[__name__])
MARK_VALUE = "ship-" + os.urandom(6).hex()
OTHER = "0.0.1"  # the torchspark version the executors' Python has


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    python = tsp_spark.python_without_torchspark(tmp_path_factory.mktemp("exec-venv"),
                                                other_version=OTHER)
    # Its own: the executors run another Python (PYSPARK_PYTHON, fixed per context).
    s = tsp_spark.session("local-cluster[2,1,1024]", {
        f"spark.executorEnv.{tsp_spark.MARK}": MARK_VALUE,
        # Fixed when the context starts; every result here but the one over it is small.
        "spark.driver.maxResultSize": "10m",
    }, python=python)
    s.python_for_test = python
    yield s
    s.stop()
    os.environ["PYSPARK_PYTHON"] = sys.executable


def _probe(_):
    import importlib.util
    import sys

    import torchspark
    return [(sys.executable, torchspark.__version__,
             importlib.util.find_spec("torch") is not None)]


def _allreduce():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(os.environ["RANK"]) + 1])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item(), sys.modules["torchspark"].__file__


def _shipping_lines(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "TorchDistributor" and "is not installed on the executors" in
            r.getMessage()]


def test_driver_only_install_ships_the_package_once(spark, caplog):
    probed = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_probe).collect()
    assert probed == [(spark.python_for_test, OTHER, True)] * 2  # another torchspark there
    caplog.set_level(logging.INFO)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    total, where = d.run(_allreduce)
    assert total == 3.0
    _, name = _ship.archive()
    assert f"/{name}/torchspark/" in where  # the workers imported the shipped copy
    lines = _shipping_lines(caplog)
    assert len(lines) == 1 and f"torchspark {OTHER} is installed at" in lines[0], lines
    assert spark.python_for_test in lines[0] and name in lines[0]
    assert d.run(_allreduce)[0] == 3.0  # shipped once per session: no second line
    assert len(_shipping_lines(caplog)) == 1


SCRIPT = """import os, sys
open(os.path.join(sys.argv[1], "ran-" + os.environ["RANK"]), "w").write(sys.argv[0])
"""


def test_script_only_on_the_driver_travels_with_the_job(spark, tmp_path, monkeypatch):
    here = tmp_path / "driver"
    here.mkdir()
    (here / "train_only_here.py").write_text(SCRIPT)
    monkeypatch.chdir(here)  # a relative path: the executors' working directory lacks it
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.run("train_only_here.py", tmp_path) is None
    for r in (0, 1):
        assert (tmp_path / f"ran-{r}").read_text().endswith("/train_only_here.py")


def test_script_nowhere_names_both_working_directories(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run("no_such_script.py")
    msg = str(e.value)
    assert "'no_such_script.py' exists neither on the driver" in msg, msg
    assert f"working directory {tmp_path})" in msg and "/worker-" in msg, msg
    assert tsp_spark.wait_gone(MARK_VALUE, 2) == []


def test_executor_of_another_platform_is_one_clear_error(spark, monkeypatch):
    monkeypatch.setattr(_ship, "PLATFORM", "Linux-riscv64")  # what the driver was built for
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_allreduce)
    msg = str(e.value)
    here = f"{os.uname().sysname}-{os.uname().machine}"
    assert f"runs {here}, but the driver's torchspark was built for Linux-riscv64" in msg
    assert f"Python {spark.python_for_test}" in msg and "install torchspark" in msg, msg


def _eleven_mib():
    return b"x" * (11 << 20)


def test_a_result_over_max_result_size_is_the_drivers_error(spark):
    # Rank 0's 11 MiB result, over this session's spark.driver.maxResultSize (10m): the
    # driver's log server refuses it for good (docs/protocol.md 1.6, the ERROR frame's
    # OVER_LIMIT flag), the agent says "refused" and the task sends nothing through
    # collect(): run() raises the driver's sentence. Before, the agent tried 3 times and the
    # task sent the result through collect(), past the same bound (Spark's abort here; at
    # 1 GiB the executor's OutOfMemoryError, and the user saw neither sentence).
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError) as e:
        d.run(_eleven_mib)
    msg = str(e.value)
    assert "is over spark.driver.maxResultSize (10485760 bytes), the most the driver keeps in " \
           "memory: return less" in msg, msg
    assert "through collect()" not in msg, msg
    assert tsp_spark.wait_gone(MARK_VALUE, 2) == []
