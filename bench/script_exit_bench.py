#!/usr/bin/env python3
"""Script workers: torchspark-run's bootstrap against the plain exec, side by side
(docs/benchmarks.md, "Script workers: the exit bootstrap").

  .venv/bin/python -m bench.script_exit_bench [--runs 7]

Wall time of `torchspark-run --nproc-per-node 1 SCRIPT`, spawn to exit status, with the
default bootstrap (`python -u -c BOOT SCRIPT`, no interpreter finalization) and with
TORCHSPARK_PYTHON_EXIT=finalize (`python -u SCRIPT`, as torchrun starts workers), for an empty
script and for one that imports torch. The two modes alternate run by run. Medians, min, max.
"""
from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from bench import harness

agentutil = harness.helper("agentutil")

SCRIPTS = {"empty": "pass\n", "import torch": "import torch\nx = torch.ones(3)\n"}
MODES = {"bootstrap (default)": "fast", "finalize (plain exec)": "finalize"}


def main() -> None:
    args = harness.parse(harness.cli(__doc__, runs=7))
    run = harness.Run("script_exit_bench", args)
    with tempfile.TemporaryDirectory() as d:
        for name, body in SCRIPTS.items():
            script = Path(d) / "script.py"
            script.write_text(body)
            samples: dict[str, list[float]] = {m: [] for m in MODES}
            for _ in range(args.runs):
                for mode, value in MODES.items():
                    env = agentutil.base_env(agentutil.new_marker(), TORCHSPARK_PYTHON_EXIT=value)
                    t0 = time.perf_counter()
                    subprocess.run([agentutil.TSR, "--nproc-per-node", "1", str(script)], env=env,
                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    samples[mode].append((time.perf_counter() - t0) * 1000)
            c = run.compare(name, samples["bootstrap (default)"], samples["finalize (plain exec)"],
                            "ms", "bootstrap (default)", "finalize (plain exec)", 1)
            for mode in MODES:
                s = run.figures[f"{name}, {mode}"]
                print(f"{name:13} {mode:22} median {s['median']:8.1f} ms "
                      f"(min {s['min']:.1f}, max {s['max']:.1f}, n={s['n']})")
            print(f"{name:13} bootstrap / finalize: {c['ratio']:.2f}x")
    run.finish()


if __name__ == "__main__":
    main()
