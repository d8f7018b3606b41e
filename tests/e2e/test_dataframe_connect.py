"""TorchDistributor.train_on_dataframe from a Spark Connect client (the session-scoped
local Connect server of conftest.py, executors without torchspark: it ships itself): the
client's DataFrame is the mapInArrow stage's input as is, both loaders read it, every row
once; a wrong partition count is refused on the driver when the plan tells it, else by
the tasks; a gang launch (spark.torchspark.launch=gang, what auto becomes under dynamic
allocation) does the same with ordinary tasks that JOIN through the client's rendezvous."""
import logging
import sys
import time

import pytest
from pyspark import cloudpickle
from pyspark.ml.functions import array_to_vector
from pyspark.sql import functions as F

from torchspark import TorchDistributor

cloudpickle.register_pickle_by_value(sys.modules[__name__])
N = 400


@pytest.fixture(scope="module")
def spark(connect_spark):
    return connect_spark


def _read_all(batch_size):
    """Rank 0 returns every rank's ids: through the columnar API, then PySpark's loader."""
    import torch
    import torch.distributed as dist

    import torchspark

    dist.init_process_group("gloo")
    seen = []
    n = torchspark.partition_num_rows()
    for loader in ("columnar", "stock"):
        ids = []
        if loader == "columnar":
            for b in torchspark.partition_batches(batch_size):
                assert torch.equal(b["vec"][:, 1], b["id"].double() * 2)
                ids += b["id"].tolist()
        else:
            for id_, feat, vec in torchspark.get_spark_partition_data_loader(n, batch_size):
                assert feat.dtype == torch.float32 and vec.dtype == torch.float64
                ids += id_.tolist()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, ids)
        seen.append(sorted(i for r in everyone for i in r))
    rank = dist.get_rank()
    dist.destroy_process_group()
    return seen if rank == 0 else None


def _frame(spark):
    return (spark.range(0, N, numPartitions=2)
            .withColumn("feat", F.array(F.col("id").cast("float"), (F.col("id") * 2).cast("float")))
            .withColumn("vec", array_to_vector(F.col("feat"))))


def test_train_on_dataframe_over_connect(spark):
    df = _frame(spark)
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert d.is_remote
    seen = d.train_on_dataframe(_read_all, df, 64)
    assert seen == [list(range(N))] * 2

    # Known from the physical plan: refused on the driver before any job (3 partitions on
    # the cluster's 2 task slots would otherwise wait for Spark's barrier slot check).
    t = time.monotonic()
    with pytest.raises(ValueError, match=r"requires setting num_processes equal to input spark "
                                         r"dataframe partition number\. The DataFrame has 3 "
                                         r"partitions.*df.repartition\(2\)") as e:
        d.train_on_dataframe(_read_all, df.filter("id > 0").repartition(3).select("id"), 64)
    assert e.value.__cause__ is None and time.monotonic() - t < 60
    # Not known from the plan (a union): the tasks refuse it, with the same message.
    two = spark.range(0, 5, numPartitions=1).union(spark.range(5, 10, numPartitions=1))
    with pytest.raises(ValueError, match=r"requires setting num_processes equal to input spark "
                                         r"dataframe partition number\. The DataFrame has \d "
                                         r"partitions, but num_processes=3") as e:
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=False).train_on_dataframe(
            _read_all, two, 64)
    assert e.value.__cause__ is not None


def test_gang_launch_of_train_on_dataframe_over_connect(spark, caplog):
    # Spark Connect and train_on_dataframe in gang mode (issue 31): the client's rendezvous
    # is on for it (off by default on Connect), the tasks are ordinary ones of a mapInArrow
    # stage that JOIN there before anything trains; every row once, as in barrier mode.
    spark.conf.set("spark.torchspark.launch", "gang")
    try:
        with caplog.at_level(logging.INFO, logger="TorchDistributor"):
            seen = TorchDistributor(num_processes=2, local_mode=False,
                                    use_gpu=False).train_on_dataframe(_read_all, _frame(spark), 64)
    finally:
        spark.conf.unset("spark.torchspark.launch")
    assert seen == [list(range(N))] * 2
    assert any(r.getMessage().startswith("Gang launch: 2 ordinary tasks")
               for r in caplog.records if r.name == "TorchDistributor"), caplog.text[-2000:]
