"""Ten thousand ranks on one driver (issue 32): the driver's log server, reports, hang dumps
and rendezvous against simulated nodes, 1,024 to 16,384 ranks, beside torch's TCPStore.

    .venv/bin/python -m bench.scale_bench [--sizes 1024,4096,16384] [--nproc 8] [--procs 8]
        [--report-hz 100] [--report-s 5] [--report-max 4096] [--stacks 8] [--tcpstore-max 4096]
        [--no-agent-fold] [--sim-idle] [--runs N] [--quick] [--json PATH] [--svg PATH]
        | --agents 64,1024

Each size runs in a fresh child process (`--one RANKS`): that process is the driver, with
the log server started through the Python binding TorchDistributor uses (LogServer), the
run's ReportHub (the user's `on_report` is the callback it calls), a line pump, the hang
doctor's collection and the C analysis (`tsp_hang_diagnose`), and the rendezvous server
(`_rendezvous.Server`); its CPU time and peak RSS are the driver's. The nodes are
`build/bin/tsp-simnodes` processes (native/tools/simnodes.c): `--procs` of them share the
nodes (RANKS / nproc), one authenticated TLS connection per node through the agent's own
log client. Per size:

1. storm: every node connects at once; the time until all are authenticated, the
   server's refusals (stats `rejected`), the driver's CPU in the storm, and its CPU per
   second in the second after it (a spinning loop would show ~1 core).
2. lines: every rank writes 4 lines; lost = sent - pulled (must be 0).
3. reports (RANKS <= --report-max): every rank reports --report-hz times a second for
   --report-s seconds; reports/s delivered to on_report, the p50/p99 of report() ->
   on_report (the record's wall time to the callback's) and of report() -> the hub's pull
   (the rest is the Python side's), the driver's cores meanwhile, lost = sent -
   delivered, and the records the nodes' clients queued for the driver (report_frames:
   fewer than the calls where the agent's client folded them, agentfold.c;
   --no-agent-fold: every one as it is, as main's agents before issue 32's fold).
   report_stages: where a record's delay went, per stage p50/p90/p99/max ms over every 8th
   rank's records (tsp-simnodes' trace joined here by rank and step): call_to_put (the
   report() stamp to its hand-over to the node's client: the simulated rank's own lag),
   put_to_ack (to the client seeing the driver's ACK: its sender, the socket, the driver's
   server thread reading it, the ACK back), put_to_pull (to the driver's pull), pull_to_callback
   (the hub's turn to on_report), put_to_callback (the two: the driver's path from the
   node's client to on_report, without the simulated rank's lag), call_to_callback (the
   whole). Beside them, the run queue's
   share (/proc schedstat run delay, per second of reports): report_sim_waiting_threads (the
   nodes' threads' seconds runnable without a CPU, summed), report_driver_waiting_threads
   (the driver's), report_hub_waiting (the thread that calls on_report: 1.0 = it waited the
   whole time), and report_hub_cores (that thread's CPU: the C pull and fold, the JSON, the
   Report, the callback).
   --sim-idle: the nodes run under SCHED_IDLE (chrt --idle 0), so they take only the CPU
   the driver leaves: the driver's threads as on a host of its own, the nodes standing for
   other hosts (without it, on 2 cores, the nodes' ~1.2 cores and their hundreds of threads
   keep the thread that calls on_report waiting for a CPU 37-60 % of the time). The nodes
   still make every report() call (reports_sent, report_sim_cores say if they kept up) and
   their own lag still counts (call_to_put).
4. dump: DUMP to every node (the log server's watchdog, as the doctor's); each node answers per
   rank with the marker, a (--stacks)-frame stack and a flight recorder line, rank 17 in a
   different place; the fan-in time (DUMP to every rank's answer in the tails), its size,
   and the doctor's grouped line (tsp_hang_diagnose) after the last answer.
5. rendezvous: RANKS GETs (up to 4,096; beyond, one per node) wait (tsp-simnodes --rdv)
   before rank 0's PUT; the time from the PUT to the last GET's reply.
6. TCPStore (RANKS <= --tcpstore-max, in its own child): torch.distributed.TCPStore with
   use_libuv=True, RANKS clients (threads of --procs processes) each blocked in get() of
   one key; the time from the master's set() to the last get()'s return.

--agents 64,1024: instead, the line path with real `torchspark-run` agents (one job, one
`seq 20` worker each, no Python), all started at once by a launcher process: per node count
the time until every line was pulled and the driver's CPU, per node, and their growth from
the first count (the goal: <= 2x from 64 to 1,024), lost lines, refusals.

--quick: 256 and 1,024 ranks, 2 s of reports at 100/s, no TCPStore: the short variant
that tests/e2e/test_scale.py runs (~25 s). --svg PATH draws the log-log plot from the run.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

from bench import harness

SIM = harness.ROOT / "build" / "bin" / "tsp-simnodes"
SIM_NICE = 0  # --sim-nice: the nodes' niceness above the driver's
SIM_IDLE = False  # --sim-idle: the nodes under SCHED_IDLE (they get the CPU the driver leaves)
TRACE_EVERY = 8  # tsp-simnodes traces every 8th rank's reports (simnodes.c, TRACE_EVERY)


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def hwm_mib() -> float:
    """The process's peak RSS so far (VmHWM), for the phase that just ended."""
    with open("/proc/self/status") as f:
        for ln in f:
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1]) / 1024.0
    return 0.0


def procs_cpu(pids: List[int]) -> float:
    """The CPU seconds (user + system) of these processes so far, threads included."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def thread_cpu(tid: int) -> float:
    """The CPU seconds (user + system) of this process's thread tid so far."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_delay(pids: List[int], tids: List[int] = ()) -> float:
    """Seconds these processes' threads (or, for tids, these threads of this process) spent
    runnable but waiting for a CPU so far (/proc/.../schedstat: the scheduler's run delay)."""
    paths = [f"/proc/self/task/{t}/schedstat" for t in tids]
    for pid in pids:
        try:
            paths += [f"/proc/{pid}/task/{t}/schedstat" for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            pass
    total = 0
    for path in paths:
        try:
            with open(path) as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def machine_cpu() -> float:
    """The machine's busy CPU seconds so far, every process's (/proc/stat: all but idle and
    iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def pct(xs: List[float], q: float):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Sims:
    """The simulated nodes: `procs` tsp-simnodes processes, each reading commands."""

    def __init__(self, args: List[List[str]], first_lines: List[str]):
        nice = ["nice", "-n", str(SIM_NICE)] if SIM_NICE else []
        if SIM_IDLE:
            nice = ["chrt", "--idle", "0", *nice]
        self.procs = [subprocess.Popen([*nice, str(SIM), *a], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, bufsize=1)
                      for a in args]
        for p in self.procs:
            p.stdin.write("".join(x + "\n" for x in first_lines))
            p.stdin.flush()

    def send(self, cmd: str) -> None:
        for p in self.procs:
            p.stdin.write(cmd + "\n")
            p.stdin.flush()

    def expect(self, word: str, timeout: float = 300.0) -> List[List[str]]:
        """Each process's next answer that starts with word (others are skipped)."""
        out = []
        deadline = time.monotonic() + timeout
        for p in self.procs:
            while True:
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError(f"tsp-simnodes ended (rc {p.poll()}) before '{word}'")
                if line.startswith(word):
                    out.append(line.split())
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(word)
        return out

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def node_args(endpoint: str, nodes: int, nproc: int, procs: int, stacks: int,
              world: int) -> List[List[str]]:
    procs = max(1, min(procs, nodes))
    per, extra = divmod(nodes, procs)
    out, first = [], 0
    for i in range(procs):
        n = per + (1 if i < extra else 0)
        out.append(["--endpoint", endpoint, "--nodes", str(n), "--first-node", str(first),
                    "--nproc", str(nproc), "--stacks", str(stacks), "--world", str(world)])
        first += n
    return out


class Pump(threading.Thread):
    """The driver's line pump: pulls every line, as the glue's _LogPump does (here counted)."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server, self.lines, self.stopped = server, 0, False
        self.start()

    def run(self) -> None:
        while not self.stopped:
            self.lines += len(self.server.pull(16384, 50))


def storm(server, sims_args, secret_hex) -> Dict:
    c0, t0 = cpu(), time.monotonic()
    sims = Sims(sims_args, [secret_hex])
    sims.expect("connected")
    dt, dc = time.monotonic() - t0, cpu() - c0
    c1 = cpu()
    time.sleep(1.0)
    st = server.stats()
    return {"sims": sims, "storm_s": dt, "storm_cpu_s": dc, "idle_cores": cpu() - c1,
            "authenticated": st["authenticated"], "refused": st["rejected"]}


class OnReport:
    """The user's on_report: per report the delay from the newest report() it carries to
    the callback, and from the oldest (a summary's first_time); the report() calls seen."""

    def __init__(self):
        self.newest: List[float] = []
        self.oldest: List[float] = []
        self.pulled: List[float] = []  # report() -> the hub's pull (the rest: Python's turn)
        self.calls = 0
        self.records = 0
        self.traced: Dict = {}  # (rank, step) of the traced ranks -> (pulled, callback)

    def __call__(self, rep) -> None:
        now = time.time()
        self.records += 1
        self.newest.append(now - rep.time)
        if rep.rank % TRACE_EVERY == 0:
            self.traced[(rep.rank, rep.step)] = (rep.received, now, rep.time)
        self.pulled.append(rep.received - rep.time)
        s = rep.summary
        self.calls += int(s["count"]) if s else 1
        self.oldest.append(now - float(s["first_time"]) if s else now - rep.time)


def stages(trace_prefix: str, traced: Dict) -> Dict:
    """The sims' trace (simnodes.c, trace_write) joined with the driver's pull and callback
    of the same record: per stage {p50, p90, p99, max} in ms and n, and the records matched."""
    import glob

    rows, seen = [], set()
    for path in glob.glob(trace_prefix + ".*"):
        with open(path) as f:
            for ln in f:
                rank, step, stamp, put, acked = ln.split()
                key = (int(rank), int(step))
                got = traced.get(key)
                if got:
                    seen.add(key)
                    rows.append((float(stamp), float(put), float(acked), *got[:2]))
        os.unlink(path)
    # The records of the traced ranks that the trace did not see queued: summaries that the
    # client's own tick handed on (agentfold.c, tsp__afold_flush).
    unseen = [cb - t for key, (pl, cb, t) in traced.items() if key not in seen]
    spans = {"call_to_put": [p - c for c, p, a, pl, cb in rows],
             "put_to_ack": [a - p for c, p, a, pl, cb in rows if a > 0],
             "put_to_pull": [pl - p for c, p, a, pl, cb in rows],
             "pull_to_callback": [cb - pl for c, p, a, pl, cb in rows],
             "put_to_callback": [cb - p for c, p, a, pl, cb in rows],
             "call_to_callback": [cb - c for c, p, a, pl, cb in rows],
             "unseen_call_to_callback": unseen}
    out: Dict = {"matched": len(rows), "callbacks_traced": len(traced)}
    for name, xs in spans.items():
        out[name] = {q: round(1e3 * pct(xs, v), 1) if xs else None
                     for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}
        out[name]["n"] = len(xs)
    return out


def reports(sims, cb: OnReport, hz: int, secs: int, ranks: int, hub_tid: int) -> Dict:
    import tempfile

    cb.__init__()
    pids = [p.pid for p in sims.procs]
    trace = os.path.join(tempfile.gettempdir(), f"tsp-scale-trace-{os.getpid()}")
    w0 = (run_delay(pids), run_delay([os.getpid()]), run_delay([], [hub_tid]))
    s0, m0, h0 = procs_cpu(pids), machine_cpu(), thread_cpu(hub_tid)
    c0, t0 = cpu(), time.monotonic()
    sims.send(f"reports {hz} {secs} {trace}")
    done = sims.expect("done reports", secs + 300)
    sent, frames = sum(int(x[2]) for x in done), sum(int(x[3]) for x in done)
    t_sent = time.monotonic()
    # Where the 2 cores went while the nodes reported: the simulated nodes' processes, the
    # driver (this process), and everything else on the machine (other sessions' load).
    sims_s, machine_s, driver_s = procs_cpu(pids) - s0, machine_cpu() - m0, cpu() - c0
    hub_s = thread_cpu(hub_tid) - h0
    gen_s = t_sent - t0
    # The time their threads were runnable but had no CPU (the machine's other load decides it).
    waits = [(b - a) / gen_s for a, b in zip(w0, (run_delay(pids), run_delay([os.getpid()]),
                                                  run_delay([], [hub_tid])), strict=True)]
    deadline = t_sent + 60
    while cb.calls < sent and time.monotonic() < deadline:
        time.sleep(0.01)
    dt, dc = time.monotonic() - t0, cpu() - c0
    out = {"reports_sent": sent, "reports_lost": sent - cb.calls, "report_frames": frames,
           "report_frames_per_s": frames / secs,
           "report_calls_per_s": cb.calls / dt, "report_records_per_s": cb.records / dt,
           "report_p50_ms": 1e3 * (pct(cb.newest, 0.5) or 0),
           "report_p99_ms": 1e3 * (pct(cb.newest, 0.99) or 0),
           "report_pulled_p99_ms": 1e3 * (pct(cb.pulled, 0.99) or 0),
           "report_oldest_p99_ms": 1e3 * (pct(cb.oldest, 0.99) or 0),
           "report_drain_s": time.monotonic() - t_sent,
           "report_cores": dc / dt, "report_rate_asked": hz * ranks,
           "report_sim_cores": sims_s / gen_s, "report_driver_cores_sending": driver_s / gen_s,
           "report_machine_cores": machine_s / gen_s,
           "report_other_cores": (machine_s - sims_s - driver_s) / gen_s,
           "report_sim_waiting_threads": waits[0], "report_driver_waiting_threads": waits[1],
           "report_hub_waiting": waits[2], "report_hub_cores": hub_s / gen_s,
           "report_stages": stages(trace, cb.traced)}
    # The driver's path alone (the node's client -> on_report), as a figure of its own.
    out["report_driver_path_p99_ms"] = out["report_stages"]["put_to_callback"]["p99"] or 0.0
    return out


def dump(server, sims, world: int) -> Dict:
    """The hang doctor on the user's path: the C log server's watchdog (docs/protocol.md
    1.12), turned on once every rank is quiet, with a 1 s timeout: its DUMP to every node,
    the answers collected from the tails, the grouped line and the stacks file."""
    import tempfile

    from torchspark.driver import _hang

    timeout_s = 1.0
    t0 = time.monotonic()
    server.watch(timeout_s, "report", world, tempfile.gettempdir())
    time.sleep(timeout_s * 0.9)
    c0 = cpu()  # just before the DUMP: the driver's CPU for the whole dump from here
    sims.expect("dumped", 120 + timeout_s)
    t_dumped = time.monotonic()  # the last node answered its DUMP
    ev = server.hang_event(120) or {}
    t_line = time.monotonic()
    c_line = cpu()
    diag = ev.get("diagnosis") or {}
    if diag:
        _hang.from_reply(diag)  # the doctor's own next step (_doctor.HangDoctor.poll)
    t_kept = time.monotonic()
    path = ev.get("stacks_file")
    size = os.path.getsize(path) if path else 0
    if path:
        os.unlink(path)
    out = {"dump_fanin_s": max(0.0, t_dumped - t0 - timeout_s),
           "dump_ranks": len(diag.get("dumps") or ()), "dump_bytes": size,
           "doctor_line_s": t_line - t_dumped, "doctor_line": str(diag.get("line", ""))[:300],
           "doctor_kept_s": t_kept - t_dumped,
           # the driver's CPU from the DUMP to the event parsed (every thread: the answers'
           # receipt and the pump's pull of their lines included): what a driver with a core
           # of its own would take, but for the 500 ms quiet
           "doctor_cpu_s": c_line - c0}
    # The breakdown after the last node's answer (the C watchdog's steps, protocol 1.12's
    # "timing", on this host's monotonic clock): every rank answered, the collection's end
    # (answered + quiet), the analysis, the stacks file, the event's text, then the glue's
    # event parsed (doctor_line_s) and its Diagnosis built (doctor_kept_s).
    tm = ev.get("timing") or {}
    for k in ("answered_s", "collected_s", "diagnosed_s", "stacks_file_s", "event_s"):
        if tm.get(k) is not None and tm.get("dumped_at") is not None:
            out["doctor_" + k] = tm["dumped_at"] + tm[k] - t_dumped
    out["doctor_event_mb"] = len(json.dumps(ev)) / 1e6
    return out


def rendezvous(ranks: int, procs: int) -> Dict:
    from torchspark.native import _rendezvous

    secret = os.urandom(32).hex()
    srv = _rendezvous.Server("127.0.0.1", secret)
    procs = max(1, min(procs, ranks))
    args = [["--rdv", f"127.0.0.1:{srv.spec('')['port']}", "--gets",
             str(ranks // procs + (1 if i < ranks % procs else 0))] for i in range(procs)]
    sims = Sims(args, [secret])
    try:
        sims.expect("waiting")
        time.sleep(0.5)  # the last GETs' requests reach the server
        spec = srv.spec("127.0.0.1")
        t_put = time.time()
        _rendezvous.exchange(spec, secret, None, 0, "MASTER 127.0.0.1 29500")
        got = sims.expect("answered", 120)
        ok, bad = sum(int(x[1]) for x in got), sum(int(x[2]) for x in got)
        last = max(float(x[3]) for x in got)
        return {"rdv_ok": ok, "rdv_bad": bad, "rdv_answer_s": last - t_put}
    finally:
        sims.close()
        srv.close()


def one(ranks: int, a) -> Dict:
    """One size, in this (fresh) process: the driver."""
    from torchspark.driver import _progress
    from tests.helpers.logserver import LogServer

    nodes = max(1, ranks // a.nproc)
    server = LogServer()  # as TorchDistributor's (the hang watch raises the tails it needs itself)
    if a.budget is not None:
        server.report_budget(a.budget)
    cb = OnReport()
    hub = _progress.ReportHub(server, cb, progress=False)
    pump = Pump(server)
    out: Dict = {"ranks": ranks, "nodes": nodes}
    world = 0 if a.no_agent_fold else nodes * a.nproc
    s = storm(server, node_args(server.endpoint, nodes, a.nproc, a.procs, a.stacks, world),
              server.secret_hex)
    sims = s.pop("sims")
    out.update(s)
    out["hwm_after_storm_mib"] = hwm_mib()
    try:
        before = pump.lines
        sims.send("lines 4")
        sims.expect("done lines")
        deadline = time.monotonic() + 60
        while pump.lines - before < 4 * ranks and time.monotonic() < deadline:
            time.sleep(0.01)
        out["lines_lost"] = 4 * ranks - (pump.lines - before)
        if ranks <= a.report_max:
            out.update(reports(sims, cb, a.report_hz, a.report_s, ranks, hub._thread.native_id))
        out["hwm_after_reports_mib"] = hwm_mib()
        out.update(dump(server, sims, ranks))
        out["hwm_after_dump_mib"] = hwm_mib()
        sims.send("quit")
        out["client_lost"] = sum(int(x[1]) for x in sims.expect("closed", 120))
    finally:
        sims.close()
        server.close()
        pump.stopped = True
        hub.stop()
    # As many GETs as ranks up to 4,096 (the goal); beyond, one per node, as the
    # product makes them (one per barrier task): 16,384 at once overflow the rendezvous's
    # listen backlog of 64 on one host (SYN retries past the 10 s connect timeout).
    out["rdv_gets"] = ranks if ranks <= 4096 else nodes
    out.update(rendezvous(out["rdv_gets"], a.procs))
    out["driver_cpu_s"] = cpu()
    out["driver_peak_rss_mib"] = peak_rss_mib()
    return out


AGENT_LINES = 20


def agents_one(nodes: int) -> Dict:
    """The line path with real agents (--agents): `nodes` torchspark-run agents of one job,
    each with one worker (`seq 20`, no Python) printing AGENT_LINES lines into this
    process's log server, started all at once by a launcher process (so that this
    process's CPU is the driver's alone); the time until every line was pulled, the
    driver's CPU, lost lines."""
    from tests.helpers.logserver import LogServer

    srv = LogServer()
    env = dict(os.environ, **srv.agent_env())
    c0, t0 = cpu(), time.monotonic()
    launcher = subprocess.Popen([sys.executable, "-c", AGENT_LAUNCHER, str(harness.ROOT),
                                 str(nodes), srv.endpoint], env=env, stdout=subprocess.PIPE,
                                text=True)
    got, want = 0, AGENT_LINES * nodes
    while got < want and time.monotonic() - t0 < 600:
        got += len(srv.pull(16384, 50))
    t_lines, c_lines = time.monotonic() - t0, cpu() - c0
    bad = launcher.communicate(timeout=600)[0].split()
    st = srv.stats()
    srv.close()
    return {"agents": nodes, "agent_lines_lost": want - got, "agents_failed": int(bad[1]),
            "agents_lines_s": t_lines, "agents_driver_cpu_s": c_lines,
            "agents_wall_ms_per_node": 1e3 * t_lines / nodes,
            "agents_driver_cpu_ms_per_node": 1e3 * c_lines / nodes,
            "agents_authenticated": st["authenticated"], "agents_refused": st["rejected"],
            "agents_peak_rss_mib": peak_rss_mib()}


AGENT_LAUNCHER = r'''
import subprocess, sys
root, n, endpoint = sys.argv[1], int(sys.argv[2]), sys.argv[3]
run = root + "/.venv/bin/torchspark-run"
ps = [subprocess.Popen([run, "--nnodes", str(n), "--node-rank", str(i), "--nproc-per-node", "1",
                        "--master-port", "29655", "--log-endpoint", endpoint, "--no-python",
                        "/usr/bin/seq", "20"], stdout=subprocess.DEVNULL) for i in range(n)]
print("failed", sum(p.wait() != 0 for p in ps), flush=True)
'''


TCPSTORE_CLIENT = r'''
import datetime, sys, threading, time
import torch.distributed as dist
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
clients, ends, errors = [], [], []
def connect():
    try:
        clients.append(dist.TCPStore(host, port, is_master=False, use_libuv=True,
                                     wait_for_workers=False,
                                     timeout=datetime.timedelta(seconds=300)))
    except Exception as e:
        errors.append(repr(e))
def get(c):
    try:
        c.get("master")
        ends.append(time.time())
    except Exception as e:
        errors.append(repr(e))
threading.stack_size(256 * 1024)
ts = [threading.Thread(target=connect) for _ in range(n)]
for t in ts: t.start()
for t in ts: t.join()
ts = [threading.Thread(target=get, args=(c,)) for c in clients]
for t in ts: t.start()
time.sleep(0.5)  # every get() sent
print("waiting", len(clients), len(errors), flush=True)
for t in ts: t.join()
print("answered", len(ends), max(ends) if ends else 0, len(errors), flush=True)
'''


def tcpstore(ranks: int, procs: int) -> Dict:
    """torch's TCPStore (libuv) with ranks clients each in get() of one key (its own child)."""
    import datetime

    import torch.distributed as dist

    c0 = cpu()
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True,
                           wait_for_workers=False, timeout=datetime.timedelta(seconds=300))
    procs = max(1, min(procs, ranks))
    ps = [subprocess.Popen([sys.executable, "-c", TCPSTORE_CLIENT, "127.0.0.1", str(master.port),
                            str(ranks // procs + (1 if i < ranks % procs else 0))],
                           stdout=subprocess.PIPE, text=True) for i in range(procs)]
    try:
        for p in ps:
            line = p.stdout.readline()
            assert line.startswith("waiting"), line
        t_put = time.time()
        master.set("master", "MASTER 127.0.0.1 29500")
        got = [p.stdout.readline().split() for p in ps]
        return {"tcpstore_ok": sum(int(x[1]) for x in got),
                "tcpstore_errors": sum(int(x[3]) for x in got),
                "tcpstore_answer_s": max(float(x[2]) for x in got) - t_put,
                "tcpstore_cpu_s": cpu() - c0, "tcpstore_peak_rss_mib": peak_rss_mib()}
    finally:
        for p in ps:
            p.kill()
            p.wait()


def child(flag: str, ranks: int, a) -> Dict:
    cmd = [sys.executable, "-m", "bench.scale_bench", flag, str(ranks), "--nproc", str(a.nproc),
           "--procs", str(a.procs), "--report-hz", str(a.report_hz), "--report-s",
           str(a.report_s), "--report-max", str(a.report_max), "--stacks", str(a.stacks)]
    if a.budget is not None:
        cmd += ["--budget", str(a.budget)]
    if a.no_agent_fold:
        cmd.append("--no-agent-fold")
    if a.sim_nice:
        cmd += ["--sim-nice", str(a.sim_nice)]
    if a.sim_idle:
        cmd.append("--sim-idle")
    p = subprocess.run(cmd, cwd=harness.ROOT, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def svg(rows: List[Dict], path: Path) -> None:
    """A log-log plot of cost against ranks: storm, fan-in, doctor's line, rendezvous (s)."""
    import math

    series = [("storm_s", "storm", "#1f77b4"), ("dump_fanin_s", "dump fan-in", "#ff7f0e"),
              ("doctor_line_s", "doctor's line", "#2ca02c"), ("rdv_answer_s", "rendezvous", "#d62728"),
              ("tcpstore_answer_s", "TCPStore get", "#9467bd")]
    xs = [r["ranks"] for r in rows]
    vals = [r.get(k) for r in rows for k, _, _ in series if r.get(k)]
    lo, hi = math.log10(min(vals) / 2), math.log10(max(vals) * 2)
    x0, x1 = math.log10(min(xs) / 1.5), math.log10(max(xs) * 1.5)
    W, H, L, B = 560, 320, 60, 40

    def px(x, y):
        return (L + (math.log10(x) - x0) / (x1 - x0) * (W - L - 130),
                H - B - (math.log10(y) - lo) / (hi - lo) * (H - B - 20))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-size="11" '
           'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>']
    for x in xs:
        X, _ = px(x, 10 ** lo)
        out.append(f'<text x="{X:.0f}" y="{H - B + 15}" text-anchor="middle">{x}</text>')
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= e <= hi:
            _, Y = px(xs[0], 10 ** e)
            out.append(f'<line x1="{L}" x2="{W - 130}" y1="{Y:.0f}" y2="{Y:.0f}" stroke="#ddd"/>'
                       f'<text x="{L - 5}" y="{Y + 4:.0f}" text-anchor="end">{10.0 ** e:g} s</text>')
    out.append(f'<text x="{(W - 130 + L) / 2:.0f}" y="{H - 5}" text-anchor="middle">ranks '
               '(log)</text>')
    for i, (k, name, color) in enumerate(series):
        pts = [px(r["ranks"], r[k]) for r in rows if r.get(k)]
        if not pts:
            continue
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                   + " ".join(f"{x:.0f},{y:.0f}" for x, y in pts) + '"/>')
        out.append(f'<text x="{W - 120}" y="{30 + 16 * i}" fill="{color}">{name}</text>')
    out.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


def main() -> None:
    ap = harness.cli(__doc__, runs=1, runs_help="runs of each size (medians over them)",
                     quick={"sizes": "256,1024", "report_hz": 100, "report_s": 2,
                            "tcpstore_max": 0})
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--report-hz", type=int, default=100)
    ap.add_argument("--report-s", type=int, default=5)
    ap.add_argument("--report-max", type=int, default=4096)
    ap.add_argument("--stacks", type=int, default=8)
    ap.add_argument("--budget", type=float, default=None,
                    help="the driver's report budget, records/s (default: the server's)")
    ap.add_argument("--no-agent-fold", action="store_true",
                    help="the nodes pass every report as it is (main's agents before 32's folding)")
    ap.add_argument("--sim-nice", type=int, default=0,
                    help="run the nodes this much nicer than the driver: the driver's CPU as on "
                         "its own host, the nodes being on others (the 2-core machine's nodes take "
                         "~1.2 cores at 4,096 ranks)")
    ap.add_argument("--sim-idle", action="store_true",
                    help="run the nodes under SCHED_IDLE: they take only the CPU the driver "
                         "leaves, as nodes on other hosts would")
    ap.add_argument("--tcpstore-max", type=int, default=4096)
    ap.add_argument("--svg", type=Path, default=None)
    ap.add_argument("--one", type=int, default=0, help=argparse_hidden())
    ap.add_argument("--tcpstore-one", type=int, default=0, help=argparse_hidden())
    ap.add_argument("--agents", default="",
                    help="the line path with real torchspark-run agents at these node counts "
                         "(e.g. 64,1024), instead of the simulated sizes")
    ap.add_argument("--agents-one", type=int, default=0, help=argparse_hidden())
    a = harness.parse(ap)
    global SIM_NICE, SIM_IDLE
    SIM_NICE, SIM_IDLE = a.sim_nice, a.sim_idle
    if a.one or a.tcpstore_one or a.agents_one:
        r = (one(a.one, a) if a.one else tcpstore(a.tcpstore_one, a.procs) if a.tcpstore_one
             else agents_one(a.agents_one))
        print(json.dumps(r), flush=True)
        return
    if a.agents:
        agents_series(a)
        return
    if not SIM.exists():
        sys.exit(f"{SIM} is missing: build it (cmake --build build --target tsp-simnodes)")
    run = harness.Run("scale_bench", a)
    rows, again = [], []
    for ranks in [int(x) for x in str(a.sizes).split(",")]:
        for k in range(a.runs):
            r = child("--one", ranks, a)
            if ranks <= a.tcpstore_max and k == 0:
                try:
                    r.update(child("--tcpstore-one", ranks, a))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    r["tcpstore_error"] = str(e)[-300:]
            (again if k else rows).append(r)
            show(run, r, "ranks", f"{ranks}")
    run.results["sizes"] = rows
    if again:
        run.results["more_runs"] = again  # --runs: the sizes' further runs, in their figures
    if a.svg:
        svg(rows, a.svg)
    run.finish()


def show(run, r: Dict, size_key: str, label: str) -> None:
    """One run of a size: the load now, printed as a line of JSON, each number a sample of
    its figure (--runs: one sample a run)."""
    r["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    r["load_1min"] = r["loadavg"][0]
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}),
          flush=True)
    for k, v in r.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != size_key:
            name = f"{k} @ {label}"
            got = run.figures.get(name, {}).get("samples", [])
            run.figure(name, [*got, v], "")


def agents_series(a) -> None:
    """--agents: the real agents' line path per node count, and the per-node cost's growth
    from the smallest count to each (the goal: <= 2x from 64 to 1,024 nodes)."""
    run = harness.Run("scale_bench_agents", a)
    rows: List[Dict] = []
    for nodes in [int(x) for x in str(a.agents).split(",")]:
        r = child("--agents-one", nodes, a)
        if rows:
            for k in ("agents_wall_ms_per_node", "agents_driver_cpu_ms_per_node"):
                r[k + "_growth"] = r[k] / max(rows[0][k], 1e-9)
        rows.append(r)
        show(run, r, "agents", f"{nodes} agents")
    run.results["agents"] = rows
    run.finish()


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
