"""The failure report carries the worker's whole traceback (docs/cli.md, "The failure
report"): a real torch @record worker raising `RuntimeError(...) from ValueError(...)`
under torchspark-run, the 200-line cap, a malformed worker error file quoted as a string,
and the same chained traceback in TorchDistributorError under TorchDistributor.run on
local-cluster (test_distributor_cluster.py holds that one, beside its Spark session)."""
from __future__ import annotations

import json

import pytest

from tests.helpers.agentutil import (SCRIPTS, base_env, failure_block, free_port, load_json, new_marker,
                       root_cause, run, survivors, tsr_cmd)

SCRIPT = str(SCRIPTS / "chained_error.py")


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    survivors(m, wait=0)


def _run(tmp_path, marker, mode):
    err_file = tmp_path / "error.json"
    r = run(tsr_cmd("--master-port", str(free_port()), "--nproc-per-node", "2",
                    "--shutdown-timeout", "2", "--error-file", str(err_file), SCRIPT, mode,
                    marker[:8]), base_env(marker), timeout=120)
    return r, err_file


def test_chained_exception_whole_in_error_file_and_block(tmp_path, marker):
    tag = marker[:8]
    r, err_file = _run(tmp_path, marker, "chain")
    assert r.returncode == 1, r.stderr
    doc = load_json(err_file)
    stack = doc["message"]["extraInfo"]["py_callstack"]
    # the root cause first, the exception raised last at the end, as Python prints a chain
    assert stack.index(f"ValueError: root-{tag}") < stack.index(
        "The above exception was the direct cause of the following exception:") < stack.index(
        f"RuntimeError: outer-{tag}"), stack
    assert doc["message"]["message"] == f"RuntimeError: outer-{tag}"
    ts = doc["torchspark"]
    assert (ts["rank"], ts["exitcode"], ts["signal"]) == (1, 1, 0), ts
    # the agent's own last lines of rank 1, read to the end of its pipes: Python's print of
    # the uncaught exception is the last of them; no other rank's line
    assert ts["tail"].split("\n")[-1] == f"[rank 1] [stderr] RuntimeError: outer-{tag}", ts
    assert "[rank 0]" not in ts["tail"], ts
    block = "\n".join(failure_block(r.stderr))
    assert f"ValueError: root-{tag}" in block and f"RuntimeError: outer-{tag}" in block
    assert survivors(marker) == []


def test_long_traceback_capped_at_200_lines_both_ends_kept(tmp_path, marker):
    tag = marker[:8]
    r, err_file = _run(tmp_path, marker, "deep")
    assert r.returncode == 1, r.stderr
    stack = load_json(err_file)["message"]["extraInfo"]["py_callstack"]
    lines = stack.rstrip("\n").splitlines()
    assert len(lines) <= 201, len(lines)  # 200 kept and the line saying what was left out
    assert any("lines left out" in ln for ln in lines), stack
    assert lines[0] == "Traceback (most recent call last):"  # the root cause's start ...
    assert lines[-1] == f"KeyError: 'last-{tag}'"  # ... and the exception raised last
    assert survivors(marker) == []


def test_malformed_error_file_quoted_as_a_string(tmp_path, marker):
    tag = marker[:8]
    r, err_file = _run(tmp_path, marker, "garbage")
    assert r.returncode == 3, r.stderr
    text = err_file.read_text()
    doc = json.loads(text)  # the agent's document stays valid JSON
    assert "not valid JSON" in doc["message"]["message"]
    assert f"oops-{tag}" in doc["message"]["extraInfo"]["py_callstack"]
    ts = doc["torchspark"]
    assert (ts["rank"], ts["exitcode"], ts["signal"]) == (1, 3, 0), ts
    assert ts["error_file"].endswith("/1/error.json")
    root = root_cause(failure_block(r.stderr))
    assert f"oops-{tag}" in root["traceback"]
    assert survivors(marker) == []
