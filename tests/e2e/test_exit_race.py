"""Function mode survives torch's exit race: a 2-node gloo DDP run whose gloo worker
threads drop their last work late (after the function returned) ends with every rank
exiting 0, never SIGABRT ("terminate called without an active exception").

Before the fix (_fn_runner ending through Py_FinalizeEx) 3 runs out of 4 had a rank killed
by SIGABRT with this widened window; the same script under torchrun aborts alike."""
from __future__ import annotations

import pickle
import subprocess

from pyspark import cloudpickle

from agentutil import SCRIPTS, base_env, free_port, new_marker, survivors, tsr_cmd

RUNS = 3


def _run_two_nodes(tmp_path, i: int, marker: str) -> list[tuple[int, str, str]]:
    import late_gloo  # noqa: F401  (by reference: the workers import it from SCRIPTS)

    fn_file = tmp_path / f"fn{i}.pkl"
    with open(fn_file, "wb") as f:
        cloudpickle.dump((late_gloo.late_gloo_fn, (4,), {}), f)
    port = str(free_port())
    env = base_env(marker, PYTHONPATH=str(SCRIPTS))
    procs = [subprocess.Popen(
        tsr_cmd("--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                "--master-port", port, "--nproc-per-node", "1",
                "-m", "torchspark._fn_runner", str(fn_file), str(tmp_path / f"out{i}.{node}")),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        results.append((p.returncode, out, err))
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
