"""torchspark installed on the driver only, across hosts of the namespace cluster: the
executors run a Python that sees pyspark and torch but not torchspark (neither the
checkout's source nor .venv), and the distributor ships its own package through Spark's
file distribution (one INFO line) before DDP training on 2 hosts."""

import pytest

from tests.helpers.cluster_harness import run_driver, torchspark_unavailable

from tests.helpers import tsp_spark


def test_driver_only_install_trains_across_hosts(cluster, tmp_path):
    if torchspark_unavailable():
        pytest.skip(torchspark_unavailable())
    if len(cluster.worker_names) < 2:
        pytest.skip("needs 2 workers")
    python = tsp_spark.python_without_torchspark(tmp_path / "exec-venv")
    runs = [{"tag": "h2", "num_processes": 2, "train": {"steps": 3}},
            {"tag": "again", "num_processes": 2, "train": {"steps": 3}}]
    run = run_driver(cluster, "torchspark", runs, timeout=420, conf={
        "spark.pyspark.python": python,
        # The workers' PYTHONPATH names the checkout's source: not for these executors.
        "spark.executorEnv.PYTHONPATH": str(tmp_path / "nothing-here"),
    })
    for tag in ("h2", "again"):
        res = run.result(tag)
        assert res["ok"], f"{tag}: {res['error']}\ndriver stderr tail:\n{run.stderr[-3000:]}"
        hosts = [r["host"] for r in res["result"]["ranks"]]
        assert len(set(hosts)) == 2 and all(h.startswith("tsp-worker") for h in hosts), hosts
    shipped = [ln for ln in run.stderr.splitlines() if "is not installed on the executors" in ln]
    assert len(shipped) == 1, run.stderr[-3000:]
    assert python in shipped[0] and "No module named 'torchspark'" in shipped[0], shipped[0]
