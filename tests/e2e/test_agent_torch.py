"""Real torch under torchspark-run: DDP gives the very same parameters as under torchrun, and a
torch.distributed.rpc program initialised from the environment runs with 3 workers."""
from __future__ import annotations

import torch

from tests.helpers.agentutil import (SCRIPTS, base_env, free_port, load_json, new_marker, run, survivors,
                       torchrun_cmd, tsr_cmd)

DDP = str(SCRIPTS / "ddp_bitexact.py")
RPC = str(SCRIPTS / "rpc_workers.py")


def _train(mk, tmp_path, name):
    marker = new_marker()
    outdir = tmp_path / name
    outdir.mkdir()
    r = run(mk("--nproc-per-node", "2", "--master-port", str(free_port()), DDP, str(outdir)),
            base_env(marker), timeout=120)
    assert r.returncode == 0, f"{name} failed ({r.returncode}):\n{r.stderr}"
    assert survivors(marker) == []
    return [torch.load(outdir / f"state.{rank}.pt") for rank in range(2)]


def test_ddp_parameters_bit_identical_to_torchrun(tmp_path):
    theirs = _train(torchrun_cmd, tmp_path, "torchrun")
    ours = _train(tsr_cmd, tmp_path, "ours")
    torch.manual_seed(1234)
    init = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).state_dict()
    assert list(theirs[0]) == list(ours[0]) == list(init)
    for key in init:
        # Training moved the parameters (else the comparison below would prove nothing),
        # DDP kept the ranks in step, and the two launchers agree bit for bit.
        assert not torch.equal(ours[0][key], init[key]), key
        assert torch.equal(ours[0][key], ours[1][key]), key
        assert torch.equal(theirs[0][key], theirs[1][key]), key
        assert torch.equal(theirs[0][key], ours[0][key]), key


def test_rpc_three_workers(tmp_path):
    marker = new_marker()
    r = run(tsr_cmd("--nproc-per-node", "3", "--master-port", str(free_port()), RPC,
                    str(tmp_path)), base_env(marker), timeout=120)
    assert r.returncode == 0, f"rpc program failed ({r.returncode}):\n{r.stderr}"
    got = load_json(tmp_path / "rpc.json")
    assert got["world"] == 3
    assert [(rank, values) for rank, _pid, values in got["replies"]] == [
        (1, [2.0, 2.0, 2.0]), (2, [3.0, 3.0, 3.0])]
    assert survivors(marker) == []
