#!/usr/bin/env python3
"""Script workers: torchspark-run's bootstrap against the plain exec, side by side
(docs/benchmarks.md, "Script workers: the exit bootstrap").

  .venv/bin/python bench/script_exit_bench.py [--runs 7]

Wall time of `torchspark-run --nproc-per-node 1 SCRIPT`, spawn to exit status, with the
default bootstrap (`python -u -c BOOT SCRIPT`, no interpreter finalization) and with
TORCHSPARK_PYTHON_EXIT=finalize (`python -u SCRIPT`, as torchrun starts workers), for an empty
script and for one that imports torch. The two modes alternate run by run. Medians, min, max.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from agentutil import TSR, base_env, new_marker  # noqa: E402

SCRIPTS = {"empty": "pass\n", "import torch": "import torch\nx = torch.ones(3)\n"}
MODES = {"bootstrap (default)": "fast", "finalize (plain exec)": "finalize"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for name, body in SCRIPTS.items():
            script = Path(d) / "script.py"
            script.write_text(body)
            samples: dict[str, list[float]] = {m: [] for m in MODES}
            for _ in range(args.runs):
                for mode, value in MODES.items():
                    env = base_env(new_marker(), TORCHSPARK_PYTHON_EXIT=value)
                    t0 = time.perf_counter()
                    subprocess.run([TSR, "--nproc-per-node", "1", str(script)], env=env,
                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    samples[mode].append((time.perf_counter() - t0) * 1000)
            for mode, s in samples.items():
                print(f"{name:13} {mode:22} median {statistics.median(s):8.1f} ms "
                      f"(min {min(s):.1f}, max {max(s):.1f}, n={len(s)})")


if __name__ == "__main__":
    main()
