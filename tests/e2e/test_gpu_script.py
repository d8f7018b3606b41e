"""tests/gpu/run.sh, the device check (docs/gpu.md, "Running the device check on a GPU
machine"), on this CPU machine: it parses as a whole, so a syntax error anywhere fails
even where it skips; it skips with one line where there is no NVIDIA GPU; and its plumbing
(each check in its own process under its own timeout, the budget, the figures table, the
summary lines, the exit status) works, run against the stub NVML, CUDA driver and NCCL
behind a fake nvidia-smi. What the checks find needs a real GPU."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import tsp_spark

ROOT = tsp_spark.ROOT
RUN_SH = str(ROOT / "tests" / "gpu" / "run.sh")
STUBS = ROOT / "build" / "tests" / "unit"
UUID = "GPU-aaaa1111-0000-0000-0000-000000000001"

FAKE_SMI = f"""#!/bin/sh
# nvidia-smi for the stub GPU of STUB_NVML_DEVICES: the queries tests/gpu uses
case "$*" in
  *-L*) echo "GPU 0: Stub H100 (UUID: {UUID})" ;;
  *compute-apps*) ;;
  *query-gpu=index,uuid,pci.bus_id*) echo "0, {UUID}, 00000000:3B:00.0" ;;
  *query-gpu=index*) echo "0" ;;
  *) echo "fake nvidia-smi: $*" >&2; exit 1 ;;
esac
"""


def _fake_gpu_env(tmp_path, **extra):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
               TORCHSPARK_LIBNVML=str(STUBS / "libnvml_stub.so"),
               STUB_NVML_DEVICES=f"{UUID}@00000000:3B:00.0@Stub H100@0@0",
               TORCHSPARK_LIBCUDA=str(STUBS / "libcuda_stub.so"),
               STUB_CUDA_DEVICES="0000:3b:00.0", STUB_CUDA_UUIDS=UUID,
               TORCHSPARK_NCCL_LIB=str(STUBS / "libnccl_stub.so"),
               PYTHON=sys.executable, TSP_GPU_LOG_DIR=str(tmp_path / "logs"), **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def test_the_whole_script_parses():
    r = subprocess.run(["bash", "-n", RUN_SH], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_without_a_gpu_it_skips_with_one_line():
    if shutil.which("nvidia-smi", path="/usr/bin:/bin:/usr/sbin:/sbin"):
        pytest.skip("this machine has nvidia-smi")
    r = subprocess.run(["bash", RUN_SH], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PATH="/usr/bin:/bin:/usr/sbin:/sbin"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "tests/gpu: skipped: no NVIDIA GPU on this host (nvidia-smi is missing or fails)"]


def test_checks_run_each_under_its_timeout_and_end_with_the_summary(tmp_path):
    # In the script's order whatever the command line's: h3 and h8 pass on the stubs; h6
    # fails (the stub NCCL ignores NCCL_SOCKET_IFNAME, real NCCL refuses it); h10 skips
    # (no nccl-tests here).
    r = subprocess.run(["bash", RUN_SH, "h10", "h8", "h6", "h3"], capture_output=True,
                       text=True, timeout=600, env=_fake_gpu_env(tmp_path))
    lines = r.stdout.splitlines()
    assert r.returncode == 1, r.stdout[-3000:]
    summary = lines[lines.index(next(ln for ln in lines if ln.startswith("== summary"))) + 1:]
    assert [ln.split()[:2] for ln in summary[:-1]] == [
        ["PASS", "h3"], ["FAIL", "h6"], ["PASS", "h8"], ["SKIP", "h10"]], summary
    assert all(float(ln.split()[2]) >= 0 for ln in summary[:-1])
    assert summary[-1] == "2 passed, 1 failed, 1 skipped"
    # The figures, as a table for docs/benchmarks.md ("GPUs and the NCCL preflight"), before the summary.
    table = lines[lines.index("| id | figure | value | runs |"):]
    assert any(ln.startswith("| F3 | two agents, one GPU, the check: NCCL's 'Duplicate GPU "
                             "detected' after | ") for ln in table), table
    assert any(ln.startswith("| F2 | agent VmHWM, NVML count") for ln in table), table
    assert (tmp_path / "logs" / "h8.log").exists()


def test_the_budget_cuts_a_check_and_skips_the_rest(tmp_path):
    # A 20 s budget: h4 (a 10 s NCCL deadline) gets what is left of it and passes or is
    # cut; h8 then finds less than 15 s left and is skipped, said so.
    r = subprocess.run(["bash", RUN_SH, "h4", "h8"], capture_output=True, text=True,
                       timeout=120, env=_fake_gpu_env(tmp_path, TSP_GPU_BUDGET="20"))
    lines = r.stdout.splitlines()
    head = [ln for ln in lines if ln.startswith("== h4 (timeout ")]
    assert len(head) == 1 and int(head[0].split()[3]) <= 20, r.stdout
    assert "SKIP h8 0.0 (no time left of the 20 s budget)" in lines, r.stdout
    assert lines[-1].endswith("failed, 1 skipped"), lines[-1]
