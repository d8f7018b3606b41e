"""Failures, signals, restarts and bad input under torchspark-run.

Every test marks the agent, its workers and their descendants with a unique TSP_TEST_MARKER
in the environment, and ends by counting the marked processes still alive after a short
bounded wait: it must be 0 whatever happened (agentutil.survivors kills leftovers so that a
failure does not leak into the next test).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.agentutil import (PY, WORKER, base_env, failure_block, finish, free_port, load_json,
                       new_marker, root_cause, run, start, survivors, torchrun_cmd, tsr_cmd,
                       wait_for_files)


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    survivors(m, wait=0)  # cleanup only; each test asserts on survivors() itself


def _agent(*args: str) -> list[str]:
    return tsr_cmd("--master-port", str(free_port()), *args)


def _finish(p: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str]:
    r = finish(p, timeout)
    return r.returncode, r.stdout, r.stderr


def _pid(out: Path, local_rank: int) -> int:
    return int((out / f"pid.{local_rank}").read_text())


# ---------------------------------------------------------------- worker failures


def test_worker_exits_3_while_others_sleep(tmp_path, marker):
    err_file = tmp_path / "error.json"
    t0 = time.monotonic()
    # The default 30 s grace is kept: sleeping workers die at SIGTERM, so the agent must not
    # wait for the grace to run out.
    r = run(_agent("--nproc-per-node", "3", "--error-file", str(err_file), WORKER, "fail",
                   str(tmp_path), "1", "3"), base_env(marker), timeout=25)
    elapsed = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert elapsed < 10, f"took {elapsed:.1f}s: waited for the SIGTERM grace?"
    block = failure_block(r.stderr)
    assert block[1] == f"{WORKER} FAILED", block[1]  # torchrun: the script as given
    root = root_cause(block)
    pid = _pid(tmp_path, 1)
    assert root["rank"] == "1 (local_rank: 1)", root
    assert re.fullmatch(rf"3 \(pid: {pid}\)", root["exitcode"]), root
    assert root["error_file"] == "<N/A>"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d", root["time"]), root
    assert root["host"] in (socket.gethostname(), socket.getfqdn())

    doc = load_json(err_file)
    ts = doc["torchspark"]
    assert (ts["rank"], ts["local_rank"], ts["node_rank"], ts["exitcode"], ts["signal"],
            ts["pid"], ts["error_file"]) == (1, 1, 0, 3, 0, pid, None), ts
    assert ts["host"] in (socket.gethostname(), socket.getfqdn())
    assert ts["time"]
    msg = doc["message"]
    assert isinstance(msg["message"], str) and msg["message"]
    assert msg["extraInfo"]["timestamp"].isdigit()
    assert abs(int(msg["extraInfo"]["timestamp"]) - time.time()) < 120
    assert survivors(marker) == []


def test_worker_sigkilled(tmp_path, marker):
    err_file = tmp_path / "error.json"
    r = run(_agent("--nproc-per-node", "2", "--error-file", str(err_file), WORKER, "selfkill",
                   str(tmp_path)), base_env(marker), timeout=25)
    assert r.returncode == 137, r.stderr
    root = root_cause(failure_block(r.stderr))
    pid = _pid(tmp_path, 1)
    assert root["rank"] == "1 (local_rank: 1)", root
    assert root["exitcode"].startswith(f"-9 (pid: {pid})"), root
    assert root["traceback"] == f"Signal 9 (SIGKILL) received by PID {pid}", root
    ts = load_json(err_file)["torchspark"]
    assert (ts["rank"], ts["exitcode"], ts["signal"], ts["pid"]) == (1, 137, 9, pid), ts
    assert survivors(marker) == []


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGABRT"])
def test_worker_dies_of_signal(tmp_path, marker, sig):
    r = run(_agent("--nproc-per-node", "2", WORKER, "selfkill", str(tmp_path), sig),
            base_env(marker), timeout=25)
    num = getattr(signal, sig)
    assert r.returncode == 128 + num, r.stderr
    root = root_cause(failure_block(r.stderr))
    assert root["traceback"] == f"Signal {num} ({sig}) received by PID {_pid(tmp_path, 1)}"
    assert survivors(marker) == []


def test_failure_during_startup(tmp_path, marker):
    # Local rank 0 exits at once, while the agent may still be starting the other seven.
    for attempt in range(3):
        out = tmp_path / str(attempt)
        out.mkdir()
        r = run(_agent("--nproc-per-node", "8", WORKER, "fail", str(out), "0", "3", "now"),
                base_env(marker), timeout=25)
        assert r.returncode == 3, r.stderr
        assert root_cause(failure_block(r.stderr))["rank"] == "0 (local_rank: 0)"
        assert survivors(marker) == []


def test_stubborn_workers_killed_after_grace(tmp_path, marker):
    # The others ignore SIGTERM: they get SIGKILL once --shutdown-timeout runs out.
    t0 = time.monotonic()
    r = run(_agent("--nproc-per-node", "3", "--shutdown-timeout", "1", WORKER, "fail",
                   str(tmp_path), "1", "3", "stubborn"), base_env(marker), timeout=30)
    elapsed = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert 1.0 <= elapsed < 12, elapsed
    assert survivors(marker) == []


def test_second_sigterm_kills_at_once(tmp_path, marker):
    p = start(_agent("--nproc-per-node", "2", WORKER, "fail", str(tmp_path), "-1", "0",
                     "stubborn"), base_env(marker))
    wait_for_files([tmp_path / f"ready.{i}" for i in range(2)], proc=p)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert p.poll() is None, "the agent did not wait for SIGTERM-ignoring workers"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc, _out, err = _finish(p, timeout=20)
    assert time.monotonic() - t0 < 5, "the second SIGTERM did not kill at once (grace is 30 s)"
    assert rc == 143, err
    assert survivors(marker) == []


def test_signal_exitcode_line_as_torchrun(tmp_path, marker):
    r = run(_agent("--nproc-per-node", "2", WORKER, "selfkill", str(tmp_path)),
            base_env(marker), timeout=25)
    assert r.returncode == 137, r.stderr
    root = root_cause(failure_block(r.stderr))
    assert root["exitcode"] == f"-9 (pid: {_pid(tmp_path, 1)})  (SIGKILL)", root
    assert survivors(marker) == []


def test_grandchildren_ignoring_sigterm_are_killed(tmp_path, marker):
    # Each worker leaves a SIGTERM-ignoring child in its process group and a double-forked
    # one in a session of its own (reparented to the agent, a subreaper); local rank 1 fails.
    # The default 30 s grace is kept: once every worker is gone, what is left of the tree
    # gets SIGKILL at once, so the run must end well before the grace.
    t0 = time.monotonic()
    r = run(_agent("--nproc-per-node", "2", WORKER, "orphans", str(tmp_path), "1"),
            base_env(marker), timeout=40)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 15
    pids = [int(p.read_text()) for p in tmp_path.glob("desc.*")]
    assert len(pids) == 4
    left = survivors(marker)
    assert left == [], f"descendants {pids} left: {left}"


@pytest.mark.parametrize("mode", ["sleep", "orphans"])
def test_agent_parent_sigkilled_kills_tree(tmp_path, marker, mode):
    # The parent stands for a Spark Python worker: when it is SIGKILLed, the agent, every
    # worker and (mode "orphans") the workers' SIGTERM-ignoring descendants, including
    # double-forked ones in sessions of their own, must all die.
    agent = _agent("--nproc-per-node", "2", WORKER, mode, str(tmp_path),
                   "60" if mode == "sleep" else "-1")
    parent = start([PY, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))",
                     *agent], base_env(marker))
    wait_for_files([tmp_path / f"ready.{i}" for i in range(2)], proc=parent)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    assert survivors(marker) == []


# ---------------------------------------------------------------- signals to the agent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT],
                         ids=lambda s: s.name)
def test_agent_signal_forwarded_and_status(tmp_path, marker, sig):
    p = start(_agent("--nproc-per-node", "2", WORKER, "signals", str(tmp_path)),
               base_env(marker))
    wait_for_files([tmp_path / f"ready.{i}" for i in range(2)], proc=p)
    p.send_signal(sig)
    rc, _out, err = _finish(p)
    assert rc == 128 + sig, f"status {rc}, expected {128 + sig}:\n{err}"
    for i in range(2):
        assert (tmp_path / f"sig.{i}.{sig.name}").exists(), f"worker {i} did not get {sig.name}"
    assert survivors(marker) == []


def test_sigusr1_sigusr2_forwarded(tmp_path, marker):
    p = start(_agent("--nproc-per-node", "2", WORKER, "signals", str(tmp_path)),
               base_env(marker))
    wait_for_files([tmp_path / f"ready.{i}" for i in range(2)], proc=p)
    p.send_signal(signal.SIGUSR2)  # recorded; the workers keep running
    wait_for_files([tmp_path / f"sig.{i}.SIGUSR2" for i in range(2)], timeout=10, proc=p)
    p.send_signal(signal.SIGUSR1)  # recorded; the workers then exit 0
    rc, _out, err = _finish(p)
    assert rc == 0, err
    assert all((tmp_path / f"sig.{i}.SIGUSR1").exists() for i in range(2))
    assert survivors(marker) == []


# ---------------------------------------------------------------- restarts and @record


def test_max_restarts_then_success(tmp_path, marker):
    r = run(_agent("--nproc-per-node", "2", "--max-restarts", "2", WORKER, "restart",
                   str(tmp_path), "2"), base_env(marker), timeout=60)
    assert r.returncode == 0, r.stderr
    # Every attempt restarts the whole local group, as torchrun does, with a fresh
    # attempt_<n> error file, and nothing of the previous attempt survives into the next.
    for i in range(2):
        assert (tmp_path / f"restarts.{i}").read_text() == "0\n1\n2\n"
    assert list(tmp_path.glob("bad-error-file.*")) == []
    assert list(tmp_path.glob("stray-alive.*")) == []
    assert survivors(marker) == []


def test_max_restarts_exhausted(tmp_path, marker):
    r = run(_agent("--nproc-per-node", "2", "--max-restarts", "1", WORKER, "restart",
                   str(tmp_path), "5"), base_env(marker), timeout=60)
    assert r.returncode == 1, r.stderr
    assert (tmp_path / "restarts.0").read_text() == "0\n1\n"
    assert root_cause(failure_block(r.stderr))["rank"] == "0 (local_rank: 0)"
    assert survivors(marker) == []


def test_record_decorator_exception_in_report(tmp_path, marker):
    text = f"boom-{marker[:8]}"
    err_file = tmp_path / "error.json"
    log_dir = tmp_path / "logs"  # given, so it is kept and the worker's own file is read
    r = run(_agent("--nproc-per-node", "2", "--error-file", str(err_file), "--log-dir",
                   str(log_dir), WORKER, "record", str(tmp_path), text), base_env(marker),
            timeout=90)
    assert r.returncode == 1, r.stderr
    root = root_cause(failure_block(r.stderr))
    assert root["rank"] == "1 (local_rank: 1)", root
    assert root["error_file"].endswith("/attempt_0/1/error.json"), root
    assert f"ValueError: {text}" in root["traceback"], root["traceback"]
    assert "Traceback (most recent call last)" in root["traceback"]
    doc = load_json(err_file)
    assert doc["message"]["message"] == f"ValueError: {text}"
    assert "raise ValueError" in doc["message"]["extraInfo"]["py_callstack"]
    ts = doc["torchspark"]
    assert (ts["rank"], ts["exitcode"], ts["pid"]) == (1, 1, _pid(tmp_path, 1)), ts
    assert ts["error_file"] == root["error_file"]
    # The "message" part is the worker's own error file, unchanged.
    assert ts["error_file"].startswith(str(log_dir) + "/")
    assert load_json(Path(ts["error_file"]))["message"] == doc["message"]
    assert survivors(marker) == []


# ---------------------------------------------------------------- bad input


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{err}"
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["--bogus-option", "2", WORKER, "sleep", "x", "1"], "--bogus-option"),
    (["--nproc-per-node", "abc", WORKER, "sleep", "x", "1"], "abc"),
    (["--nproc-per-node", "0", WORKER, "sleep", "x", "1"], "nproc"),
    (["--max-restarts", "-1", WORKER, "sleep", "x", "1"], "max"),
    (["--master-port", "70000", WORKER, "sleep", "x", "1"], "70000"),
    (["--nnodes", "2", "--node-rank", "2", WORKER, "sleep", "x", "1"], "node"),
    (["--nproc-per-node", "2"], "script"),
    (["--ma", "1", WORKER, "sleep", "x", "1"], "ambiguous"),
    (["--nnodes", "1:2", WORKER, "sleep", "x", "1"], "1:2"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "[::1", WORKER, "sleep", "x",
      "1"], "--rdzv-endpoint must be"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:0", WORKER, "sleep", "x",
      "1"], "'h:0'"),
    (["--log-endpoint", "no-port", WORKER, "sleep", "x", "1"], "HOST:PORT, not 'no-port'"),
    (["--log-endpoint", "127.0.0.1:9", WORKER, "sleep", "x", "1"], "TORCHSPARK_LOG_SECRET"),
], ids=["unknown-option", "bad-number", "nproc-0", "negative-restarts", "port-range",
        "node-rank-range", "missing-script", "ambiguous-prefix", "elastic-range",
        "rdzv-unclosed-bracket", "rdzv-port-0", "log-endpoint-no-port", "log-secret-unset"])
def test_usage_errors(marker, args, needle):
    r = run(tsr_cmd(*args), base_env(marker), timeout=10)
    assert r.returncode == 2, f"status {r.returncode}:\n{r.stderr}"
    line = _one_line(r.stderr)
    assert needle.lower() in line.lower(), line
    assert survivors(marker) == []


def test_program_not_found_127(tmp_path, marker):
    missing = str(tmp_path / "no-such-program")
    # Not restarted: an exec error would fail the same way again.
    r = run(tsr_cmd("--no-python", "--nproc-per-node", "2", "--max-restarts", "3", missing),
            base_env(marker), timeout=15)
    assert r.returncode == 127, r.stderr
    assert missing in r.stderr and "No such file" in r.stderr, r.stderr
    assert survivors(marker) == []


def test_program_not_executable_126(tmp_path, marker):
    prog = tmp_path / "not-executable.sh"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o644)
    r = run(tsr_cmd("--no-python", "--nproc-per-node", "2", str(prog)), base_env(marker),
            timeout=15)
    assert r.returncode == 126, r.stderr
    assert str(prog) in r.stderr and "Permission denied" in r.stderr, r.stderr
    assert survivors(marker) == []


def test_missing_python_script(tmp_path, marker):
    missing = str(tmp_path / "no_such_train.py")
    r = run(tsr_cmd("--nproc-per-node", "2", missing), base_env(marker), timeout=15)
    assert r.returncode == 2, r.stderr  # python's own status for a script it cannot open
    assert missing in r.stderr
    assert survivors(marker) == []


def test_master_port_in_use(tmp_path, marker):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run(tsr_cmd("--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                        "--master-port", str(port), WORKER, "env", str(tmp_path)),
                base_env(marker), timeout=15)
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert str(port) in line and "in use" in line.lower(), line
    assert list(tmp_path.iterdir()) == [], "workers were started"
    assert survivors(marker) == []


# ---------------------------------------------------------------- srun / mpirun derivation


@pytest.mark.parametrize("env_vars, source", [
    ({"SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_PROCID": "1"}, "SLURM"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "PMI"),
], ids=["slurm", "openmpi", "pmi"])
def test_node_rank_from_scheduler(tmp_path, marker, env_vars, source):
    r = run(_agent("--nproc-per-node", "2", WORKER, "env", str(tmp_path)),
            base_env(marker, **env_vars), timeout=20)
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0] if r.stderr else ""
    assert source in first, f"first log line does not name {source}: {first!r}"
    envs = {int(json.loads(f.read_text())["env"]["RANK"]): json.loads(f.read_text())["env"]
            for f in tmp_path.glob("env.*.json")}
    assert sorted(envs) == [2, 3]
    for rank, env in envs.items():
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["WORLD_SIZE"],
                env["LOCAL_RANK"]) == ("1", "2", "4", str(rank - 2)), env
    assert survivors(marker) == []


def test_explicit_node_rank_beats_scheduler(tmp_path, marker):
    r = run(_agent("--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2", WORKER, "env",
                   str(tmp_path)), base_env(marker, SLURM_NODEID="1", SLURM_NNODES="2"),
            timeout=20)
    assert r.returncode == 0, r.stderr
    envs = [json.loads(f.read_text())["env"] for f in tmp_path.glob("env.*.json")]
    assert sorted((e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs) == [
        ("0", "0", "2"), ("1", "0", "2")]
    assert survivors(marker) == []


# ---------------------------------------------------------------- torchrun, for contrast


def test_torchrun_reference_behaviour(tmp_path, marker):
    """What the contract improves on: torchrun exits 1 whatever the worker returned.
    Guards the premise of the status tests above against a torch upgrade."""
    r = run(torchrun_cmd("--nproc-per-node", "2", "--master-port", str(free_port()), WORKER,
                         "fail", str(tmp_path), "1", "3"), base_env(marker), timeout=60)
    assert r.returncode == 1
    root = root_cause(failure_block(r.stderr))
    assert root["rank"] == "1 (local_rank: 1)" and root["exitcode"].startswith("3 (pid: ")
    assert survivors(marker) == []

