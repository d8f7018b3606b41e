"""Driver log channel and output shipping: torchspark's native channel beside PySpark's own
LogStreamingServer/LogStreamingClient (pyspark/ml/torch/log_communication.py), in one run.

    .venv/bin/python bench/logchannel_bench.py [--runs 5] [--lines 100000] [--quick]
                                               [--loss-full] [--out-gib 1,3]

1. lines/s to the driver for 4 senders (median of --runs), lines lost, driver CPU s per
   million lines. torchspark: 4 real torchspark-run agents, each with one worker printing
   --lines lines of 100 bytes; the driver thread formats and writes them to /dev/null.
   stock: 4 processes each calling LogStreamingClient.send() --lines times; stock's server
   writes to sys.stderr (pointed at /dev/null); received lines are counted at that write.
2. output shipped: 1 GiB to memory and 3 GiB to a file with tsp_output_send (SHA-256
   checked) vs stock's collect-style transfer of 1 GiB in 4 KiB chunks, EMULATED with the
   pattern in Python over a loopback socket (a real Spark collect() of 1 GiB exceeds the
   default spark.driver.maxResultSize=1g and needs a cluster; see docs/benchmarks.md).
3. memory: one agent with 8 workers printing as fast as they can while the driver pulls
   slowly (agent RSS); 64 agents connected and streaming to one server (driver RSS).
4. --loss-full: the issue's full loss & order run, 8 agents x 250,000 lines (slow).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from logchannel_harness import (RUN_BIN, Collector, drain_all, expected, pump_until,  # noqa
                                start_agents)
from torchspark._native import LogServer, load_library  # noqa: E402

import psutil  # noqa: E402

SENDER = r'''
import sys, time
from pyspark.ml.torch.log_communication import LogStreamingClient
c = LogStreamingClient("127.0.0.1", int(sys.argv[1]))
line = "x" * 100
for i in range(int(sys.argv[2])):
    c.send(line)
c.close()
'''
WORKER = r'''
import sys
line = b"x" * 100 + b"\n"
out = sys.stdout.buffer
n = int(sys.argv[1])
for i in range(n // 64):
    out.write(line * 64)
out.flush()
'''


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def run_torchspark(lines: int, senders: int = 4):
    srv = LogServer()
    wfile = Path(tempfile.mkdtemp()) / "w.py"
    wfile.write_text(WORKER)
    env = dict(os.environ, **srv.agent_env())
    sink = open(os.devnull, "w")
    got = 0
    c0, t0 = cpu(), time.perf_counter()
    procs = [subprocess.Popen([str(RUN_BIN), "--nnodes", str(senders), "--node-rank", str(i),
                               "--nproc-per-node", "1", "--master-port", "29611",
                               "--python", sys.executable, "--log-endpoint", srv.endpoint,
                               str(wfile), str(lines)], env=env, stdout=subprocess.DEVNULL)
             for i in range(senders)]
    want = senders * (lines // 64 * 64)
    while got < want and time.perf_counter() - t0 < 300:
        got += srv.write_to(sink, 16384, 100)
    dt, dc = time.perf_counter() - t0, cpu() - c0
    for p in procs:
        p.wait()
    srv.close()
    return got / dt, want - got, dc / (got / 1e6)


def run_stock(lines: int, senders: int = 4):
    from pyspark.ml.torch.log_communication import LogStreamingServer

    class Count:
        n = 0

        def write(self, s):
            Count.n += s.count("\n")

        def flush(self):
            pass

    old = sys.stderr
    sys.stderr = Count()
    try:
        srv = LogStreamingServer()
        srv.start("127.0.0.1")
        time.sleep(0.3)
        c0, t0 = cpu(), time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", SENDER, str(srv.port), str(lines)])
                 for _ in range(senders)]
        for p in procs:
            p.wait()
        want = senders * lines
        deadline = time.perf_counter() + 60
        last, stall = -1, 0
        while Count.n < want and time.perf_counter() < deadline and stall < 20:
            stall = stall + 1 if Count.n == last else 0
            last = Count.n
            time.sleep(0.1)
        dt, dc = time.perf_counter() - t0 - 0.1 * stall, cpu() - c0
        srv.shutdown()
        got = Count.n
    finally:
        sys.stderr = old
    return got / dt, want - got, dc / max(got / 1e6, 1e-9)


def ship_native(size: int, to_file: bool):
    lib = load_library()

    class Opts(ctypes.Structure):
        _fields_ = [("host", ctypes.c_char_p), ("port", ctypes.c_int),
                    ("secret", ctypes.c_uint8 * 32), ("node_rank", ctypes.c_int),
                    ("hostname", ctypes.c_char_p), ("timeout_ms", ctypes.c_int),
                    ("attempts", ctypes.c_int)]
    src = Path(tempfile.mkdtemp(dir="/tmp")) / "out.bin"
    with open(src, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(block)
    srv = LogServer()
    dst = str(src) + ".recv" if to_file else None
    srv.expect_output(dst)
    o = Opts()
    lib.tsp_output_opts_init(ctypes.byref(o))
    o.host, o.port = b"127.0.0.1", srv.port
    ctypes.memmove(o.secret, srv.secret, 32)
    err = ctypes.create_string_buffer(700)
    t0 = time.perf_counter()
    rc = lib.tsp_output_send(ctypes.byref(o), str(src).encode(), err, 700)
    ok = srv.wait_output(10)
    dt = time.perf_counter() - t0
    assert rc == 0 and ok, err.value
    srv.close()
    del srv
    src.unlink()
    if dst:
        os.unlink(dst)
    return size / dt / 1e9


def ship_stock_pattern(size: int):
    """Stock-style: the payload cut in 4 KiB chunks, each length-prefixed, reassembled."""
    payload = os.urandom(1 << 20) * (size >> 20)
    ls = socket.create_server(("127.0.0.1", 0))
    port = ls.getsockname()[1]
    out = []

    def recv():
        c, _ = ls.accept()
        f = c.makefile("rb")
        while True:
            hdr = f.read(4)
            if not hdr:
                break
            out.append(f.read(struct.unpack(">i", hdr)[0]))
        c.close()
    th = threading.Thread(target=recv)
    th.start()
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port))
    for i in range(0, len(payload), 4096):
        chunk = payload[i:i + 4096]
        s.sendall(struct.pack(">i", len(chunk)) + chunk)
    s.close()
    th.join()
    data = b"".join(out)
    dt = time.perf_counter() - t0
    assert hashlib.sha256(data).digest() == hashlib.sha256(payload).digest()
    return size / dt / 1e9


def mem_agent_8_workers(seconds: float = 6.0):
    srv = LogServer()
    env = dict(os.environ, **srv.agent_env())
    p = subprocess.Popen([str(RUN_BIN), "--nproc-per-node", "8", "--no-python",
                          "--log-endpoint", srv.endpoint, "/usr/bin/yes",
                          "a fairly long line of log text " * 8],
                         env=env, stdout=subprocess.DEVNULL)
    peak, pulled, t0 = 0, 0, time.time()
    while time.time() - t0 < seconds:
        pulled += len(srv.pull(256, 50))  # a slow consumer: 256 lines per ~60 ms
        time.sleep(0.01)
        peak = max(peak, psutil.Process(p.pid).memory_info().rss)
    p.terminate()
    p.wait()
    srv.close(0.5)
    return peak / 2**20, pulled


def mem_server_64_agents(seconds: float = 8.0):
    srv = LogServer()
    env = dict(os.environ, **srv.agent_env())
    me = psutil.Process()
    base = me.memory_info().rss
    procs = [subprocess.Popen([str(RUN_BIN), "--nnodes", "64", "--node-rank", str(i),
                               "--nproc-per-node", "1", "--master-port", "29612", "--no-python",
                               "--log-endpoint", srv.endpoint, "/usr/bin/yes", "x" * 200],
                              env=env, stdout=subprocess.DEVNULL) for i in range(64)]
    peak, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        srv.pull(256, 50)
        time.sleep(0.01)
        peak = max(peak, me.memory_info().rss)
    connected = srv.stats()["connected"]
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    srv.close(0.5)
    return peak / 2**20, (peak - base) / 2**20, connected


def loss_full(nodes: int = 8, lines: int = 250000):
    tmp = Path(tempfile.mkdtemp())
    srv = LogServer()
    col = Collector()
    t0 = time.perf_counter()
    procs = start_agents(srv, nodes, lines, 5000, tmp, master_port=29613)
    pump_until(srv, col, lambda: all(p.poll() is not None for p in procs), 3600)
    srv.close()
    drain_all(srv, col)
    ok = col.summary() == expected(tmp, nodes)
    return ok, sum(col.count.values()), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lines", type=int, default=100000)
    ap.add_argument("--out-gib", default="1,3")
    ap.add_argument("--loss-full", action="store_true")
    a = ap.parse_args()
    print("== lines/s to the driver, 4 senders, %d lines each, median of %d" % (a.lines, a.runs))
    for name, fn in (("torchspark", run_torchspark), ("stock", run_stock)):
        res = [fn(a.lines) for _ in range(a.runs)]
        print("%-10s lines/s %12.0f  lost %s  driver CPU s per 1M lines %.2f" % (
            name, statistics.median(r[0] for r in res), [r[1] for r in res],
            statistics.median(r[2] for r in res)))
    print("== output shipped")
    for gib in [int(x) for x in a.out_gib.split(",") if x]:
        size = gib << 30
        v = [ship_native(size, to_file=gib > 1) for _ in range(max(1, a.runs // 2))]
        print("torchspark %d GiB (%s): %.2f GB/s (median of %d)" % (
            gib, "file" if gib > 1 else "memory", statistics.median(v), len(v)))
    v = [ship_stock_pattern(1 << 30) for _ in range(max(1, a.runs // 2))]
    print("stock-pattern 1 GiB, 4 KiB chunks: %.2f GB/s (median of %d)" % (statistics.median(v), len(v)))
    print("== memory under a slow consumer")
    rss, pulled = mem_agent_8_workers()
    print("agent with 8 workers: peak RSS %.1f MiB (pulled %d lines)" % (rss, pulled))
    peak, delta, conn = mem_server_64_agents()
    print("driver with 64 agents (%d connected): peak RSS %.1f MiB (+%.1f MiB)" % (conn, peak, delta))
    if a.loss_full:
        ok, n, dt = loss_full()
        print("== loss & order, 8 x 250,000 lines: %s, %d lines in %.0f s" % (
            "every line once, in order, identical" if ok else "MISMATCH", n, dt))


if __name__ == "__main__":
    main()
