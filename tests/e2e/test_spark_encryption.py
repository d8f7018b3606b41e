"""torchspark.TorchDistributor where Spark encrypts, on local-cluster[1,1,1024] (a
distributed run: a barrier task on an executor JVM, its agent reaching the driver),
next to PySpark's own _check_encryption: with spark.authenticate and
spark.network.crypto.enabled (stock passes: it reads only spark.ssl.enabled), and with
spark.ssl.enabled and Spark 4's spark.ssl.rpc.enabled (TLS for Spark's RPC) on a keytool
keystore (stock refuses; torchspark trains over its own TLS 1.3 channel). The one line comes
from the library (docs/protocol.md 9, "Where Spark encrypts"; docs/security.md, "Clusters
where Spark encrypts"). One session per configuration, one short run each."""
import logging
import os
import subprocess
import sys
import time

import pytest
from pyspark import cloudpickle
from pyspark.ml.torch.distributor import TorchDistributor as StockDistributor

from tests.helpers import tsp_spark
from torchspark import TorchDistributor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MASTER = "local-cluster[1,1,1024]"  # one executor: a distributed run of one node is enough
# Each test its own session: Spark's authentication and encryption are fixed when a context starts.
NOT_ENCRYPTED = ("torch's own data plane (the TCPStore, gloo and NCCL collectives) is encrypted "
                 "neither by torchspark nor by Spark: see docs/security.md, \"What torchspark "
                 "does not encrypt\"")


def _world(x):
    import os
    return (x, int(os.environ["WORLD_SIZE"]))


def _lines(caplog):
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "TorchDistributor" and "TLS 1.3" in r.getMessage()]


def _train(caplog):
    caplog.clear()
    t0 = time.monotonic()
    ours = TorchDistributor(num_processes=1, local_mode=False, use_gpu=False)
    assert ours.run(_world, 7) == (7, 1)
    print(f"torchspark trained on {MASTER} in {time.monotonic() - t0:.1f} s")
    return _lines(caplog)


def test_trains_where_spark_authenticates_and_encrypts_rpc(caplog):
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    s = tsp_spark.session(MASTER, {"spark.authenticate": "true",
                                   "spark.authenticate.secret": os.urandom(16).hex(),
                                   "spark.network.crypto.enabled": "true"})
    print(f"session in {time.monotonic() - t0:.1f} s")
    try:
        stock = StockDistributor(num_processes=1, local_mode=False, use_gpu=False)
        stock._check_encryption()  # stock reads only spark.ssl.enabled: it passes, silent
        assert [r for r in caplog.records if r.levelname == "WARNING"] == []
        assert _train(caplog) == [("WARNING", "Spark secures its own traffic here "
                                   "(spark.network.crypto.enabled=true, spark.authenticate=true); "
                                   "torchspark's own channel to the driver (worker lines, control, "
                                   "rank 0's output) is TLS 1.3 keyed by the run's secret, but "
                                   + NOT_ENCRYPTED)]
    finally:
        t0 = time.monotonic()
        s.stop()
        print(f"stopped in {time.monotonic() - t0:.1f} s")


def _keystore(directory, password):
    """A self-signed PKCS12 keystore (key and trust store alike) made by JDK 17's keytool."""
    path = directory / "spark.p12"
    subprocess.run(["keytool", "-genkeypair", "-alias", "spark", "-keyalg", "RSA", "-keysize",
                    "2048", "-dname", "CN=localhost", "-ext", "SAN=dns:localhost,ip:127.0.0.1",
                    "-validity", "2", "-storetype", "PKCS12", "-keystore", str(path),
                    "-storepass", password, "-keypass", password],
                   check=True, capture_output=True, timeout=120)
    return str(path)


@pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v keytool"],
                                   capture_output=True).returncode != 0,
                    reason="needs the JDK's keytool")
def test_trains_where_spark_ssl_is_on_and_stock_refuses(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    password = os.urandom(8).hex()
    store = _keystore(tmp_path, password)
    t0 = time.monotonic()
    s = tsp_spark.session(MASTER, {
        "spark.ssl.enabled": "true", "spark.ssl.keyStore": store, "spark.ssl.keyStoreType": "PKCS12",
        "spark.ssl.keyStorePassword": password, "spark.ssl.keyPassword": password,
        "spark.ssl.trustStore": store, "spark.ssl.trustStoreType": "PKCS12",
        "spark.ssl.trustStorePassword": password, "spark.ssl.rpc.enabled": "true"})
    print(f"session in {time.monotonic() - t0:.1f} s")
    try:
        stock = StockDistributor(num_processes=1, local_mode=False, use_gpu=False)
        with pytest.raises(RuntimeError) as refused:
            stock._check_encryption()
        assert "This cluster has TLS encryption enabled" in str(refused.value)
        assert "pytorch.spark.distributor.ignoreSsl" in str(refused.value)
        assert _train(caplog) == [("WARNING", "Spark secures its own traffic here "
                                   "(spark.ssl.enabled=true, spark.ssl.rpc.enabled=true); "
                                   "torchspark's own channel to the "
                                   "driver (worker lines, control, rank 0's output) is TLS 1.3 "
                                   "keyed by the run's secret, but " + NOT_ENCRYPTED)]
        # Stock's override is accepted and changes nothing but the line's last words.
        s.conf.set("pytorch.spark.distributor.ignoreSsl", "true")
        stock._check_encryption()
        caplog.clear()
        TorchDistributor(num_processes=1, local_mode=False, use_gpu=False)._check_encryption()
        (level, line), = _lines(caplog)
        assert level == "WARNING" and line.endswith(
            "(pytorch.spark.distributor.ignoreSsl=true is accepted for compatibility and changes "
            "nothing: torchspark sends nothing in clear over its own channel)")
    finally:
        t0 = time.monotonic()
        s.stop()
        print(f"stopped in {time.monotonic() - t0:.1f} s")
