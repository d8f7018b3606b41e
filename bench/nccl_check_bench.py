"""The NCCL preflight on the stub CUDA driver and stub NCCL (CPU only; design F7): how close
a missing rank and a hung all_reduce end to the deadline, how fast a failing rank becomes the
node's root cause, and what the check adds to an agent's start (2 ranks, 64 KiB), beside
the same agent without the check. Medians of --runs. Needs the build tree (cmake --build
build). Prints a Markdown table.

    .venv/bin/python -m bench.nccl_check_bench --runs 5
"""
import os
import subprocess
import time

from bench import harness
from tests.helpers.agentutil import free_port

BUILD = harness.ROOT / "build"
RUN = str(BUILD / "bin" / "torchspark-run")
STUBS = BUILD / "tests" / "unit"


def once(args, extra_env=None) -> float:
    env = dict(os.environ, TORCHSPARK_LIBCUDA=str(STUBS / "libcuda_stub.so"),
               TORCHSPARK_LIBNVML="/nonexistent", STUB_CUDA_DEVICES="0000:3b:00.0,0000:5e:00.0",
               **(extra_env or {}))
    t = time.monotonic()
    subprocess.run([RUN, *args, "--no-python", "true"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.monotonic() - t


def main() -> None:
    a = harness.parse(harness.cli(__doc__, runs=5))
    run = harness.Run("nccl_check_bench", a)
    lib = ["--nccl-lib", str(STUBS / "libnccl_stub.so"), "--nccl-check-bytes", "65536"]
    two = ["--standalone", "--nproc-per-node", "2"]

    def missing():
        return ["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-addr",
                "127.0.0.1", "--master-port", str(free_port())]

    cases = [
        ("agent start, 2 workers, no check", lambda: once(two)),
        ("agent start, 2 workers, check passes", lambda: once(two + ["--nccl-check=10"] + lib)),
        ("one rank fails at init (fail-fast)", lambda: once(
            two + ["--nccl-check=10"] + lib,
            {"STUB_NCCL_INIT_FAIL": "1:2:NET/Socket : No usable listening interface found"})),
        ("missing rank, deadline 2 s", lambda: once(missing() + ["--nccl-check=2"] + lib)),
        ("hung all_reduce, deadline 2 s", lambda: once(
            two + ["--nccl-check=2"] + lib, {"STUB_NCCL_ALLREDUCE_HANG": "1"})),
    ]
    print("| case | median wall (s) | runs |")
    print("|---|---|---|")
    for name, fn in cases:
        walls = run.figure(name, [fn() for _ in range(a.runs)], "s", 3)
        print(f"| {name} | {walls['median']:.3f} | "
              f"{', '.join(f'{w:.3f}' for w in walls['samples'])} |")
    run.finish()


if __name__ == "__main__":
    main()
