"""torchspark.report()'s CPU per call, in one process: the process's CPU time (every thread,
the report sender's included) over N steps of 1 ms busy work with a report() each, against
the same steps without it. The agent's end is a thread reading a Unix socket.

    .venv/bin/python bench/report_cpu_bench.py [--steps 5000]
"""
import argparse
import os
import socket
import tempfile
import threading
import time


def busy(steps, reporting, report):
    c0 = time.process_time()
    for i in range(steps):
        if reporting:
            report({"loss": 0.5, "lr": 0.001, "step_time": 0.01}, step=i)
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass
    return time.process_time() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5000)
    args = ap.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "r.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def drain():
        conn, _ = srv.accept()
        while conn.recv(1 << 16):
            pass

    threading.Thread(target=drain, daemon=True).start()
    os.environ["TORCHSPARK_REPORT_SOCKET"] = path
    import torchspark

    torchspark.report({"warm": 1}, step=0)
    with_s = busy(args.steps, True, torchspark.report)
    without_s = busy(args.steps, False, torchspark.report)
    print(f"CPU per step: with report() {1e6 * with_s / args.steps:.1f} us, without "
          f"{1e6 * without_s / args.steps:.1f} us: report() {1e6 * (with_s - without_s) / args.steps:.1f} "
          f"us per call (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
