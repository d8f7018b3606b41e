"""Loss and order on the driver log channel with real torchspark-run agents and real
worker processes: 8 agents, every line of random length 0..8 KiB (some 2 MiB, split and
reassembled), \\r progress updates and invalid UTF-8 arrives exactly once, in per-rank
order, byte-identical (count and SHA-256 on both ends); the same with the driver's server
restarted mid-run; and a worker that prints and crashes at once.

Sizes: the test runs 8 x 12,000 lines (about 400 MB); the full 8 x 250,000 run is
`bench/logchannel_bench.py --loss-full` (docs/benchmarks.md). LC_TEST_LINES overrides."""
import os
import time

import pytest

from logchannel_harness import (RUN_BIN, Collector, drain_all, expected, pump_until,
                                start_agents)
from torchspark._native import LogServer

NODES = 8
LINES = int(os.environ.get("LC_TEST_LINES", "12000"))


@pytest.fixture(autouse=True)
def _need_agent():
    if not RUN_BIN.exists():
        pytest.fail(f"{RUN_BIN} is missing: build first (bash tests/setup.sh)")


def _finish(procs, timeout=120):
    rcs = []
    for p in procs:
        p.wait(timeout=timeout)
        rcs.append(p.returncode)
    return rcs


def test_every_line_once_in_order(tmp_path):
    srv = LogServer()
    col = Collector()
    procs = start_agents(srv, NODES, LINES, 1500, tmp_path, master_port=29521)
    pump_until(srv, col, lambda: all(p.poll() is not None for p in procs), 300)
    assert _finish(procs) == [0] * NODES, [p.stderr.read().decode()[-2000:] for p in procs]
    srv.close()
    drain_all(srv, col)
    assert col.summary() == expected(tmp_path, NODES)
    assert srv.stats()["rejected"] == 0 and srv.dropped() == {}


def test_driver_restarted_mid_run(tmp_path):
    srv = LogServer()
    host, port, secret = srv.host, srv.port, srv.secret
    col = Collector()
    lines = max(LINES // 2, 2000)
    procs = start_agents(srv, NODES, lines, 0, tmp_path, master_port=29522)
    pump_until(srv, col, lambda: sum(col.count.values()) >= NODES * lines // 4, 120)
    assert sum(col.count.values()) >= NODES * lines // 4
    srv.close(drain_timeout=0.2)  # the driver goes away while agents are mid-stream
    drain_all(srv, col)
    del srv
    time.sleep(1.0)  # lines printed now wait in the agents (writers are slowed)
    srv = LogServer(host=host, port=port, secret=secret)
    pump_until(srv, col, lambda: all(p.poll() is not None for p in procs), 300)
    assert _finish(procs) == [0] * NODES
    srv.close()
    drain_all(srv, col)
    assert col.summary() == expected(tmp_path, NODES)
    for p in procs:
        assert b"cannot reach" not in p.stderr.read()  # the outage was within the grace


def test_line_printed_just_before_a_crash_arrives(tmp_path):
    srv = LogServer()
    col = Collector()
    procs = start_agents(srv, 1, 10, 0, tmp_path, extra_env={"LC_CRASH": "1"},
                         master_port=29523)
    pump_until(srv, col, lambda: procs[0].poll() is not None, 60)
    assert _finish(procs) == [134]  # 128 + SIGABRT
    srv.close()
    drain_all(srv, col)
    assert col.count[0] == 11
    assert srv.tail(0, 1) == [b"last words before the crash"]
