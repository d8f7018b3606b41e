"""The log channel with TLS 1.3 (docs/protocol.md 1.10) side by side with another build of
torchspark (e.g. the plaintext channel of 4ea1b52, built in a scratch worktree): lines/s to
the driver (4 real agents) and a 1 GiB output to driver memory (tsp_output_send to a server in
the same process), alternating run by run.

    .venv/bin/python -m bench.tls_side_bench --old-lib OLD/build/lib/libtorchspark.so \\
        --old-run OLD/build/bin/torchspark-run [--runs 3] [--lines 250000] [--out-mib 1024]

Each measurement runs in a fresh interpreter from the repository root, so that
TORCHSPARK_LIB / TORCHSPARK_RUN select the build (bench/logchannel_bench.py's
run_torchspark and ship_native do the work)."""
import os
import subprocess
import sys
from pathlib import Path

from bench import harness

ONE = """
import os, sys
from bench import logchannel_bench as b
from pathlib import Path
if sys.argv[1] == "lines":
    r, lost, cpu = b.run_torchspark(int(sys.argv[2]))
    print("lines/s %.0f lost %d cpu_s_per_M %.3f" % (r, lost, cpu), flush=True)
else:
    g = b.ship_native(Path(sys.argv[2]), False)
    print("GB/s %.3f cpu_s_per_GiB %.2f" % (g, b.SHIP_CPU[-1]), flush=True)
os._exit(0)
"""


def main() -> None:
    ap = harness.cli(__doc__, runs=3, quick={"lines": 20000, "out_mib": 64})
    ap.add_argument("--old-lib", required=True, help="the other build's libtorchspark.so")
    ap.add_argument("--old-run", required=True, help="the other build's torchspark-run")
    ap.add_argument("--lines", type=int, default=250000, help="lines per run (250000)")
    ap.add_argument("--out-mib", type=int, default=1024, help="output size in MiB (1024)")
    a = harness.parse(ap)
    run = harness.Run("tls_side_bench", a)
    src = Path("/tmp/tsp_tls_side_%d.bin" % a.out_mib)
    if not src.exists():
        with open(src, "wb") as f:
            blk = os.urandom(1 << 20)
            for _ in range(a.out_mib):
                f.write(blk)
    old = {"TORCHSPARK_LIB": a.old_lib, "TORCHSPARK_RUN": a.old_run}
    for _ in range(a.runs):
        for name, extra in (("old", old), ("new", {})):
            env = dict(os.environ, **extra)
            for what, arg in (("output", str(src)), ("lines", str(a.lines))):
                p = subprocess.run([sys.executable, "-c", ONE, what, arg], env=env, cwd=harness.ROOT,
                                   capture_output=True, text=True, timeout=600)
                out = (p.stdout.strip().splitlines() or [p.stderr.strip()[-200:]])[-1]
                run.results.setdefault(f"{name} {what}", []).append(out)
                print("%s %s %s load %.1f" % (name, what, out, os.getloadavg()[0]), flush=True)
    run.finish()


if __name__ == "__main__":
    main()
