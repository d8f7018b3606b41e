"""The JVM half end to end, on real Spark (spark-submit of the pyspark package,
local-cluster[2,1,1024]) and real torch: a Java application trains the DDP example across
2 executors through TorchSparkRunner; TorchSparkPlugin stops a cancelled job's training
processes, for TorchSparkRunner and for PySpark's TorchDistributor (the bound here is
generous for a loaded 2-core machine; the 1 s goal is measured by bench/jvm_cancel_bench.py)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jvmutil

pytestmark = pytest.mark.skipif(not jvmutil.built(), reason="the JVM part was not built "
                                "(needs javac 17 and junit4: bash tests/setup.sh)")


def test_java_application_trains_across_two_executors():
    out, err = jvmutil.spark_submit("train", plugin=False)
    # Rank 0's output (the JSON metrics ddp_train.py writes to --out) came back as bytes.
    assert out["OUTPUT"][0].startswith('{"world_size": 2, "steps": 12'), out
    # Every line reached the driver rank-tagged (the log, or stderr when the app's log is WARN).
    assert re.search(r"\[rank 0\] step +0 +loss", err), err[-3000:]
    assert re.search(r"\[rank 0\] rank 0 done: \{\"world_size\": 2", err), err[-3000:]
    # A failing rank throws one exception naming rank, host and exit code, with its lines.
    fail = out["FAILURE"][0]
    assert re.match(r"rank=1 host=\S+ exit=5 lines=\[rank one gives up\]", fail), fail
    assert "rank 1 (node 1, local rank 0) on host" in out["MESSAGE"][0]
    assert "exited with code 5" in out["MESSAGE"][0]
    # Nothing left running: rank 0's sleeping node was stopped through the control channel.
    assert out["LEFT"] == ["0"], out


def test_plugin_stops_a_cancelled_runner_job():
    out, err = jvmutil.spark_submit("cancel", plugin=True)
    assert int(out["BEFORE"][0]) >= 4, out
    gone = int(out["GONE_MS"][0])
    assert 0 <= gone < jvmutil.GONE_BOUND_MS, (out, err[-3000:])
    # The plugin itself stopped the agents (the executors' logs say so).
    assert int(out["PLUGIN_STOPS"][0]) >= 1, out


# In a fresh interpreter: the plugin's class must be on the driver JVM's classpath when that
# JVM starts (spark.jars at launch, as `pyspark --jars` or a first session's config gives
# it); this pytest process's JVM gateway may already be up from an earlier session.
_PYSPARK_CANCEL = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import jvmutil
mark = jvmutil.new_mark()
spark = jvmutil.pyspark_session(plugin=True, mark=mark)
try:
    (gone,) = jvmutil.cancel_pyspark(spark, mark)
    time.sleep(1)  # the executors' log lines
    stops = jvmutil.plugin_stops(spark.sparkContext.applicationId)
finally:
    spark.stop()
print("RESULT " + json.dumps({"gone": gone, "stops": stops}), flush=True)
"""


def test_plugin_stops_a_cancelled_pyspark_job():
    r = subprocess.run([sys.executable, "-c", _PYSPARK_CANCEL, str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    res = json.loads(lines[-1][len("RESULT "):])
    assert 0 <= res["gone"] < jvmutil.GONE_BOUND_MS, res
    assert res["stops"] >= 1, "the executors' logs do not show the plugin stopping the agents"


def test_plugin_two_jobs_on_one_executor_only_the_cancelled_one_dies():
    # One executor with 2 cores runs both jobs; then stopping the application stops the other.
    out, err = jvmutil.spark_submit("concurrent", plugin=True, master="local-cluster[1,2,1024]")
    a, b = (int(x) for x in out["BEFORE"][0].split())
    assert a >= 2 and b >= 2, out
    assert 0 <= int(out["GONE_MS"][0]) < jvmutil.GONE_BOUND_MS, (out, err[-3000:])
    assert int(out["OTHER_ALIVE"][0]) == b, out
    assert int(out["PLUGIN_STOPS"][0]) >= 1, out
    assert int(out["STOP_GONE_MS"][0]) >= 0, (out, err[-3000:])
