"""Real torch under torchspark-run: DDP gives the very same parameters as under torchrun, and a
torch.distributed.rpc program initialised from the environment runs with 3 workers."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
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


def test_standalone_port_held_on_every_local_address(tmp_path):
    # --standalone reserves MASTER_PORT where rank 0's TCPStore binds it: the wildcard. A
    # reservation on 127.0.0.1 alone let the kernel hand out a port that another local address
    # held (a server on the host's own address), and TCPStore then failed with EADDRINUSE
    # (local mode's flake). While the run holds the port, a bind on 127.0.0.2 fails, and a
    # TCPStore-like wildcard listener with SO_REUSEADDR binds over the reservation.
    prog = tmp_path / "probe.py"
    prog.write_text(
        "import errno, json, os, socket, sys\n"
        "port = int(os.environ['MASTER_PORT'])\n"
        "other = socket.socket()\n"
        "try:\n"
        "    other.bind(('127.0.0.2', port))\n"
        "    held = False\n"
        "except OSError as e:\n"
        "    held = e.errno == errno.EADDRINUSE\n"
        "store = socket.socket()\n"
        "store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "store.bind(('0.0.0.0', port))\n"
        "store.listen(1)\n"
        "json.dump({'held': held}, open(sys.argv[1], 'w'))\n")
    out = tmp_path / "probe.json"
    marker = new_marker()
    r = run(tsr_cmd("--standalone", "--nproc-per-node", "1", str(prog), str(out)),
            base_env(marker))
    assert r.returncode == 0, r.stderr
    assert load_json(out) == {"held": True}
    assert survivors(marker) == []


HOG = """import socket, subprocess, sys
lo, hi = map(int, open('/proc/sys/net/ipv4/ip_local_port_range').read().split())
held = []
for port in range(lo | 1, hi + 1, 2):  # the parity bind(port 0) tries first
    s = socket.socket()
    try:
        s.bind(('127.0.0.2', port))
        s.listen(1)
        held.append(s)
    except OSError:
        s.close()
sys.exit(subprocess.run(sys.argv[1:]).returncode)
"""


def test_standalone_store_beside_a_busy_address(tmp_path):
    # The flake itself, made certain: in a network namespace of its own (so that no other
    # program of the host loses ports), every port that bind(port 0) tries first is held by a
    # server on 127.0.0.2; real torch's gloo group still starts under --standalone.
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True) \
        if shutil.which("unshare") and shutil.which("ip") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs 'unshare -n' (root or user namespaces) and iproute2")
    hog, prog = tmp_path / "hog.py", tmp_path / "gloo.py"
    hog.write_text(HOG)
    prog.write_text("import torch.distributed as dist\n"
                    "dist.init_process_group('gloo')\n"
                    "dist.barrier()\n"
                    "dist.destroy_process_group()\n")
    marker = new_marker()
    inner = [sys.executable, str(hog), *tsr_cmd("--standalone", "--nproc-per-node", "2",
                                                 "--python", sys.executable, str(prog))]
    r = run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *inner],
            base_env(marker), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert survivors(marker) == []
