"""The golden contract files (tests/contracts/*.json) through the Python glue's binding.
JUnit's ContractTest reproduces the same cases through JNI: one C transform, two glues,
no twins (docs/architecture.md, "One contract")."""
import json
import pathlib

import pytest

from torchspark import _launch

CONTRACTS = pathlib.Path(__file__).resolve().parents[1] / "contracts"
PLAN_CASES = json.loads((CONTRACTS / "plan_argv.json").read_text())["cases"]


@pytest.mark.parametrize("case", PLAN_CASES, ids=[c["name"] for c in PLAN_CASES])
def test_plan_argv_golden(case):
    if "argv" in case:
        assert _launch.plan_argv(case["plan"]) == case["argv"]
    else:
        with pytest.raises(ValueError) as e:
            _launch.plan_argv(case["plan"])
        assert case["error"] in str(e.value)


def test_agent_command_is_the_plan_plus_the_program(monkeypatch):
    monkeypatch.setenv("TORCHSPARK_NCCL_LIB", "/x/libnccl.so.2")
    cmd = _launch.agent_command(standalone=False, nnodes=2, node_rank=1, nproc_per_node=1,
                                error_file="e", program=["-m", "mod", "arg"],
                                master_addr="h", master_port=5, gpus="0", nccl_check=30)
    assert cmd[-3:] == ["-m", "mod", "arg"]
    assert "--nccl-lib=/x/libnccl.so.2" in cmd and "--gpus=0" in cmd


def test_a_bad_plan_names_the_key():
    with pytest.raises(ValueError, match='"nnodes" must be a whole number >= 1'):
        _launch.plan_argv({"agent": "a", "python": "p", "error_file": "e", "nnodes": 0})
    with pytest.raises(ValueError, match="not a JSON object"):
        _launch.plan_argv([])  # type: ignore[arg-type]
