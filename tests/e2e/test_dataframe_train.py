"""TorchDistributor.train_on_dataframe on local-cluster[2,1,1024] (2 executors with 2 fake
GPUs each): real gloo DDP on a DataFrame with numeric, array<float> and ML vector columns
through both loaders, every row seen exactly once per epoch across the ranks (by id), 2
processes per task with use_gpu, PySpark's errors, and no partition file left behind after
a failure or a cancel (the file has no name; a process holding or mapping it is what keeps
it, so the test looks for those)."""
import json
import os
import sys
import threading
import time

import pytest
from pyspark import cloudpickle
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import functions as F

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError

cloudpickle.register_pickle_by_value(sys.modules[__name__])
N = 1200  # rows: 600 a partition, 300 a process with 2 processes per task


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    gpus = tsp_spark.fake_gpu_script(tmp_path_factory.mktemp("gpu"), ["0", "1"])
    local = tmp_path_factory.mktemp("local")
    # Its own: the workers' fake GPUs and spark.local.dir are fixed when the context starts.
    s = tsp_spark.session("local-cluster[2,1,1024]", {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": gpus,
        "spark.executor.resource.gpu.amount": "2",
        "spark.task.resource.gpu.amount": "2",
        "spark.local.dir": str(local),
        # Fake GPUs: no CUDA driver or NCCL to check (the check, on by default for a GPU
        # job of more than one node, runs on the stubs in test_gpu_assign.py).
        "spark.torchspark.ncclCheck": "false",
    })
    # Where the executors really keep their blocks (and the partition files): spark.local.dir
    # only when this is the JVM's first SparkContext, since Spark caches the local root dirs
    # once per JVM (Utils.localRootDirs), and local-cluster's workers live in the driver's
    # JVM; after another module's session it is that session's /tmp/spark-*.
    dirs = s.sparkContext.parallelize(range(2), 2).map(_local_dirs).collect()
    s.conf.set("torchspark.test.localDir", os.path.commonpath(dirs) if all(dirs) else str(local))
    yield s
    s.stop()


def _local_dirs(_):
    import os
    return os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]


def frame(spark, n=N, parts=2):
    """id, x: float, w: double, feat: array<float>, vec: ML vector of 4 (VectorAssembler
    stores odd ids dense [i, 1, -i, 2], even ids sparse: i at index 0), label: double."""
    odd = F.col("id") % 2 == 1
    df = (spark.range(0, n, numPartitions=parts)
          .withColumn("x", (F.col("id") * 0.5).cast("float"))
          .withColumn("w", (F.col("id") % 7).cast("double"))
          .withColumn("feat", F.array(*[(F.col("id") + k).cast("float") for k in range(4)]))
          .withColumn("v0", F.col("id").cast("double"))
          .withColumn("v1", F.when(odd, 1.0).otherwise(0.0))
          .withColumn("v2", F.when(odd, -F.col("id")).otherwise(0.0).cast("double"))
          .withColumn("v3", F.when(odd, 2.0).otherwise(0.0)))
    df = VectorAssembler(inputCols=["v0", "v1", "v2", "v3"], outputCol="vec").transform(df)
    return df.select("id", "x", "w", "feat", "vec",
                     (F.col("id") % 3).cast("double").alias("label"))


def _train(batch_size):
    """Epoch 0 through PySpark's loader (2 DataLoader workers), epoch 1 through the
    columnar API, shuffled; rank 0 returns every rank's ids per epoch and what it saw."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as fn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchspark

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1 + 1 + 4 + 4, 1).double())
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    n = torchspark.partition_num_rows()
    seen, dtypes = [], None
    for epoch in range(2):
        if epoch == 0:
            batches = torchspark.get_spark_partition_data_loader(n, batch_size, num_workers=2)
        else:
            batches = ([b[c] for c in ("id", "x", "w", "feat", "vec", "label")]
                       for b in torchspark.partition_batches(batch_size, shuffle=True, seed=1))
        ids = []
        for id_, x, w, feat, vec, label in batches:
            dtypes = dtypes or [str(t.dtype) for t in (id_, x, w, feat, vec, label)]
            odd = (id_ % 2 == 1)[:, None].double()
            assert torch.equal(feat[:, 0], id_.float()) and torch.equal(x.double(), id_.double() * 0.5)
            assert torch.equal(vec, torch.stack([id_.double(), odd[:, 0], -id_ * odd[:, 0],
                                                 2 * odd[:, 0]], 1))
            inp = torch.cat([x[:, None].double(), w[:, None], feat.double(), vec], 1)
            loss = fn.mse_loss(model(inp).squeeze(1), label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ids += id_.tolist()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, ids)
        seen.append(everyone)
    if dist.get_rank() != 0:
        return None
    return {"seen": seen, "dtypes": dtypes, "local_world": os.environ["LOCAL_WORLD_SIZE"],
            "weight": model.module.weight.detach().tolist()}


def assert_each_row_once(out, world):
    for epoch, per_rank in enumerate(out["seen"]):
        assert len(per_rank) == world
        assert all(per_rank), f"epoch {epoch}: a rank read nothing"
        flat = sorted(i for ids in per_rank for i in ids)
        assert flat == list(range(N)), f"epoch {epoch}: rows missing or seen twice"


def test_ddp_on_a_dataframe_with_both_loaders(spark):
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    out = d.train_on_dataframe(_train, frame(spark), 50)
    assert_each_row_once(out, 2)
    assert out["local_world"] == "1"
    # PySpark's dtypes: bigint, float, double -> int64, float64, float64; array<float> float32.
    assert out["dtypes"] == ["torch.int64", "torch.float64", "torch.float64", "torch.float32",
                             "torch.float64", "torch.float64"]


def test_two_processes_per_task_with_fake_gpus(spark):
    """use_gpu with 2 (fake) GPUs a task: 4 processes, each its own quarter of the rows,
    through PySpark's name for the method."""
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=True)
    out = d._train_on_dataframe(_train, frame(spark), 50)
    assert_each_row_once(out, 4)
    assert out["local_world"] == "2"
    assert all(len(ids) == N // 4 for ids in out["seen"][0])


SCRIPT = """
import json, os, sys
import torchspark
out, bs = sys.argv[1], int(sys.argv[2])
ids = [i for b in torchspark.partition_batches(bs, shuffle=True) for i in b["id"].tolist()]
n = torchspark.partition_num_rows()
stock = [i for b in torchspark.get_spark_partition_data_loader(n, bs) for i in b[0].tolist()]
with open(os.path.join(out, "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump([ids, stock], f)
"""


def test_a_script_on_a_dataframe(spark, tmp_path):
    """The path of a script, as run() takes one (PySpark's _train_on_dataframe fails on one
    inside the tasks: it calls the string): its processes read the partition the same way;
    its args are strings, keyword arguments are refused with PySpark's message."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.train_on_dataframe(str(script), frame(spark), str(out), 64) is None
    per_rank = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(i for ids, _ in per_rank for i in ids) == list(range(N))
    assert [sorted(ids) for ids, _ in per_rank] == [stock for _, stock in per_rank]
    with pytest.raises(ValueError, match="^Running pytorch file does not support key-word type "
                                         "arguments.$"):
        d.train_on_dataframe(str(script), frame(spark), str(out), batch_size=64)


def test_pyspark_errors(spark):
    with pytest.raises(ValueError, match="^TorchDistributor.train_on_dataframe requires setting "
                                         "TorchDistributor.local_mode to False.$"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).train_on_dataframe(
            _train, frame(spark), 50)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(ValueError, match=r"requires setting num_processes equal to input spark "
                                         r"dataframe partition number\. The DataFrame has 3 "
                                         r"partitions.*df.repartition\(2\)"):
        d.train_on_dataframe(_train, frame(spark, parts=3), 50)
    with pytest.raises(ValueError, match="^Empty Spark partition is not allowed in "
                                         "TorchDistributor.train_on_dataframe.$"):
        d.train_on_dataframe(_train, frame(spark, n=1), 50)


def partition_files(local_dir):
    """Processes that hold or map a file under local_dir: what keeps a partition alive."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(local_dir) and target.endswith("(deleted)"):
                    found.append((int(pid), target))
            with open(f"/proc/{pid}/maps") as f:
                found += [(int(pid), ln.split(None, 5)[-1].strip()) for ln in f
                          if local_dir in ln and "(deleted)" in ln]
        except OSError:
            continue
    return found


def holders(local_dir):
    """Who holds what (for a failure's message): each pid's command line and files."""
    by_pid = {}
    for pid, target in partition_files(local_dir):
        by_pid.setdefault(pid, set()).add(target.rsplit("/", 1)[-1])
    out = []
    for pid, files in sorted(by_pid.items()):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")[:160]
        except OSError:
            cmd = "(gone)"
        out.append(f"{pid} {cmd}: {sorted(files)}")
    return "\n".join(out) or "no process holds a file"


def wait_for(cond, timeout):
    """True once cond() is (evaluated once per round: a state seen is not lost to a second
    look), False when timeout passed without it."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def steady_holders(local_dir):
    """The pids that hold or map a partition file in two looks 0.2 s apart: a process that
    holds one for an instant (a task's child between its fork and its exec) is not one."""
    first = {p for p, _ in partition_files(local_dir)}
    time.sleep(0.2)
    return first & {p for p, _ in partition_files(local_dir)}


def _read_then(action):
    import os
    import time

    import torchspark

    next(torchspark.partition_batches(10))
    if action == "fail" and os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 fails after reading")
    time.sleep(120)


def test_a_failure_leaves_no_partition_file(spark):
    local_dir = spark.conf.get("torchspark.test.localDir")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    with pytest.raises(TorchDistributorError, match="rank 1 fails after reading"):
        d.train_on_dataframe(_read_then, frame(spark), "fail")
    assert wait_for(lambda: not partition_files(local_dir), 15), partition_files(local_dir)


def test_cancel_leaves_no_partition_file(spark):
    local_dir = spark.conf.get("torchspark.test.localDir")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    box = {}

    def run():
        try:
            d.train_on_dataframe(_read_then, frame(spark), "sleep")
        except BaseException as e:  # noqa: B902 - checked below
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    try:
        # Both tasks' files are held (the tasks) and mapped (the training processes).
        assert wait_for(lambda: len(steady_holders(local_dir)) >= 4, 120), \
            holders(local_dir)
    finally:
        spark.sparkContext.cancelAllJobs()
        t.join(60)
    assert not t.is_alive() and "error" in box
    assert wait_for(lambda: not partition_files(local_dir), 15), partition_files(local_dir)
    assert not [f for _, _, fs in os.walk(local_dir) for f in fs if "partition" in f]
