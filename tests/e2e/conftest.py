"""Shared fixtures for the end-to-end suites: paths to the built agent and the venv python."""
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_BIN = Path(os.environ.get("TORCHSPARK_RUN", ROOT / "build" / "bin" / "torchspark-run"))
PYTHON = sys.executable
EXAMPLES = ROOT / "spark-glue" / "python" / "examples"
# Each module's session starts warm worker pools (torchspark/worker/_warm.py, about 300 MB each);
# those of the driver's local-mode runs live as long as pytest: let them end soon.
os.environ.setdefault("TORCHSPARK_WARM_IDLE_TIMEOUT", "30s")


@pytest.fixture
def driver_tmpdir(tmp_path, monkeypatch) -> Path:
    """The driver's temporary directory pointed at the test's tmp_path, as a user does with
    TMPDIR: the hang doctor's stacks files (torchspark-hang-*.txt) land there, not in the
    host's shared /tmp (where a test run left one per diagnosis)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches: read TMPDIR again
    return tmp_path


@pytest.fixture(scope="session")
def run_bin() -> Path:
    if not RUN_BIN.exists():
        pytest.fail(f"{RUN_BIN} is missing: build first (bash tests/setup.sh)")
    return RUN_BIN


@pytest.fixture(scope="module")
def spark_cluster():
    """local-cluster[2,1,1024] (2 executors of 1 core, 1 GiB), shared by every module that
    asks for it (each listed in tests/conftest.py's GROUPS, so that they run one after
    another on one xdist worker): started by the first, kept until one of another
    configuration or the run's end. Its executors carry
    tsp_spark.MARK=tsp_spark.SHARED_MARK. Per-run settings go through tsp_spark.runtime_conf;
    a test that kills an executor for good calls tsp_spark.discard_shared() after."""
    from tests.helpers import tsp_spark

    return tsp_spark.shared(tsp_spark.CLUSTER)


@pytest.fixture(scope="module")
def warm_pool_spark(spark_cluster):
    """The shared cluster with the warm pools kept 60 s between runs (the warm-pool modules'
    `spark`: their tests look at a pool across runs)."""
    from tests.helpers import tsp_spark

    with tsp_spark.runtime_conf(spark_cluster, {"spark.torchspark.warmWorkers.idleTimeout": "60s"}):
        yield spark_cluster


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_spark():
    yield
    from tests.helpers import tsp_spark

    tsp_spark.stop_shared()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """One real Spark Connect server (local-cluster[2,1,1024]) for the whole run; each
    Connect module opens its own client session on it (tsp_connect.py). Its executors
    run a Python without torchspark: Connect clients are driver-only installs, and the
    distributor ships itself through the session's artifacts."""
    from tests.helpers import tsp_connect
    from tests.helpers import tsp_spark

    from tests.helpers import jvmutil

    python = tsp_spark.python_without_torchspark(tmp_path_factory.mktemp("connect-venv"))
    server = tsp_connect.ConnectServer(tmp_path_factory.mktemp("connect"), {
        f"spark.executorEnv.{tsp_spark.MARK}": tsp_spark.CONNECT_MARK,
        # TorchSparkPlugin on the server's executors, under Connect's class loaders: it
        # finds TorchDistributor's tasks by their job tag (Connect sets no local property).
        "spark.plugins": jvmutil.PLUGIN, "spark.jars": str(jvmutil.JAR),
        # A decommission notice (SIGPWR) asks the plugin for a checkpoint on request
        # (test_distributor_connect.py); nothing changes for executors that get none.
        "spark.decommission.enabled": "true",
    }, env={"PYSPARK_PYTHON": python})
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def connect_spark(connect_server):
    """A module's own client session on the run's Connect server; classic again after it."""
    from tests.helpers import tsp_connect

    s = connect_server.session()
    yield s
    tsp_connect.back_to_classic()
