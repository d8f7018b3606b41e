"""Runs driver_job.py in the driver namespace and collects what it printed.

The same test body runs against stock PySpark's TorchDistributor and torchspark's: a
`flavor` names the distributor class the driver program imports.
"""

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from tests.helpers import netns_cluster as nc

HERE = Path(__file__).resolve().parents[1] / "cluster"  # driver_job.py, compose_job.py
DISTRIBUTORS = {
    "stock": "pyspark.ml.torch.distributor:TorchDistributor",
    "torchspark": "torchspark:TorchDistributor",
}
# Short timeouts so that a lost host is noticed by Spark within seconds, not the default 120 s:
# executors heartbeat every 2 s and are declared lost after 20 s of silence.
# A partitioned executor gives up after 5 failed heartbeats (~10-20 s) instead of 60.
FAULT_CONF = {"spark.executor.heartbeatInterval": "2s", "spark.network.timeout": "20s",
              "spark.network.timeoutInterval": "5s", "spark.executor.heartbeat.maxFailures": "5"}

_ts_reason: Optional[str] = None
_ts_checked = False


def torchspark_unavailable() -> Optional[str]:
    """None when `torchspark.TorchDistributor` imports in .venv's python (as the driver runs it)."""
    global _ts_reason, _ts_checked
    if not _ts_checked:
        code = "import torchspark; torchspark.TorchDistributor"
        env = {"PYTHONPATH": str(nc.GLUE_PY), "PATH": "/usr/bin:/bin"}
        r = subprocess.run([str(nc.ROOT / ".venv/bin/python"), "-c", code], capture_output=True,
                           text=True, timeout=120, env=env)
        _ts_reason = None if r.returncode == 0 else (
            "torchspark.TorchDistributor is not available yet (the PySpark backend lands in "
            "spark-glue/python/torchspark): " + (r.stderr.strip().splitlines() or ["?"])[-1])
        _ts_checked = True
    return _ts_reason


@dataclass
class DriverRun:
    results: Dict[str, Dict]  # by run tag
    stdout: str
    stderr: str
    wall: float
    returncode: Optional[int]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def result(self, tag: str) -> Dict:
        return self.results.get(tag) or {
            "tag": tag, "ok": False, "result": None, "error_type": None, "elapsed": None,
            "error": f"driver printed no result for run {tag} (exit {self.returncode}, "
                     f"wall {self.wall:.0f}s); stderr tail:\n{self.stderr[-2000:]}"}


def write_config(cluster, flavor: str, runs: List[Dict], conf: Optional[Dict] = None,
                 tag: str = "job", extra: Optional[Dict] = None) -> Path:
    """runs: [{"tag", "num_processes", "train": {...}}], done in order in one application.
    extra: more of driver_job.py's keys ("env", "spark_timeline")."""
    d = cluster.hosts["driver"]
    cfg = {
        "master_url": cluster.master_url,
        "driver_host": d.name,
        "driver_addr": d.addr,
        "distributor": DISTRIBUTORS[flavor],
        "app": f"tsp-{flavor}-{tag}",
        # Exactly one executor (1 core) per host: N tasks land on N different hosts.
        "conf": {"spark.cores.max": str(max(r["num_processes"] for r in runs)), **(conf or {})},
        "runs": runs,
        **(extra or {}),
    }
    p = Path(cluster.run_dir) / f"{tag}-{flavor}-{time.monotonic_ns()}.json"
    p.write_text(json.dumps(cfg))
    return p


def start_driver(cluster, cfg_path: Path) -> subprocess.Popen:
    out = open(cfg_path.with_suffix(".out"), "wb")
    err = open(cfg_path.with_suffix(".err"), "wb")
    try:
        return cluster.popen("driver", [cluster.python, str(HERE / "driver_job.py"), str(cfg_path)],
                             stdout=out, stderr=err)
    finally:
        out.close()
        err.close()


def finish_driver(cfg_path: Path, p: subprocess.Popen, t0: float, timeout: float) -> DriverRun:
    try:
        p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    wall = time.monotonic() - t0
    out = cfg_path.with_suffix(".out").read_text(errors="replace")
    err = cfg_path.with_suffix(".err").read_text(errors="replace")
    results = {}
    for line in out.splitlines():
        if line.startswith("TSP_RESULT "):
            r = json.loads(line[len("TSP_RESULT "):])
            results[r["tag"]] = r
    return DriverRun(results, out, err, wall, p.returncode)


def run_driver(cluster, flavor: str, runs: List[Dict], timeout: float,
               conf: Optional[Dict] = None) -> DriverRun:
    cfg = write_config(cluster, flavor, runs, conf)
    t0 = time.monotonic()
    return finish_driver(cfg, start_driver(cluster, cfg), t0, timeout)


def training_processes(cluster, hosts: Optional[List[str]] = None) -> List[Dict]:
    """Marked processes on worker hosts that are not Spark's own (JVMs, pyspark.daemon/workers).

    What remains is what a distributor launched for training: torchrun or torchspark-run,
    their wrappers, and the training processes themselves.
    """
    hosts = hosts or cluster.worker_names
    found = []
    for p in nc.marker_processes(cluster.marker):
        host = cluster.host_of_netns(p["netns"])
        if host not in hosts:
            continue
        cmd = p["cmdline"]
        first = cmd.split(" ", 1)[0]
        if first.endswith("/java") or first == "java" or "pyspark.daemon" in cmd:
            continue
        if p.get("comm") == "tsp-warm-pool":  # the executor's warm pool (not its workers)
            continue
        found.append(dict(p, host=host))
    return found


def wait_no_training_processes(cluster, timeout: float) -> List[Dict]:
    deadline = time.monotonic() + timeout
    while True:
        left = training_processes(cluster)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
