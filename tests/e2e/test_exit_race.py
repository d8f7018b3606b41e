"""Function mode and script mode survive torch's exit race: a 2-node gloo DDP run whose gloo
worker threads drop their last work late (after the function or script returned) ends with
every rank exiting 0, never SIGABRT ("terminate called without an active exception").

Before the fix (_fn_runner ending through Py_FinalizeEx) 3 runs out of 4 had a rank killed
by SIGABRT with this widened window; the same script under torchrun aborts alike. Script
mode shows it in the same run: with TORCHSPARK_PYTHON_EXIT=finalize (plain `python -u
SCRIPT`, as torchrun starts it) the script aborts, through the bootstrap it never does."""
from __future__ import annotations

import ast
import pickle
import subprocess
import time

from pyspark import cloudpickle

from tests.helpers.agentutil import SCRIPTS, base_env, free_port, new_marker, survivors, tsr_cmd

RUNS = 3


def _run_two_nodes(tmp_path, i: int, marker: str) -> list[tuple[int, str, str]]:
    import late_gloo  # noqa: F401  (by reference: the workers import it from SCRIPTS)

    fn_file = tmp_path / f"fn{i}.pkl"
    with open(fn_file, "wb") as f:
        cloudpickle.dump((late_gloo.late_gloo_fn, (4,), {}), f)
    return _launch_two_nodes(
        base_env(marker, PYTHONPATH=str(SCRIPTS)),
        lambda node: ["-m", "torchspark.worker._fn_runner", str(fn_file),
                      str(tmp_path / f"out{i}.{node}")])


def _launch_two_nodes(env: dict[str, str], target,
                      allow_timeout: bool = False) -> list[tuple[int, str, str]]:
    """Node 0 and node 1 (one worker each) running target(node); (status, stdout, stderr).
    With allow_timeout, a node still going after 90 s is stopped (SIGTERM to its agent,
    which stops its worker; SIGKILL after 15 s) and reported with status None, the other
    node's result kept (a rank that aborted is seen even if its peer hung)."""
    port = str(free_port())
    procs = [subprocess.Popen(
        tsr_cmd("--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                "--master-port", port, "--nproc-per-node", "1", *target(node)),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    deadline = time.monotonic() + 90
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((p.returncode, out, err))
        except subprocess.TimeoutExpired:
            if not allow_timeout:
                raise
            results.append(None)
    for i, p in enumerate(procs):
        if results[i] is None:
            p.terminate()
            try:
                out, err = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            results[i] = (None, out, f"timed out\n{err}")
    return results


def test_function_mode_ranks_never_abort_at_exit(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    marker = new_marker()
    for i in range(RUNS):
        results = _run_two_nodes(tmp_path, i, marker)
        for node, (code, _out, err) in enumerate(results):
            assert code == 0 and "SIGABRT" not in err and "terminate called" not in err, (
                f"run {i}, node {node} exited {code}:\n{err}")
        with open(tmp_path / f"out{i}.0", "rb") as f:
            got = pickle.load(f)
        # Rank 0's value came back and the window really was widened.
        assert got["rank"] == 0 and got["world"] == 2 and got["starved_threads"] >= 2, got
        assert not (tmp_path / f"out{i}.1").exists()  # only rank 0 writes the result
    assert survivors(marker) == []


def _aborted(results) -> bool:
    return any(code == 128 + 6 and "terminate called" in err for code, _out, err in results)


def test_script_mode_aborts_when_the_interpreter_finalizes():
    """The opt-out (plain `python -u SCRIPT`) proves that the window is open: a rank aborts.
    In script mode late_gloo holds the race open for certain (rank 0's gloo thread waits for
    the GIL when finalization begins, late_gloo.py's docstring), so one run is enough:
    widened alone, a loaded CPU let 4 runs of 7 end without an abort, and a starved
    finalization could hang past the bound (seen once in CI)."""
    marker = new_marker()
    env = base_env(marker, TORCHSPARK_PYTHON_EXIT="finalize")
    results = _launch_two_nodes(env, lambda node: [str(SCRIPTS / "late_gloo.py"), "4"],
                                allow_timeout=True)
    assert _aborted(results), f"no SIGABRT: {results}"
    assert survivors(marker) == []


def test_script_mode_ranks_never_abort_at_exit():
    marker = new_marker()
    env = base_env(marker)
    for i in range(RUNS):
        results = _launch_two_nodes(env, lambda node: [str(SCRIPTS / "late_gloo.py"), "4"])
        for node, (code, out, err) in enumerate(results):
            assert code == 0 and "SIGABRT" not in err and "terminate called" not in err, (
                f"run {i}, node {node} exited {code}:\n{err}")
            # the script finished and the window really was widened
            got = ast.literal_eval(out.strip().splitlines()[-1])
            assert got["rank"] == node and got["world"] == 2 and got["starved_threads"] >= 2, out
    assert survivors(marker) == []
