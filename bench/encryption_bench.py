"""The cost of encrypting torchspark's channel: spark.torchspark.encryption true (TLS 1.3 to
the end) beside false (the same handshake, then MAC'ed records in clear; docs/protocol.md
1.10.1), alternating run by run in one process.

    .venv/bin/python -m bench.encryption_bench [--runs 5] [--lines 200000] [--out-mib 1024]
        [--raw-only | --lines-only]

Through TorchDistributor.run() on local-cluster[2,1,1024] (2 ranks), one session, the key
set before each run():
  first step   run() of a function that returns its start time: run() to the function's
               first line (the channel's handshakes are on that path);
  lines        run() of 2 ranks printing --lines lines each: lines/s over the whole run();
  report p99   run() of 2 ranks calling torchspark.report() every 10 ms for 300 steps:
               on_report's receive time minus report()'s time (one host, one clock);
  output       run() of 1 rank returning --out-mib MiB of bytes: rank 0's return to run()'s
               return (pickle, the channel, the digest, unpickle), GB/s as a user sees it.
Raw channel, no Spark (bench/logchannel_bench.py's helpers): lines/s of 4 real
torchspark-run agents to a LogServer (and the driver process's CPU per million lines), and a
--out-mib MiB file through tsp_output_send (the agent's code) to a LogServer's memory in this
process (both ends on these cores; CPU s per GiB of both ends).
The load average is recorded beside every sample."""
import os
import time
from pathlib import Path

from bench import harness
from bench import logchannel_bench as lcb

MODES = (("on", True), ("off", False))


def first_step():
    import time
    return time.time()


def print_lines(n):
    import sys
    w = sys.stdout.write
    for i in range(n):
        w("encryption bench line %d of a worker, about sixty bytes long\n" % i)
    sys.stdout.flush()


def report_steps(steps):
    import time

    import torchspark
    for step in range(steps):
        torchspark.report({"loss": 1.0 / (step + 1)}, step=step)
        time.sleep(0.01)


def big_output(n):
    import os
    import time
    data = os.urandom(1 << 20) * (n >> 20)
    return time.time(), data


def through_run(a, run, samples):
    from torchspark import TorchDistributor
    spark = harness.spark_session("local-cluster[2,1,1024]", {"spark.driver.memory": "4g",
                                                               # the output is over the default 1g
                                                               "spark.driver.maxResultSize": "4g"})
    try:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         progress=False).run(first_step)  # warm pools, not counted
        for i in range(a.runs):
            for name, on in MODES if i % 2 == 0 else MODES[::-1]:
                spark.conf.set("spark.torchspark.encryption", "true" if on else "false")
                t0 = time.time()
                d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                     progress=False)
                samples[f"first step, {name}"].append(d.run(first_step) - t0)
                t0 = time.perf_counter()
                d.run(print_lines, a.lines)
                samples[f"lines/s through run(), {name}"].append(
                    2 * a.lines / (time.perf_counter() - t0))
                if a.lines_only:
                    samples[f"load, {name}"].append(os.getloadavg()[0])
                    print(name, round(samples[f"lines/s through run(), {name}"][-1]), flush=True)
                    continue
                got = []
                TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                                 on_report=got.append, progress=False).run(report_steps, 300)
                lat = sorted(1000 * (r.received - r.time) for r in got)
                samples[f"report p99, {name}"].append(lat[int(0.99 * (len(lat) - 1))])
                d1 = TorchDistributor(num_processes=1, local_mode=False, use_gpu=False,
                                      progress=False)
                t_ret, data = d1.run(big_output, a.out_mib << 20)
                samples[f"output through run(), {name}"].append(
                    len(data) / (time.time() - t_ret) / 1e9)
                del data
                samples[f"load, {name}"].append(os.getloadavg()[0])
                print(name, {k: round(v[-1], 3) for k, v in samples.items() if k.endswith(name)},
                      flush=True)
    finally:
        spark.stop()


def raw_channel(a, samples, src: Path):
    for i in range(a.runs):
        for name, on in MODES if i % 2 == 0 else MODES[::-1]:
            r, lost, cpu = lcb.run_torchspark(a.lines, encrypt=on)
            assert lost == 0, lost
            samples[f"raw lines/s, {name}"].append(r)
            samples[f"raw driver CPU s per M lines, {name}"].append(cpu)
            samples[f"raw output, {name}"].append(lcb.ship_native(src, False, encrypt=on))
            samples[f"raw output CPU s/GiB, {name}"].append(lcb.SHIP_CPU[-1])
            samples[f"raw load, {name}"].append(os.getloadavg()[0])
            print(name, {k: round(v[-1], 3) for k, v in samples.items()
                         if k.startswith("raw") and k.endswith(name)}, flush=True)


def main() -> None:
    ap = harness.cli(__doc__, runs=5, quick={"lines": 20000, "out_mib": 64})
    ap.add_argument("--lines", type=int, default=200000, help="lines per rank (200000)")
    ap.add_argument("--out-mib", type=int, default=1024, help="output size in MiB (1024)")
    ap.add_argument("--raw-only", action="store_true", help="no Spark: the raw channel only")
    ap.add_argument("--lines-only", action="store_true",
                    help="lines through run() only (first step beside them; no raw channel)")
    a = harness.parse(ap)
    run = harness.Run("encryption_bench", a)
    samples: dict = {}
    for what in ("first step", "lines/s through run()", "report p99", "output through run()",
                 "load", "raw lines/s", "raw driver CPU s per M lines", "raw output",
                 "raw output CPU s/GiB", "raw load"):
        for name, _ in MODES:
            samples[f"{what}, {name}"] = []
    if not a.lines_only:
        src = lcb.make_source(a.out_mib << 20)
        try:
            raw_channel(a, samples, src)
        finally:
            src.unlink()
            src.parent.rmdir()
    if not a.raw_only:
        through_run(a, run, samples)
    units = {"first step": "s", "lines": "lines/s", "report": "ms", "output": "GB/s",
             "load": "load", "raw lines": "lines/s", "raw output": "GB/s"}
    for key, v in samples.items():
        if v:
            unit = next((u for p, u in units.items() if key.startswith(p)), "")
            if "CPU" in key:
                unit = "s/GiB" if "GiB" in key else "s/M lines"
            run.figure(key, v, unit, 3)
    run.results = {k: v for k, v in samples.items() if v}
    run.finish()


if __name__ == "__main__":
    main()
