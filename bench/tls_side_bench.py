"""The log channel with TLS 1.3 (docs/protocol.md 1.10) side by side with another build of
torchspark (e.g. the plaintext channel of 4ea1b52, built in a scratch worktree): lines/s to
the driver (4 real agents) and a 1 GiB output to driver memory (tsp_output_send to a server in
the same process), alternating run by run.

    .venv/bin/python bench/tls_side_bench.py --old-lib OLD/build/lib/libtorchspark.so \\
        --old-run OLD/build/bin/torchspark-run [--runs 3] [--lines 250000] [--out-mib 1024]

Each measurement runs in a fresh interpreter, so that TORCHSPARK_LIB / TORCHSPARK_RUN select
the build (bench/logchannel_bench.py's run_torchspark and ship_native do the work)."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

ONE = """
import os, sys
sys.path.insert(0, %r)
import logchannel_bench as b
from pathlib import Path
if sys.argv[1] == "lines":
    r, lost, cpu = b.run_torchspark(int(sys.argv[2]))
    print("lines/s %%.0f lost %%d cpu_s_per_M %%.3f" %% (r, lost, cpu), flush=True)
else:
    g = b.ship_native(Path(sys.argv[2]), False)
    print("GB/s %%.3f cpu_s_per_GiB %%.2f" %% (g, b.SHIP_CPU[-1]), flush=True)
os._exit(0)
""" % str(HERE)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-lib", required=True)
    ap.add_argument("--old-run", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lines", type=int, default=250000)
    ap.add_argument("--out-mib", type=int, default=1024)
    a = ap.parse_args()
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
                p = subprocess.run([sys.executable, "-c", ONE, what, arg], env=env,
                                   capture_output=True, text=True, timeout=600)
                out = (p.stdout.strip().splitlines() or [p.stderr.strip()[-200:]])[-1]
                print("%s %s %s load %.1f" % (name, what, out, os.getloadavg()[0]), flush=True)


if __name__ == "__main__":
    main()
