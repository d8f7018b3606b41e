"""Driver log channel and output shipping: torchspark's native channel beside PySpark's own
LogStreamingServer/LogStreamingClient (pyspark/ml/torch/log_communication.py), in one run.

    .venv/bin/python -m bench.logchannel_bench [--runs 5] [--lines 100000] [--quick]
        [--loss-full] [--out-gib 1,3] [--skip lines,output,memory] [--svg PATH]
    .venv/bin/python -m bench.logchannel_bench --plot RESULTS.json --svg docs/img/logchannel.svg

1. lines/s to the driver for 4 senders (median of --runs), lines lost, driver CPU s per
   million lines. torchspark: 4 real torchspark-run agents, each with one worker printing
   --lines lines of 100 bytes; the driver formats them (natively, LogServer.write_to) and
   writes them to /dev/null. The two alternate run by run.
   stock: the same 4 workers, each run by PySpark's own task-side loop
   (TorchDistributor._execute_command with a LogStreamingClient: read the worker's piped
   stdout line by line, send each line); stock's LogStreamingServer writes to sys.stderr
   (pointed at a counter); received lines are counted at that write.
2. output shipped: 1 GiB and 3 GiB to memory, 3 GiB to a file (tmpfs and /tmp) with
   tsp_output_send (SHA-256 on both ends; the agent's and the driver's code in one
   process, each with its own threads; one untimed warm-up transfer each), with the CPU
   seconds per GiB of both ends; then each end alone, the other not hashing (the driver's
   server fed by a pure-Python sender using sendfile() and a digest computed beforehand;
   tsp_output_send to a Python stand-in that authenticates but neither hashes nor keeps
   the bytes): what each end sustains when they run on different machines. Beside it,
   stock's collect-style transfer of 1 GiB in 4 KiB chunks, EMULATED with the pattern in
   Python over a loopback socket (a real Spark collect() of 1 GiB exceeds the default
   spark.driver.maxResultSize=1g and needs a cluster; see docs/benchmarks.md, "Small
   functions and a 1 GiB result").
3. memory: one agent with 8 workers printing as fast as they can while the driver pulls
   slowly (agent RSS); 64 agents connected and streaming to one server (driver RSS);
   drops and local fallbacks counted (default mode: both must be 0).
4. --loss-full: the issue's full loss & order run, 8 agents x 250,000 lines (slow).
--svg PATH draws docs/img/logchannel.svg's three panels from the run (lines/s, driver CPU per
million lines, output GB/s); with --plot RESULTS.json, from an earlier run's JSON, measuring
nothing.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench import harness
from tests.helpers.logserver import LogServer
from torchspark.native._native import load_library

lch = harness.helper("logchannel_harness")
RUN_BIN, Collector, drain_all = lch.RUN_BIN, lch.Collector, lch.drain_all
expected, pump_until, start_agents = lch.expected, lch.pump_until, lch.start_agents

SENDER = r'''
import sys
from pyspark.ml.torch.distributor import TorchDistributor
from pyspark.ml.torch.log_communication import LogStreamingClient
# PySpark's own task-side loop: run the worker with stdout piped, send each line.
c = LogStreamingClient("127.0.0.1", int(sys.argv[1]))
TorchDistributor._execute_command([sys.executable, sys.argv[2], sys.argv[3]],
                                  log_streaming_client=c)
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


def run_torchspark(lines: int, senders: int = 4, encrypt: bool = True):
    srv = LogServer()
    srv.encryption(encrypt)
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
        wfile = Path(tempfile.mkdtemp()) / "w.py"
        wfile.write_text(WORKER)
        procs = [subprocess.Popen([sys.executable, "-c", SENDER, str(srv.port), str(wfile),
                                   str(lines)], stdout=subprocess.DEVNULL)
                 for _ in range(senders)]
        for p in procs:
            p.wait()
        want = senders * (lines // 64 * 64)
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


def make_source(size: int) -> Path:
    """A file of `size` random-looking bytes (1 MiB of urandom repeated), made once."""
    src = Path(tempfile.mkdtemp(dir="/tmp")) / "out.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())  # its write-back must not overlap the timed transfers
    return src


class _Opts(ctypes.Structure):
    """tsp_output_opts_t (native/include/torchspark/output.h)."""
    _fields_ = [("host", ctypes.c_char_p), ("port", ctypes.c_int),
                ("secret", ctypes.c_uint8 * 32), ("node_rank", ctypes.c_int),
                ("hostname", ctypes.c_char_p), ("timeout_ms", ctypes.c_int),
                ("attempts", ctypes.c_int), ("digest_out", ctypes.c_void_p)]


SHIP_CPU: list = []  # CPU seconds per GiB of each transfer, both ends (this process)


def ship_native(src: Path, to_file: bool, dst_dir: str | None = None, encrypt: bool = True):
    """One transfer of src with tsp_output_send (the agent's code) to a fresh server in
    this process (the driver's code): GB/s from the send to the verified arrival."""
    lib = load_library()
    size = src.stat().st_size
    srv = LogServer()
    srv.encryption(encrypt)
    dst = os.path.join(tempfile.mkdtemp(dir=dst_dir or str(src.parent)), "out.recv") \
        if to_file else None
    srv.expect_output(dst)
    o = _Opts()
    lib.tsp_output_opts_init(ctypes.byref(o))
    o.host, o.port = b"127.0.0.1", srv.port
    ctypes.memmove(o.secret, srv.secret, 32)
    err = ctypes.create_string_buffer(700)
    c0, t0 = cpu(), time.perf_counter()
    rc = lib.tsp_output_send(ctypes.byref(o), str(src).encode(), err, 700)
    ok = srv.wait_output(10)
    dt, dc = time.perf_counter() - t0, cpu() - c0
    assert rc == 0 and ok, err.value
    srv.close()
    del srv
    if dst:
        os.unlink(dst)
        os.rmdir(os.path.dirname(dst))
    SHIP_CPU.append(dc / (size / (1 << 30)))
    return size / dt / 1e9


OUT_BEGIN, OUT_CHUNK, OUT_END, OUT_DONE = 0x20, 0x21, 0x22, 0x23
CHUNK = 1 << 20


def file_sha256(src: Path) -> bytes:
    h = hashlib.sha256()
    with open(src, "rb") as f:
        while b := f.read(8 << 20):
            h.update(b)
    return h.digest()


def driver_end_alone(src: Path, digest: bytes) -> float:
    """The driver's end on its own: the native server receives and hashes (to memory)
    what a sender that does not hash sends (pure-Python protocol client, the file's
    bytes by sendfile(), the digest computed beforehand): the rate the driver sustains
    when the agent is on another machine. GB/s from the first byte to the verified end."""
    from tests.helpers import logproto
    size = src.stat().st_size
    srv = LogServer()
    srv.expect_output(None)
    sock = socket.create_connection(("127.0.0.1", srv.port))
    h = logproto.hello(srv.secret, role=2)
    sock.sendall(logproto.frame(logproto.HELLO, h, rank=0))
    f = logproto.read_frame(sock)
    sock.sendall(logproto.frame(logproto.AUTH, logproto.mac(srv.secret, b"TSPL1 client", h,
                                                             f[4][2:])))
    assert logproto.read_frame(sock)[0] == logproto.WELCOME
    t0 = time.perf_counter()
    sock.sendall(logproto.frame(OUT_BEGIN, struct.pack(">Q", size)))
    with open(src, "rb") as fh:
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            sock.sendall(struct.pack(">BBBBiI", OUT_CHUNK, 0, 0, 0, -1, n))
            sent = 0
            while sent < n:
                sent += os.sendfile(sock.fileno(), fh.fileno(), off + sent, n - sent)
    sock.sendall(logproto.frame(OUT_END, digest))
    r = logproto.read_frame(sock)
    ok = srv.wait_output(10)
    dt = time.perf_counter() - t0
    assert r is not None and r[0] == OUT_DONE and r[4] == digest and ok, (r, srv.output_error)
    sock.close()
    srv.close()
    del srv
    return size / dt / 1e9


def agent_end_alone(src: Path) -> float:
    """The agent's end on its own: tsp_output_send (hashing, sendfile) to a driver stand-in
    that authenticates like the real one but neither hashes nor keeps the bytes (it drains
    them into one reused buffer and confirms the digest the agent sent): the rate the agent
    sustains when the driver is on another machine. GB/s of the whole call."""
    import hmac as _hmac
    from tests.helpers import logproto
    secret = os.urandom(32)
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    result = {}

    def sink():
        c, _ = lsock.accept()
        f = logproto.read_frame(c)
        h = f[4]
        nonce = os.urandom(32)
        c.sendall(logproto.frame(logproto.CHALLENGE, b"\x00\x01" + nonce))
        a = logproto.read_frame(c)
        want = logproto.mac(secret, b"TSPL1 client", h, nonce)
        assert _hmac.compare_digest(a[4], want)
        c.sendall(logproto.frame(logproto.WELCOME,
                                 logproto.mac(secret, b"TSPL1 server", h, nonce)))
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            t, _, _, _, _, n = struct.unpack(">BBBBiI", logproto._read_exact(c, 12))
            if t == OUT_CHUNK:
                while n:
                    n -= c.recv_into(view[:min(n, CHUNK)])
            elif t == OUT_END:
                d = logproto._read_exact(c, n)
                c.sendall(logproto.frame(OUT_DONE, d))
                result["done"] = True
                break
            else:
                logproto._read_exact(c, n)
        c.close()

    th = threading.Thread(target=sink, daemon=True)
    th.start()
    lib = load_library()
    o = _Opts()
    lib.tsp_output_opts_init(ctypes.byref(o))
    o.host, o.port = b"127.0.0.1", port
    ctypes.memmove(o.secret, secret, 32)
    err = ctypes.create_string_buffer(700)
    t0 = time.perf_counter()
    rc = lib.tsp_output_send(ctypes.byref(o), str(src).encode(), err, 700)
    dt = time.perf_counter() - t0
    th.join(10)
    lsock.close()
    assert rc == 0 and result.get("done"), err.value
    return src.stat().st_size / dt / 1e9


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


class Pump:
    """Pulls from a server in a thread at a given pace until stopped: the driver's pump.
    While the agents stop it keeps pulling, as the real driver does; a driver that stops
    reading first would leave them waiting for room (see test_logchannel_stall.py)."""

    def __init__(self, srv: LogServer, max_lines: int, pause: float):
        self.srv, self.max_lines, self.pause = srv, max_lines, pause
        self.pulled = 0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        while not self.stop.is_set():
            self.pulled += len(self.srv.pull(self.max_lines, 50))
            if self.pause:
                time.sleep(self.pause)

    def fast(self):
        """From now on pull as fast as possible (so that the agents' queues drain)."""
        self.max_lines, self.pause = 16384, 0.0

    def join(self):
        self.stop.set()
        self.th.join()


def agent_warnings(procs) -> int:
    """Agents that fell back to their own output (lines that missed the driver)."""
    bad = 0
    for p in procs:
        err = p.stderr.read().decode(errors="replace")
        bad += "cannot reach the driver" in err or "has taken no lines" in err
    return bad


def mem_agent_8_workers(seconds: float = 8.0):
    srv = LogServer()
    env = dict(os.environ, **srv.agent_env())
    p = subprocess.Popen([str(RUN_BIN), "--nproc-per-node", "8", "--no-python",
                          "--log-endpoint", srv.endpoint, "/usr/bin/yes",
                          "a fairly long line of log text " * 8],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pump = Pump(srv, 256, 0.01)  # a slow consumer: 256 lines per ~60 ms
    peak, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        time.sleep(0.05)
        peak = max(peak, psutil.Process(p.pid).memory_info().rss)
    pump.fast()
    p.terminate()
    p.wait(timeout=120)
    pump.join()
    srv.close(0.5)
    return peak / 2**20, pump.pulled, srv.dropped(), agent_warnings([p])


def mem_server_64_agents(seconds: float = 10.0):
    """Runs in a fresh interpreter (see main): its RSS is the driver's, not this bench's."""
    me = psutil.Process()
    base = me.memory_info().rss
    srv = LogServer()
    env = dict(os.environ, **srv.agent_env())
    procs = [subprocess.Popen([str(RUN_BIN), "--nnodes", "64", "--node-rank", str(i),
                               "--nproc-per-node", "1", "--master-port", "29612", "--no-python",
                               "--log-endpoint", srv.endpoint, "/usr/bin/yes", "x" * 200],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(64)]
    pump = Pump(srv, 256, 0.01)
    peak, connected, t0 = 0, 0, time.time()
    while time.time() - t0 < seconds:
        time.sleep(0.05)
        peak = max(peak, me.memory_info().rss)
        connected = max(connected, srv.stats()["connected"])
    pump.fast()
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=300)
    pump.join()
    srv.close(0.5)
    return {"peak_mib": peak / 2**20, "base_mib": base / 2**20, "connected": connected,
            "dropped": len(srv.dropped()), "fell_back": agent_warnings(procs)}


def mem_server_64_agents_fresh():
    out = subprocess.run([sys.executable, "-m", "bench.logchannel_bench", "--driver64"],
                         capture_output=True, timeout=900, check=True, cwd=harness.ROOT).stdout
    return json.loads(out.decode().strip().splitlines()[-1])


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


W, H = 320, 260  # one panel
TOP, BOTTOM, LEFT = 46, 52, 58
COLORS = {"torchspark": "#1f6fb4", "stock": "#c0504d"}


def esc(t: str) -> str:
    return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(x0: int, title: str, unit: str, bars: list, goal: float | None = None,
          goal_label: str = "", W: int = W) -> list:  # noqa: N803 (the panel's width)
    """bars: (label, color, runs). Linear axis from 0 to the largest run (or the goal)."""
    top = max([max(r) for _, _, r in bars] + [goal or 0]) * 1.15
    plot_h = H - TOP - BOTTOM
    plot_w = W - LEFT - 16
    y = lambda v: TOP + plot_h * (1 - v / top)  # noqa: E731
    out = [f'<text x="{x0 + W / 2}" y="18" text-anchor="middle" font-weight="bold">'
           f'{esc(title)}</text>',
           f'<text x="{x0 + W / 2}" y="34" text-anchor="middle" fill="#555">{esc(unit)}</text>']
    for k in range(5):  # grid and labels
        v = top / 1.15 * k / 4
        out.append(f'<line x1="{x0 + LEFT}" x2="{x0 + W - 16}" y1="{y(v):.1f}" '
                   f'y2="{y(v):.1f}" stroke="#ddd"/>')
        label = f"{v:,.0f}" if top > 20 else f"{v:.2f}"
        out.append(f'<text x="{x0 + LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end" '
                   f'font-size="10">{label}</text>')
    bw = plot_w / len(bars)
    for i, (label, color, runs) in enumerate(bars):
        med = harness.median(runs)
        bx = x0 + LEFT + i * bw + bw * 0.18
        out.append(f'<rect x="{bx:.1f}" y="{y(med):.1f}" width="{bw * 0.64:.1f}" '
                   f'height="{y(0) - y(med):.1f}" fill="{color}" opacity="0.85"/>')
        for j, r in enumerate(runs):
            dx = bx + bw * 0.64 * (j + 0.5) / len(runs)
            out.append(f'<circle cx="{dx:.1f}" cy="{y(r):.1f}" r="2.2" fill="#222"/>')
        text = f"{med:,.0f}" if med > 20 else f"{med:.2f}"
        out.append(f'<text x="{bx + bw * 0.32:.1f}" y="{y(med) - 5:.1f}" '
                   f'text-anchor="middle" font-size="11">{text}</text>')
        for k, part in enumerate(label.split("\n")):
            out.append(f'<text x="{bx + bw * 0.32:.1f}" y="{H - BOTTOM + 15 + 12 * k}" '
                       f'text-anchor="middle" font-size="10">{esc(part)}</text>')
    if goal:
        out.append(f'<line x1="{x0 + LEFT}" x2="{x0 + W - 16}" y1="{y(goal):.1f}" '
                   f'y2="{y(goal):.1f}" stroke="#2a2" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{x0 + W - 18}" y="{y(goal) - 4:.1f}" text-anchor="end" '
                   f'font-size="10" fill="#2a2">{esc(goal_label)}</text>')
    return out


def draw_svg(res: dict, path: Path) -> None:
    """docs/img/logchannel.svg from the results: three panels (lines/s, driver CPU per million
    lines, output GB/s), a bar per median and a dot per run; plain SVG written by hand
    (matplotlib is not a dependency of this project)."""
    ts, st = res["torchspark"], res["stock"]
    stock_lps = harness.median(st["lines_per_s"])
    panels = [
        ("lines/s to the driver", "4 senders x {:,} lines".format(res["lines"]),
         [("torchspark", COLORS["torchspark"], ts["lines_per_s"]),
          ("PySpark\nLogStreaming", COLORS["stock"], st["lines_per_s"])],
         20 * stock_lps, "goal: 20x stock"),
        ("driver CPU per 1M lines", "seconds (lower is better)",
         [("torchspark", COLORS["torchspark"], ts["cpu_per_mline"]),
          ("PySpark\nLogStreaming", COLORS["stock"], st["cpu_per_mline"])], None, ""),
        ("output shipped", "GB/s, loopback, SHA-256 on both ends",
         [("1 GiB\nmemory", COLORS["torchspark"], res["out_1gib"]),
          ("3 GiB\nmemory", COLORS["torchspark"], res["out_3gib"]),
          ("3 GiB file\ntmpfs", COLORS["torchspark"], res["out_3gib_file"]),
          ("3 GiB driver\nend alone", COLORS["torchspark"], res["out_3gib_driver_alone"]),
          ("3 GiB agent\nend alone", COLORS["torchspark"], res["out_3gib_agent_alone"]),
          ("stock-style\n1 GiB", COLORS["stock"], res["out_stock_1gib"])],
         1.0, "goal: 1 GB/s"),
    ]
    body = []
    x0 = 0
    for title, unit, bars, goal, gl in panels:
        w = max(W, 80 * len(bars) + 70)  # room for each bar's label
        body += panel(x0, title, unit, bars, goal, gl, w)
        x0 += w
    width = x0
    when = "; ".join(x for x in (res.get("date"), res.get("start")) if x)
    foot = "%s (medians of %d; dots: single runs)" % (when, res["runs"])
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H + 16}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{H + 16}" fill="white"/>', *body,
           f'<text x="8" y="{H + 10}" font-size="10" fill="#555">{esc(foot)}</text>', "</svg>"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(svg) + "\n")



def main() -> None:
    ap = harness.cli(__doc__, runs=5, quick={"lines": 6400, "skip": "output,memory"})
    ap.add_argument("--lines", type=int, default=100000)
    ap.add_argument("--out-gib", default="1,3")
    ap.add_argument("--skip", default="", help="comma list of: lines,output,memory")
    ap.add_argument("--loss-full", action="store_true")
    ap.add_argument("--svg", type=Path, help="draw the figures here (docs/img/logchannel.svg)")
    ap.add_argument("--plot", type=Path, help="draw --svg from this JSON; measure nothing")
    ap.add_argument("--driver64", action="store_true", help=argparse.SUPPRESS)
    a = harness.parse(ap)
    if a.driver64:
        print(json.dumps(mem_server_64_agents()))
        return
    if a.plot:
        if not a.svg:
            ap.error("--plot needs --svg")
        doc = json.loads(a.plot.read_text())
        return draw_svg(doc.get("results", doc), a.svg)
    run = harness.Run("logchannel_bench", a)
    skip = set(a.skip.split(","))
    res: dict = {"runs": a.runs, "lines": a.lines, "start": harness.load_line(),
                 "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    print("==", res["date"], res["start"])
    if "lines" not in skip:
        print("== lines/s to the driver, 4 senders, %d lines each, median of %d"
              % (a.lines, a.runs))
        # alternate the two so that the machine's load hits both alike
        runs: dict = {"torchspark": [], "stock": []}
        for _ in range(a.runs):
            runs["torchspark"].append(run_torchspark(a.lines))
            runs["stock"].append(run_stock(a.lines))
        for name, rr in runs.items():
            res[name] = {"lines_per_s": [r[0] for r in rr], "lost": [r[1] for r in rr],
                         "cpu_per_mline": [r[2] for r in rr]}
            print("%-10s lines/s %12.0f  lost %s  driver CPU s per 1M lines %.2f  (runs: %s)" % (
                name, harness.median(r[0] for r in rr), [r[1] for r in rr],
                harness.median(r[2] for r in rr), ", ".join("%.0f" % r[0] for r in rr)))
        run.compare("lines/s to the driver", res["torchspark"]["lines_per_s"],
                    res["stock"]["lines_per_s"], "lines/s", digits=0)
        run.compare("driver CPU per 1M lines", res["torchspark"]["cpu_per_mline"],
                    res["stock"]["cpu_per_mline"], "s", digits=3)
        print("   ", harness.load_line())
    if "output" not in skip:
        print("== output shipped, median of %d" % a.runs)
        for gib in [int(x) for x in a.out_gib.split(",") if x]:
            src = make_source(gib << 30)
            # to memory (what TorchDistributor does with a result); bigger ones also to a
            # file, on tmpfs (the channel's speed) and on the disk-backed /tmp (what this
            # VM's page cache and disk allow)
            dests = [("memory", None)]
            if gib > 1:
                dests += [("file on tmpfs", "/dev/shm"), ("file on /tmp", "/tmp")]
            try:
                for what, d in dests:
                    ship_native(src, d is not None, d)  # warm-up, not counted
                    SHIP_CPU.clear()
                    v = [ship_native(src, d is not None, d) for _ in range(a.runs)]
                    res["out_%dgib%s_cpu" % (gib, {None: "", "/dev/shm": "_file",
                                                   "/tmp": "_disk"}[d])] = list(SHIP_CPU)
                    res["out_%dgib%s" % (gib, {None: "", "/dev/shm": "_file",
                                               "/tmp": "_disk"}[d])] = v
                    gbs = run.figure(f"output {gib} GiB, {what}", v, "GB/s", 3)["median"]
                    print("torchspark %d GiB (%s): %.2f GB/s (runs: %s); CPU s per GiB, "
                          "both ends: %.2f" % (gib, what, gbs, ", ".join("%.2f" % x for x in v),
                                               harness.median(SHIP_CPU)))
                # each end on its own (the other one does not hash): what it sustains
                # when the two are on different machines, as in a cluster
                digest = file_sha256(src)
                for end, fn in (("driver", lambda src=src, digest=digest: driver_end_alone(src, digest)),
                                ("agent", lambda src=src: agent_end_alone(src))):
                    fn()  # warm-up, not counted
                    v = [fn() for _ in range(a.runs)]
                    res["out_%dgib_%s_alone" % (gib, end)] = v
                    print("torchspark %d GiB, the %s's end alone: %.2f GB/s (runs: %s)" % (
                        gib, end, run.figure(f"output {gib} GiB, the {end}'s end alone", v, "GB/s",
                                             3)["median"], ", ".join("%.2f" % x for x in v)))
            finally:
                src.unlink()
        ship_stock_pattern(1 << 30)  # warm-up, not counted
        v = [ship_stock_pattern(1 << 30) for _ in range(a.runs)]
        res["out_stock_1gib"] = v
        print("stock-pattern 1 GiB, 4 KiB chunks (emulated): %.2f GB/s (runs: %s)" % (
            run.figure("output 1 GiB, stock pattern (emulated)", v, "GB/s", 3)["median"],
            ", ".join("%.2f" % x for x in v)))
        print("   ", harness.load_line())
    if "memory" not in skip:
        print("== memory under a slow consumer")
        rss, pulled, dropped, warned = mem_agent_8_workers()
        res["agent_rss_mib"] = rss
        print("agent with 8 workers: peak RSS %.1f MiB (pulled %d lines; drops %s; agents that "
              "fell back to local output: %d)" % (rss, pulled, dropped or 0, warned))
        d = mem_server_64_agents_fresh()
        res["driver_rss_mib"], res["driver_base_mib"] = d["peak_mib"], d["base_mib"]
        print("driver with 64 agents (%d connected): peak RSS %.1f MiB (the interpreter "
              "before the server: %.1f MiB; ranks with drops %d; agents that fell back: %d)"
              % (d["connected"], d["peak_mib"], d["base_mib"], d["dropped"], d["fell_back"]))
        print("   ", harness.load_line())
    if a.loss_full:
        ok, n, dt = loss_full()
        res["loss_full"] = {"ok": ok, "lines": n, "seconds": dt}
        print("== loss & order, 8 x 250,000 lines: %s, %d lines in %.0f s" % (
            "every line once, in order, identical" if ok else "MISMATCH", n, dt))
        print("   ", harness.load_line())
    run.results = res
    run.finish()
    if a.svg:
        draw_svg(res, a.svg)


if __name__ == "__main__":
    main()
