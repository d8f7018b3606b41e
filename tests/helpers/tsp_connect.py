"""A real local Spark Connect server for the Connect suites, on local-cluster[2,1,1024].

The server is pyspark's own (the package carries spark-connect_2.13-*.jar), started with
spark-submit as sbin/start-connect-server.sh does; its executors run this interpreter.
One server per pytest session (a JVM and two executors cost ~20 s on 2 cores): use the
session-scoped fixture in conftest.py, which also puts this process back in classic
mode afterwards (the Connect builder marks the whole process as a Connect client).

The server binds port 0 and the test reads the port it got from its log: a port picked
free here and bound by the server seconds later (after its JVM started) could be taken in
between, e.g. by the other pytest worker's Spark JVMs, and failed every Connect module.
"""
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import pyspark

SPARK_HOME = os.path.dirname(pyspark.__file__)
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# SparkConnectServer's line once its gRPC server listens; the address is the listen
# socket's (SparkConnectService.bindingAddress, from Server.getListenSockets), so with
# spark.connect.grpc.binding.port=0 it names the port the kernel gave.
STARTED = re.compile(rb"Spark Connect server started at: \S*:(\d+)")


class ConnectServer:
    def __init__(self, log_dir: Path, conf: Dict[str, str],
                 master: str = "local-cluster[2,1,1024]",
                 env: Optional[Dict[str, str]] = None) -> None:
        self.port: Optional[int] = None  # known once wait_ready() read it from the log
        self.log_path = log_dir / "connect-server.log"
        confs = {"spark.connect.grpc.binding.port": "0",
                 "spark.ui.enabled": "false", "spark.testing": "true",
                 "spark.test.home": SPARK_HOME, "spark.executor.memory": "1024m",
                 "spark.python.worker.reuse": "true", **conf}
        cmd = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--class", SERVER_CLASS,
               "--name", "torchspark-connect-e2e", "--master", master]
        for k, v in confs.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")
        penv = {k: v for k, v in os.environ.items()
                if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")}
        penv.update({"SPARK_HOME": SPARK_HOME, "PYSPARK_PYTHON": sys.executable,
                     "SPARK_CONNECT_MODE": "0", **(env or {})})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=penv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def url(self) -> str:
        assert self.port is not None, "wait_ready() first"
        return f"sc://localhost:{self.port}"

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Connect server exited ({self.proc.returncode}): "
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
            if self.port is None:
                started = STARTED.search(self.log_path.read_bytes())
                if started:
                    self.port = int(started.group(1))
            if self.port is not None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"the Connect server did not listen (port {self.port}) in {timeout} "
                           f"s: {self.log_path.read_text(errors='replace')[-3000:]}")

    def session(self):
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.url).getOrCreate()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._log.close()


def back_to_classic() -> None:
    """Undoes what the Connect builder did to this process, for the classic suites after."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and getattr(active, "is_stopped", True) is False:
        active.stop()
    for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(var, None)
