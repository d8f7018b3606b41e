"""The version matrix: this checkout's torchspark on the oldest supported pyspark (3.5.x,
TORCHSPARK_MATRIX_PYSPARK to pick another) beside the oldest torch it states (2.4.1;
TORCHSPARK_MATRIX_TORCH to pick another, empty for the suite's torch), while the rest of
the suite runs on the newest of both. torch 2.4.1 is a 2.84 GB download on a fresh machine
(docs/testing.md, "The version matrix's cost").
tests/setup_pyspark.sh makes the environment (that pyspark with its
Spark jars, and tests/setup_torch.sh's torch with its CUDA wheels, from PyPI, cached per
machine; the rest through the dependency venv's .pth), torchspark goes in with the user's
own command, and a selection of the suite runs there, in one pytest of its own (each
module still makes its own Spark session): the stock contract battery
(test_distributor_api.py), DDP in function and script mode on local-cluster against that
torch's torchrun, the mapInArrow(barrier=True) path, the executors' warm pool, the agent's
environment contract against that torch's torchrun, TorchSparkRunner and the JVM plugin's
cancel tests (its pre-4.3 polling path: a runner job, a PySpark job with its driver
frozen). Each test below checks its part of that one run. Spark Connect is not in it:
Spark 3.5's Connect server is a separate Maven artifact (spark-connect_2.12), not in
pyspark 3.5's jars (docs/distributor.md, supported versions)."""
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import jvmutil

ROOT = Path(__file__).resolve().parents[2]
VERSION = os.environ.get("TORCHSPARK_MATRIX_PYSPARK", "3.5.9")
TORCH = os.environ.get("TORCHSPARK_MATRIX_TORCH", "2.4.1")  # the oldest torch stated; "": the suite's
INNER = "TORCHSPARK_MATRIX_INNER"  # set in the matrix's own pytest: nothing here recurses

pytestmark = pytest.mark.skipif(os.environ.get(INNER) == "1", reason="inside the matrix run")

JVM_SKIP = pytest.mark.skipif(not jvmutil.built(), reason="the JVM part was not built "
                              "(needs javac 17 and junit4: bash tests/setup.sh)")
# Each part of the one inner run: its test ids (a file: all of its tests).
PARTS = {
    # Construction, messages, local mode (function and script), failures: against stock
    # PySpark's own TorchDistributor of this version in the same process.
    "battery": ["tests/e2e/test_distributor_api.py"],
    # 2 executors, one process each: the same weights as this torch's torchrun, in both
    # modes; then the mapInArrow(barrier=True) path (Connect's and train_on_dataframe's)
    # on a classic session.
    "ddp": ["tests/e2e/test_distributor_cluster.py::"
            "test_ddp_two_executors_one_process_each_equals_torchrun",
            "tests/e2e/test_distributor_cluster.py::test_classic_through_map_in_arrow_as_connect_does"],
    # Two runs forked from the executors' pool, which imported this torch.
    "warm": ["tests/e2e/test_warm_workers.py::test_runs_fork_from_the_executors_warm_pool"],
    # The workers' environment under torchspark-run is this torch's torchrun's, variable by
    # variable (2 nodes of 2 processes).
    "env": ["tests/e2e/test_agent_env.py::test_env_two_nodes_two_procs"],
    # The one jar (compiled against the newest Spark's jars) under this Spark's own
    # spark-submit: TorchSparkRunner trains; the plugin, through its poll (no interrupt
    # listener before 4.3), stops a cancelled runner job within 1 s, and a PySpark job's
    # training processes within 1 s while its driver is frozen (the poll asserted).
    "jvm": ["tests/e2e/test_jvm_runner.py::test_java_application_trains_across_two_executors",
            "tests/e2e/test_jvm_runner.py::test_plugin_stops_a_cancelled_runner_job",
            "tests/e2e/test_jvm_runner.py::"
            "test_plugin_stops_a_cancelled_pyspark_job_while_its_driver_is_frozen"],
}


def _version(python: str, package: str) -> str:
    r = subprocess.run([python, "-c", "import importlib.metadata as m, sys; "
                        f"print(m.version({package!r}))"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip() or r.stderr[-2000:]


@pytest.fixture(scope="module")
def matrix_python():
    """(python of the matrix venv, the user's pip install's result, pyspark before and
    after it)."""
    r = subprocess.run(["bash", str(ROOT / "tests" / "setup_pyspark.sh"), VERSION,
                        *([TORCH] if TORCH else [])], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    python = r.stdout.strip().splitlines()[-1]
    before = _version(python, "pyspark")
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "torchspark"],
                   capture_output=True, timeout=300)
    # What a user of this Spark types; pip resolves torchspark's dependencies against what
    # the environment has (PyPI where something is missing).
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "./spark-glue/python"], cwd=ROOT, capture_output=True, text=True,
                         timeout=1800)
    return python, pip, before, _version(python, "pyspark")


def test_pip_install_keeps_the_users_pyspark(matrix_python):
    python, pip, before, after = matrix_python
    assert before == VERSION, before
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-4000:]
    assert after == VERSION, f"pip install ./spark-glue/python replaced pyspark {before} with {after}"
    r = subprocess.run([python, "-c", "import torchspark, torchspark.driver._spark as s; s.check(); "
                        "print(torchspark.__file__)"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "site-packages" in r.stdout, r.stderr[-3000:]
    if TORCH:  # and the user's torch (2.4.1+cu121 is 2.4.1)
        assert _version(python, "torch").split("+")[0] == TORCH


@pytest.fixture(scope="module")
def inner(matrix_python, tmp_path_factory):
    """Runs every part at once with the matrix venv's python (its own pytest); returns
    {test id: (outcome, seconds, message)} from its JUnit XML, and its output."""
    python, pip, _, after = matrix_python
    assert pip.returncode == 0 and after == VERSION, "the matrix environment is not there"
    ids = [t for name, tests in PARTS.items() if name != "jvm" or jvmutil.built() for t in tests]
    xml = tmp_path_factory.mktemp("matrix") / "inner.xml"
    env = dict(os.environ, **{INNER: "1"})
    r = subprocess.run([python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        f"--junitxml={xml}", *ids], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1500)
    out = r.stdout + r.stderr
    assert xml.is_file(), out[-8000:]
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        # classname tests.e2e.test_x, name test_y[param]: back to the test id.
        test = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, (child.get("message") or "") + "\n" + (child.text or "")
                break
        results[test] = (outcome, float(case.get("time", 0)), message)
    # The inner run's summary and each test's time in this run's output (pytest -rA / -s).
    print("\n".join(r.stdout.splitlines()[-3:]))
    for test, (outcome, secs, _) in sorted(results.items(), key=lambda kv: -kv[1][1]):
        print(f"{secs:8.2f}s {outcome:7} {test}")
    return results, out


def _part(inner, name: str) -> None:
    results, out = inner
    got = {t: v for t, v in results.items() if any(t == p or t.startswith(p + "::") or
                                                   t.startswith(p + "[") for p in PARTS[name])}
    for p in PARTS[name]:
        assert any(t == p or t.startswith(p + "::") or t.startswith(p + "[") for t in got), \
            f"{p} did not run in the matrix: " + out[-6000:]
    bad = {t: v for t, v in got.items() if v[0] != "passed"}
    assert not bad, "\n\n".join(f"{t}: {v[0]}\n{v[2][-4000:]}" for t, v in bad.items())


def test_stock_contract_battery(inner):
    _part(inner, "battery")


def test_ddp_function_and_script_mode_on_local_cluster(inner):
    _part(inner, "ddp")


def test_warm_pool_on_the_executors(inner):
    _part(inner, "warm")


def test_agent_environment_is_this_torchruns(inner):
    _part(inner, "env")


@JVM_SKIP
def test_jar_built_here_runs_on_this_spark(inner):
    _part(inner, "jvm")


@pytest.mark.skipif(not jvmutil.built(), reason="the JVM part was not built "
                    "(needs javac 17 and junit4: bash tests/setup.sh)")
def test_java_sources_compile_against_this_spark(matrix_python, tmp_path):
    # Every Spark API the Java half names exists in this Spark (the runtime tests above
    # reach only some paths): the sources compile against its jars as against the newest's,
    # with the build's flags (warnings are errors). Spark 4.3's interrupt listener is
    # reached by reflection (TorchSparkPlugin), Scala's converters are not used (2.12 here).
    python = matrix_python[0]
    home = subprocess.run([python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                          capture_output=True, text=True, timeout=120).stdout.strip()
    sources = sorted(str(p) for p in (ROOT / "spark-glue" / "java" / "org" / "torchspark").glob("*.java"))
    r = subprocess.run(["javac", "--release", "17", "-Xlint:all,-path", "-Werror", "-proc:none",
                        "-cp", os.path.join(home, "jars", "*"), "-d", str(tmp_path), *sources],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "org" / "torchspark" / "TorchSparkPlugin.class").is_file()


# What torchspark calls of a Connect session (distributor.py, _job.py, _ship.py,
# _connect.py), asked of this pyspark's Connect classes; and which way _spark.py's gates
# go for them. No server: Spark 3.5's is a Maven artifact, not in pyspark 3.5.
_CONNECT_CALLS = """
import inspect
from pyspark.sql.connect.client.core import SparkConnectClient
from pyspark.sql.connect.dataframe import DataFrame
from pyspark.sql.connect.session import SparkSession
from pyspark.util import InheritableThread
missing = [f"SparkSession.{n}" for n in ("addTag", "removeTag", "interruptTag", "interruptAll",
           "addArtifacts", "client") if not hasattr(SparkSession, n)]
missing += [f"SparkConnectClient.{n}" for n in ("_resources", "host")
            if not hasattr(SparkConnectClient, n)]
if "barrier" not in inspect.signature(DataFrame.mapInArrow).parameters:
    missing.append("DataFrame.mapInArrow(barrier=)")
if "archive" not in inspect.signature(SparkSession.addArtifacts).parameters:
    missing.append("SparkSession.addArtifacts(archive=)")
print("MISSING", missing)
print("TO_ARROW", hasattr(DataFrame, "toArrow"))
print("THREAD_SESSION", "session" in inspect.signature(InheritableThread.__init__).parameters)
"""


def test_connect_client_calls_exist_on_this_pyspark(matrix_python):
    # Under a Connect session of this pyspark, torchspark's calls exist, and where they
    # differ from 4.x (no DataFrame.toArrow, no InheritableThread(session=) before 4.0) the
    # gates take the documented 3.5 path: rows instead of toArrow, the barrier job's
    # thread with its own tag (docs/distributor.md, supported versions).
    r = subprocess.run([matrix_python[0], "-c", _CONNECT_CALLS], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert lines["MISSING"] == "[]", lines
    four = tuple(int(x) for x in VERSION.split(".")[:2]) >= (4, 0)
    assert lines["TO_ARROW"] == str(four) and lines["THREAD_SESSION"] == str(four), lines


@pytest.mark.parametrize("old", ["3.4.4", "3.3.0", "2.4.8"])
def test_an_older_pyspark_is_one_clear_error(old):
    from torchspark.driver import _spark

    with pytest.raises(RuntimeError) as e:
        _spark.check(old)
    msg = str(e.value)
    assert f"needs pyspark 3.5 or newer, but this is pyspark {old}" in msg
    for lacking in ("mapInArrow(barrier=True)", "addJobTag", "interruptTag"):
        assert lacking in msg
    _spark.check("3.5.0")
    _spark.check("4.3.0")
