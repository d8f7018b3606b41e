"""Runs real torchspark-run agents (one per node rank, real worker processes) against the
native log server, collects every line on the driver side, and checks counts and hashes
against what each worker printed. Shared by the e2e tests and bench/logchannel_bench.py."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
from tests.helpers.logserver import LogServer  # noqa: E402
from torchspark.native._native import CONTINUED  # noqa: E402

RUN_BIN = Path(os.environ.get("TORCHSPARK_RUN", ROOT / "build" / "bin" / "torchspark-run"))
WORKER = HERE / "logchannel_worker.py"


class Collector:
    """Reassembles split lines per (rank, stream) and hashes each rank's stdout lines."""

    def __init__(self):
        self.partial: dict = {}
        self.count: dict = {}
        self.hash: dict = {}

    def feed(self, lines) -> None:
        for ln in lines:
            if ln.rank < 0:
                continue
            key = (ln.rank, ln.stream)
            if ln.flags & CONTINUED:
                self.partial.setdefault(key, []).append(ln.data)
                continue
            data = ln.data
            if key in self.partial:
                data = b"".join(self.partial.pop(key)) + data
            if ln.stream != 1:
                continue
            h = self.hash.setdefault(ln.rank, hashlib.sha256())
            h.update(struct.pack(">I", len(data)))
            h.update(data)
            self.count[ln.rank] = self.count.get(ln.rank, 0) + 1

    def summary(self) -> dict:
        return {r: {"count": self.count[r], "sha256": self.hash[r].hexdigest()}
                for r in self.count}


def start_agents(srv: LogServer, nodes: int, lines: int, big_every: int, summary_dir: Path,
                 extra_env: dict | None = None, extra_args: list | None = None,
                 master_port: int = 29511):
    env = dict(os.environ, LC_LINES=str(lines), LC_BIG_EVERY=str(big_every),
               LC_SUMMARY_DIR=str(summary_dir), **srv.agent_env(), **(extra_env or {}))
    procs = []
    for node in range(nodes):
        cmd = [str(RUN_BIN), "--nnodes", str(nodes), "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
               "--master-port", str(master_port), "--python", sys.executable,
               "--log-endpoint", srv.endpoint, *(extra_args or []), str(WORKER)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    return procs


def expected(summary_dir: Path, nodes: int) -> dict:
    return {r: json.loads((summary_dir / ("%d.json" % r)).read_text()) for r in range(nodes)}


def drain_all(srv: LogServer, col: Collector) -> None:
    """Pulls what is queued (after close(): everything that is left)."""
    while True:
        lines = srv.pull(8192, 0)
        if not lines:
            return
        col.feed(lines)


def pump_until(srv: LogServer, col: Collector, done, timeout: float) -> None:
    deadline = time.time() + timeout
    while not done() and time.time() < deadline:
        col.feed(srv.pull(8192, 100))
