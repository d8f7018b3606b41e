"""The demo training (real torch, gloo DDP) under torchspark-run, as the README runs it."""
import json
import subprocess

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "spark-glue" / "python" / "examples"
PYTHON = sys.executable


def test_ddp_demo_trains_under_torchspark_run(run_bin, tmp_path):
    out = tmp_path / "metrics.json"
    proc = subprocess.run(
        [str(run_bin), "--standalone", "--nproc-per-node", "2", "--python", PYTHON, "--tee", "3",
         str(EXAMPLES / "ddp_train.py"), "--steps", "30", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(out.read_text())
    assert metrics["world_size"] == 2
    assert metrics["final_loss"] < 0.5  # it learned: the loss starts around 7
    assert "[default0]:step   0" in proc.stdout
