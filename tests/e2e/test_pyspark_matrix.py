"""The version matrix: this checkout's torchspark on the oldest supported pyspark (3.5.x,
TORCHSPARK_MATRIX_PYSPARK to pick another), beside the newest that the rest of the suite
runs on. tests/setup_pyspark.sh makes the environment (that pyspark and its Spark jars
from PyPI, cached per machine; torch and the rest through the dependency venv's .pth),
torchspark goes in with the user's own command, and a selection of the suite runs there
in its own pytest: the stock contract battery (test_distributor_api.py), DDP in function
and script mode on local-cluster, TorchSparkRunner and the JVM plugin's cancel tests (its
pre-4.3 polling path: a runner job, a PySpark job, one with its driver frozen). Spark
Connect is not in it: Spark 3.5's Connect server is a separate Maven artifact
(spark-connect_2.12), not in pyspark 3.5's jars (docs/distributor.md, supported
versions)."""
import os
import subprocess
from pathlib import Path

import pytest

import jvmutil

ROOT = Path(__file__).resolve().parents[2]
VERSION = os.environ.get("TORCHSPARK_MATRIX_PYSPARK", "3.5.9")
INNER = "TORCHSPARK_MATRIX_INNER"  # set in the matrix's own pytest: nothing here recurses

pytestmark = pytest.mark.skipif(os.environ.get(INNER) == "1", reason="inside the matrix run")


def _pyspark_version(python: str) -> str:
    r = subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip() or r.stderr[-2000:]


@pytest.fixture(scope="module")
def matrix_python():
    """(python of the matrix venv, the user's pip install's result, pyspark before and
    after it)."""
    r = subprocess.run(["bash", str(ROOT / "tests" / "setup_pyspark.sh"), VERSION], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    python = r.stdout.strip().splitlines()[-1]
    before = _pyspark_version(python)
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "torchspark"],
                   capture_output=True, timeout=300)
    # What a user of this Spark types; pip resolves torchspark's dependencies against what
    # the environment has (PyPI where something is missing).
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "./spark-glue/python"], cwd=ROOT, capture_output=True, text=True,
                         timeout=1800)
    return python, pip, before, _pyspark_version(python)


def test_pip_install_keeps_the_users_pyspark(matrix_python):
    python, pip, before, after = matrix_python
    assert before == VERSION, before
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-4000:]
    assert after == VERSION, f"pip install ./spark-glue/python replaced pyspark {before} with {after}"
    r = subprocess.run([python, "-c", "import torchspark, torchspark._spark as s; s.check(); "
                        "print(torchspark.__file__)"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "site-packages" in r.stdout, r.stderr[-3000:]


def _suite(matrix_python, *args: str, timeout: float = 900) -> None:
    """Runs tests of this suite with the matrix venv's python (its own pytest)."""
    python, pip, _, after = matrix_python
    assert pip.returncode == 0 and after == VERSION, "the matrix environment is not there"
    env = dict(os.environ, **{INNER: "1"})
    r = subprocess.run([python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    # The inner run's summary in this test's output (pytest -rA / -s shows it).
    print("\n".join(r.stdout.splitlines()[-15:]))
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and " skipped" not in r.stdout.splitlines()[-1], r.stdout[-3000:]


def test_stock_contract_battery(matrix_python):
    # Construction, messages, local mode (function and script), failures: against stock
    # PySpark 3.5's own TorchDistributor in the same process.
    _suite(matrix_python, "tests/e2e/test_distributor_api.py")


def test_ddp_function_and_script_mode_on_local_cluster(matrix_python):
    # 2 executors, one process each: the same weights as torchrun, in both modes; then the
    # mapInArrow(barrier=True) path (Connect's and train_on_dataframe's) on a classic session.
    _suite(matrix_python, "tests/e2e/test_distributor_cluster.py", "-k",
           "ddp_two_executors_one_process_each or classic_through_map_in_arrow")


@pytest.mark.skipif(not jvmutil.built(), reason="the JVM part was not built "
                    "(needs javac 17 and junit4: bash tests/setup.sh)")
def test_jar_built_here_runs_on_this_spark(matrix_python):
    # The one jar (compiled against the newest Spark's jars) under this Spark's own
    # spark-submit: TorchSparkRunner trains; the plugin, through its poll (no interrupt
    # listener before 4.3), stops a cancelled runner job and a cancelled PySpark job within
    # 1 s, and a PySpark job's training processes within 1 s while its driver is frozen.
    _suite(matrix_python, "tests/e2e/test_jvm_runner.py", "-k",
           "trains_across_two_executors or stops_a_cancelled_runner_job "
           "or stops_a_cancelled_pyspark_job")


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


@pytest.mark.parametrize("old", ["3.4.4", "3.3.0", "2.4.8"])
def test_an_older_pyspark_is_one_clear_error(old):
    from torchspark import _spark

    with pytest.raises(RuntimeError) as e:
        _spark.check(old)
    msg = str(e.value)
    assert f"needs pyspark 3.5 or newer, but this is pyspark {old}" in msg
    for lacking in ("mapInArrow(barrier=True)", "addJobTag", "interruptTag"):
        assert lacking in msg
    _spark.check("3.5.0")
    _spark.check("4.3.0")
