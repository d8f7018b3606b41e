"""The orphan census: however a job ends, no process of it is left (docs/cli.md,
"Processes left behind").

Three workers, each leaving two descendants that ignore SIGTERM (one in the worker's process
group, one double-forked into a session of its own, as a daemonizing library does). Every
process carries the test's TSP_TEST_MARKER in its environment; after each way of ending the
job the census counts the marked processes still alive, and it must be 0 in all five:
a worker exits, a worker is SIGKILLed, the agent gets SIGTERM, the agent is SIGKILLed (its
sentinel sweeps), and the agent's parent is SIGKILLed (the agent's parent-death signal).
"""
from __future__ import annotations

import os
import signal

import pytest

from tests.helpers.agentutil import (PY, WORKER, base_env, finish, free_port, marked_pids, new_marker,
                       start, survivors, tsr_cmd, wait_for_files)

NPROC = 3


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    survivors(m, wait=0)  # cleanup only; the test asserts on survivors() itself


def _agent(out, fail_rank: int) -> list[str]:
    return tsr_cmd("--master-port", str(free_port()), "--nproc-per-node", str(NPROC),
                   "--shutdown-timeout", "2", WORKER, "orphans", str(out), str(fail_rank))


def _wait_ready(out, proc) -> list[int]:
    wait_for_files([out / f"ready.{i}" for i in range(NPROC)], proc=proc)
    return [int((out / f"ready.{i}").read_text()) for i in range(NPROC)]


def _agent_pid(parent_pid: int) -> int:
    with open(f"/proc/{parent_pid}/task/{parent_pid}/children") as f:
        kids = [int(x) for x in f.read().split()]
    assert len(kids) == 1, kids
    return kids[0]


@pytest.mark.parametrize("how", ["worker-exit", "worker-sigkill", "agent-sigterm",
                                 "agent-sigkill", "parent-sigkill"])
def test_orphan_census(tmp_path, marker, how):
    env = base_env(marker)
    if how == "worker-exit":
        p = start(_agent(tmp_path, 1), env)  # local rank 1 exits 1 once all are up
        _wait_ready(tmp_path, p)
        assert len(list(tmp_path.glob("desc.*"))) == 2 * NPROC
        r = finish(p, timeout=60)
        assert r.returncode == 1, r.stderr
    elif how == "parent-sigkill":
        parent = start([PY, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))",
                        *_agent(tmp_path, -1)], env)
        _wait_ready(tmp_path, parent)
        os.kill(parent.pid, signal.SIGKILL)
        finish(parent, timeout=10)
    else:
        p = start(_agent(tmp_path, -1), env)
        workers = _wait_ready(tmp_path, p)
        # every worker, its two descendants, and the agent itself
        assert len(marked_pids(marker)) >= 3 * NPROC + 1
        if how == "worker-sigkill":
            os.kill(workers[1], signal.SIGKILL)
        elif how == "agent-sigterm":
            p.send_signal(signal.SIGTERM)
        else:
            p.kill()
        r = finish(p, timeout=60)
        expected = {"worker-sigkill": 137, "agent-sigterm": 128 + signal.SIGTERM,
                    "agent-sigkill": -signal.SIGKILL}[how]
        assert r.returncode == expected, r.stderr
    assert len(list(tmp_path.glob("desc.*"))) == 2 * NPROC
    left = survivors(marker, wait=5.0)
    assert left == [], f"{how}: {len(left)} processes left behind:\n" + "\n".join(left)
