"""A Java application (tests/java/org/torchspark/TrainApp.java) submitted with spark-submit
to the multi-host namespace cluster trains the DDP example across 2 hosts through
TorchSparkRunner: the election through the driver's rendezvous, rank-tagged lines on the
driver, rank 0's output back, a failing rank named with its host and exit code, nothing
left running."""
import os
import re

import pytest

from tests.helpers import jvmutil

pytestmark = pytest.mark.skipif(not jvmutil.built(), reason="the JVM part was not built")


def test_java_application_trains_across_hosts(cluster):
    d = cluster.hosts["driver"]
    conf = {
        "spark.driver.host": d.name, "spark.driver.bindAddress": d.addr,
        "spark.driver.memory": "512m", "spark.executor.memory": "512m",
        "spark.executor.cores": "1", "spark.cores.max": "2", "spark.ui.enabled": "false",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "180s",
        "spark.plugins": jvmutil.PLUGIN,
    }
    argv = [os.path.join(jvmutil.SPARK_HOME, "bin", "spark-submit"), "--master", cluster.master_url]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    argv += ["--jars", str(jvmutil.JAR), "--class", "org.torchspark.TrainApp", str(jvmutil.TEST_JAR),
             "train", cluster.python, str(jvmutil.DDP)]
    p = cluster.run("driver", argv, timeout=480)
    assert p.returncode == 0, p.stderr[-4000:]
    out = {}
    for line in p.stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isupper():
            out[key] = value
    assert out["OUTPUT"].startswith('{"world_size": 2, "steps": 12'), out
    # Rank 0's record crossed hosts through the driver's rendezvous (spark.driver.host).
    assert out["ELECTION"] == "rendezvous", out
    assert re.search(r"\[rank 1\] \[stderr\]|\[rank 0\] step +0 +loss", p.stderr), p.stderr[-3000:]
    workers = {h.name for k, h in cluster.hosts.items() if h.role == "worker"}
    m = re.match(r"rank=1 host=(\S+) exit=5 lines=\[rank one gives up\]", out["FAILURE"])
    assert m and m.group(1) in workers, (out["FAILURE"], workers)
    assert out["LEFT"] == "0", out
