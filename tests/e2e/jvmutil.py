"""Helpers for the JVM suites: spark-submit of the test application (TrainApp in
tests/java), and cancelling a PySpark TorchDistributor job mid-training. Shared with
bench/jvm_cancel_bench.py."""
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pyspark

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TORCHSPARK_BUILD_DIR", ROOT / "build"))
JAR = BUILD / "java" / "torchspark.jar"
TEST_JAR = BUILD / "java" / "torchspark_tests.jar"
DDP = ROOT / "spark-glue" / "python" / "examples" / "ddp_train.py"
PLUGIN = "org.torchspark.TorchSparkPlugin"
SPARK_HOME = os.path.dirname(pyspark.__file__)
MASTER = "local-cluster[2,1,1024]"


def built() -> bool:
    return JAR.is_file() and TEST_JAR.is_file()


def spark_submit(mode: str, plugin: bool, conf: Optional[Dict[str, str]] = None, rounds: int = 1,
                 timeout: float = 600, master: str = MASTER) -> Tuple[Dict[str, List[str]], str]:
    """Runs TrainApp MODE with the real spark-submit of the pyspark package on
    local-cluster[2,1,1024]; returns its "KEY: value" lines and its stderr."""
    cmd = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", master,
           "--conf", "spark.executor.memory=1024m", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.testing=true", "--conf", f"spark.test.home={SPARK_HOME}",
           "--jars", str(JAR)]
    if plugin:
        cmd += ["--conf", f"spark.plugins={PLUGIN}"]
    for k, v in (conf or {}).items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += ["--class", "org.torchspark.TrainApp", str(TEST_JAR), mode, sys.executable, str(DDP), str(rounds)]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_HOME=SPARK_HOME)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, cwd=str(BUILD))
    out: Dict[str, List[str]] = {}
    for line in p.stdout.decode(errors="replace").splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isupper():
            out.setdefault(key, []).append(value)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 0:
        raise AssertionError(f"spark-submit exited {p.returncode}:\n{err[-4000:]}")
    return out, err


def cancel_pyspark(spark, mark: str, rounds: int = 1, gone_timeout: float = 15.0,
                   stock: bool = False) -> List[float]:
    """Starts a TorchDistributor training (2 processes; torchspark's, or PySpark's own with
    stock), cancels every job mid-training and returns, per round, the ms until every
    training process carrying mark is gone (-1: not within gone_timeout; those are killed
    afterwards so the next round starts clean). Stock: the workers are counted (torchrun
    itself is not), so 2 processes must be up instead of 4."""
    if stock:
        from pyspark.ml.torch.distributor import TorchDistributor
    else:
        from torchspark import TorchDistributor

    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    import tsp_spark

    times = []
    for _ in range(rounds):
        def train() -> None:
            try:
                TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                    str(DDP), "--steps", "100000000")
            except Exception:
                pass

        t = threading.Thread(target=train, daemon=True)
        t.start()
        need = 2 if stock else 4
        found = tsp_spark.wait_present(mark, need, 600)
        assert len(found) >= need, f"training did not start: {found}"
        time.sleep(3)  # mid-training
        t0 = time.monotonic()
        spark.sparkContext.cancelAllJobs()
        gone = -1.0
        while time.monotonic() - t0 < gone_timeout:
            if not tsp_spark.job_processes(mark):
                gone = (time.monotonic() - t0) * 1000
                break
            time.sleep(0.005)
        times.append(round(gone, 1))
        for pid in tsp_spark.job_processes(mark):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        t.join(30)
    return times


def pyspark_session(plugin: bool, mark: str):
    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    import tsp_spark

    conf = {"spark.jars": str(JAR), f"spark.executorEnv.{tsp_spark.MARK}": mark}
    if plugin:
        conf["spark.plugins"] = PLUGIN
    return tsp_spark.session(MASTER, conf)


def new_mark() -> str:
    return uuid.uuid4().hex


GONE_BOUND_MS = 5000  # generous (2 shared cores); the goal (1 s) is measured in the bench


def plugin_stops(app_id: str) -> int:
    """How many times the executors' TorchSparkPlugin logged stopping a killed task's agents
    (local-cluster executors write <worker dir>/<app id>/<executor id>/stderr, the worker
    dirs under java.io.tmpdir)."""
    n = 0
    for f in Path(tempfile.gettempdir()).glob(f"worker-*/{app_id}/*/stderr"):
        n += f.read_text(errors="replace").count("torchspark plugin: stopped")
    return n
