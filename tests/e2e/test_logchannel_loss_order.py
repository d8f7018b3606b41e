"""Loss and order on the driver log channel with real torchspark-run agents and real
worker processes: 8 agents, every line of random length 0..8 KiB (some 2 MiB, split and
reassembled), \\r progress updates and invalid UTF-8 arrives exactly once, in per-rank
order, byte-identical (count and SHA-256 on both ends); the same with the driver's server
restarted mid-run; and a worker that prints and crashes at once.

Sizes: the test runs 8 x 12,000 lines (about 400 MB); the full 8 x 250,000 run is
`bench/logchannel_bench.py --loss-full` (docs/benchmarks.md, "Driver log channel and output
shipping"). LC_TEST_LINES overrides."""
import os
import time

import pytest

from tests.helpers.logchannel_harness import (RUN_BIN, Collector, drain_all, expected, pump_until,
                                start_agents)
from tests.helpers.logserver import LogServer

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


def _run_one_agent(srv, script):
    """One agent, one worker running script, streaming to srv; waits for it to succeed."""
    import subprocess
    import sys

    env = dict(os.environ, **srv.agent_env())
    p = subprocess.run([str(RUN_BIN), "--nproc-per-node", "1", "--python", sys.executable,
                        "--log-endpoint", srv.endpoint, str(script)], env=env,
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]


def test_read_text_matches_format_line(tmp_path):
    """The natively formatted batch (what the distributor writes to sys.stderr) is the
    text that format_line gives line by line, invalid UTF-8 and stderr marker included."""
    from tests.helpers.logserver import format_line
    from torchspark.native._native import CONTINUED

    script = tmp_path / "w.py"
    script.write_text("import sys\n"
                      "sys.stdout.buffer.write(b'plain\\nbad \\xff\\xfe utf8\\nbar\\r50%\\rdone\\n')\n"
                      "sys.stderr.buffer.write(b'oops\\n')\n")
    texts = {}
    for mode in ("text", "pull"):
        srv = LogServer()
        _run_one_agent(srv, script)
        srv.close()
        out = []
        while True:
            if mode == "text":
                t = srv.read_text(fmt="<{rank}> ", stderr_marker="E ", timeout_ms=0)
            else:
                t = "".join(format_line(ln, "<{rank}> ", "E ")
                            + ("" if ln.flags & CONTINUED else "\n")
                            for ln in srv.pull(timeout_ms=0))
            if not t:
                break
            out.append(t)
        texts[mode] = sorted("".join(out).splitlines(keepends=True))
    assert texts["text"] == texts["pull"]
    assert "<0> bad \ufffd\ufffd utf8\n" in texts["text"]
    assert "<0> E oops\n" in texts["text"]


def test_distributor_pump_writes_rank_lines_to_stderr(tmp_path, capfd):
    """The distributor's pump (natively formatted batches) puts each worker line on the
    driver's sys.stderr as "[rank N] text", stderr lines with their marker."""
    from torchspark.driver._pump import _LogPump

    script = tmp_path / "w.py"
    script.write_text("import sys\nprint('hello from the worker')\n"
                      "print('to stderr', file=sys.stderr)\n")
    srv = LogServer()
    pump = _LogPump(srv)
    _run_one_agent(srv, script)
    srv.close()
    pump.stop()
    err = capfd.readouterr().err
    assert "[rank 0] hello from the worker\n" in err
    assert "[rank 0] [stderr] to stderr\n" in err
