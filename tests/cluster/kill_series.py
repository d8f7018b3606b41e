"""A series of faults in one torchspark job on the namespace cluster (issue 20), shared by
tests/cluster/test_faults.py (3 faults, one of each kind) and bench/kill_series.py (N faults).

One job (max_restarts = the number of faults, min_nodes=1) trains on every worker; each time
the current attempt has every rank past step 2, after a random delay, one fault:

- ``exec_kill``: SIGKILL of the executor JVM of a host that runs a rank other than 0 (the
  standalone worker starts a replacement executor);
- ``rank0_kill``: SIGKILL of the executor JVM of rank 0's host;
- ``link_cut``: a host (not rank 0's) loses its link (the cut host stays gone).

Each rank prints ``TSPLINE a=<attempt> r=<rank> n=<step>`` every step, then appends the
step to progress/lines-a<attempt>-r<rank> (driver_job.train): the record of what it printed.
Per fault: the time from the fault to the first step of the next attempt (the line files'
clocks), and after the run: the training processes left on any host (the marker census,
harness.training_processes) and the lines missing from the driver's output, where each line
must appear as ``[attempt k] [rank r] TSPLINE a=k r=r n=s``. The lines a victim's ranks wrote
after the fault cannot reach the driver (its executor or network is gone): counted apart, as
``undeliverable``, not as lost.
"""

import json
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional

from tests.helpers.cluster_harness import (FAULT_CONF, finish_driver, start_driver, wait_no_training_processes,
                     write_config)

KINDS = ("exec_kill", "rank0_kill", "link_cut")
START_TIMEOUT = 240  # driver + executors up and every rank past step 2
RECOVER_TIMEOUT = 150  # the next attempt has every rank past step 2
LINE_RE = re.compile(r"\[attempt (\d+)\] \[rank (\d+)\] TSPLINE a=(\d+) r=(\d+) n=(\d+)")


def progress(d: Path) -> Dict[int, Dict]:
    """Each rank's last progress record (rank*.json that the training writes), by rank."""
    out = {}
    for p in d.glob("rank*.json"):
        try:
            r = json.loads(p.read_text())
        except ValueError:
            continue
        out[r["rank"]] = r
    return out


def _written(d: Path) -> Dict[tuple, List]:
    """(attempt, rank) -> [(step, time, host)] as the ranks recorded them."""
    out = {}
    for p in d.glob("lines-a*-r*"):
        m = re.match(r"lines-a(\d+)-r(\d+)$", p.name)
        rows = []
        for ln in p.read_text().splitlines():
            f = ln.split()
            if len(f) == 3:
                rows.append((int(f[0]), float(f[1]), f[2]))
        out[(int(m.group(1)), int(m.group(2)))] = rows
    return out


# A restart's timeline: (key, what) in the order they happen; each a time after the fault.
PHASES = (
    ("executor_removed", "Spark removes the victim's executor"),
    ("root_at", "the driver names the root cause (log channel)"),
    ("job_ended", "Spark's job of the attempt ended"),
    ("attempt_failed", "the driver's attempt ended (run_once raised)"),
    ("old_tasks_ended", "the old attempt's survivors' tasks ended (cores free)"),
    ("next_submitted", "next barrier job submitted (Spark)"),
    ("tasks_launched", "its last task launched (Spark)"),
    ("tasks_started", "its last task's run_node started (Python worker up)"),
    ("election_done", "election + rendezvous done"),
    ("agents_started", "agents started"),
    ("worker_start", "training process started (warm pool fork)"),
    ("fn_called", "training function called"),
    ("pg_up", "process group up"),
    ("first_step", "first step (slowest rank)"),
)


def phases(f: Dict, att: List[Dict], spark: Dict, pdir: Path, written: Dict) -> Dict:
    """Fault f's timeline: each PHASES key -> seconds after the fault (None when not
    known). Across ranks or tasks, the last one (the attempt waits for its slowest)."""
    t, n = f["t_fault"], f["n"]
    out: Dict[str, Optional[float]] = {}

    def put(key, v):
        out[key] = round(v - t, 2) if v is not None else None

    a = att[n] if len(att) > n else {}
    put("root_at", a.get("root_at"))
    put("job_ended", a.get("ended_at"))
    put("attempt_failed", a.get("ended"))
    removed = [e["removed"] for e in spark.get("executors", [])
               if e.get("removed") and e["removed"] >= t - 1]
    put("executor_removed", min(removed) if removed else None)
    jobs = sorted(spark.get("jobs", []), key=lambda j: j["id"])
    if len(jobs) > n + 1:  # the survivors' tasks: a cut host's ends when Spark gives up on it
        old = [x["ended"] for x in jobs[n]["tasks"] if x["ended"] and x["host"] != f["victim"]]
        put("old_tasks_ended", max(old) if old else None)
        put("next_submitted", jobs[n + 1]["submitted"])
        new = [x["launched"] for x in jobs[n + 1]["tasks"]]
        put("tasks_launched", max(new) if new else None)
    marks = []
    for p in pdir.glob(f"phases-a{n + 1}-r*.json"):
        try:
            marks.append(json.loads(p.read_text()))
        except ValueError:
            pass
    for key in ("tasks_started", "election_done", "agents_started", "worker_start",
                "fn_called", "pg_up"):
        v = [m[key] for m in marks if key in m]
        put(key, max(v) if v else None)
    first = [rows[0][1] for (att_n, _r), rows in written.items() if att_n == n + 1 and rows]
    put("first_step", max(first) if first else None)
    return out


def executor_jvms(cluster, key: str) -> List[int]:
    """The pids of the executor JVMs (CoarseGrainedExecutorBackend) on host `key`."""
    from tests.helpers import netns_cluster as nc
    return [p["pid"] for p in nc.marker_processes(cluster.marker)
            if "CoarseGrainedExecutorBackend" in p["cmdline"]
            and cluster.host_of_netns(p["netns"]) == key]


def run_series(cluster, kinds: List[str], steps: int = 80, sleep: float = 0.1,
               max_delay: float = 1.0, seed: Optional[int] = None, tag: str = "series",
               log=print, timeline: bool = False, patch: Optional[Dict] = None,
               min_nodes: Optional[int] = 1) -> Dict:
    """Runs one job with len(kinds) faults; returns {"faults": [...], "result", "left",
    "lost", "undeliverable", "wrong_prefix", "driver"}. timeline: each fault gets
    "phases" (see phases()), from the task's marks (TORCHSPARK_TIMING=1) and Spark's
    status store. patch: driver_job.py's "patch" (a bench's side-by-side "before"). min_nodes:
    the run's min_nodes (None: every attempt waits for all its nodes, a killed executor's
    replacement included, up to replacementTimeout). Raises AssertionError with the driver's
    output when the job does not get going or an attempt does not start."""
    rng = random.Random(seed)
    pdir = Path(cluster.run_dir) / f"progress-{tag}"
    pdir.mkdir()
    nworkers = len(cluster.worker_names)
    run = {"tag": tag, "num_processes": nworkers,
           "kw": dict({"max_restarts": len(kinds)},
                      **({"min_nodes": min_nodes} if min_nodes is not None else {})),
           "train": {"steps": steps, "sleep": sleep, "progress_dir": str(pdir),
                     "lines": True}}
    conf = dict(FAULT_CONF, **{"spark.torchspark.job.replacementTimeout": "90s"})
    extra = {"env": {"TORCHSPARK_TIMING": "1"}, "spark_timeline": True} if timeline else {}
    if patch:
        extra["patch"] = patch
    cfg = write_config(cluster, "torchspark", [run], conf=conf, tag=tag, extra=extra)
    t0 = time.monotonic()
    p = start_driver(cluster, cfg)
    faults = []
    gone = set()  # cut hosts
    try:
        for i, kind in enumerate(kinds):
            deadline = time.monotonic() + (START_TIMEOUT if i == 0 else RECOVER_TIMEOUT)
            while True:  # the current attempt (i) has every one of its ranks past step 2
                prog = {r: x for r, x in progress(pdir).items() if x.get("attempt") == i}
                # DDP steps in lockstep: one rank past step 2 means every rank has joined.
                if 0 in prog and all(x["step"] >= 2 for x in prog.values()):
                    break
                if p.poll() is not None or time.monotonic() > deadline:
                    r = finish_driver(cfg, p, t0, 1)
                    raise AssertionError(
                        f"attempt {i} did not get going before fault {i} ({kind}); progress "
                        f"{prog}: {r.result(tag)['error']}\n{r.output[-4000:]}")
                time.sleep(0.1)
            time.sleep(rng.uniform(0, max_delay))
            prog = {r: x for r, x in progress(pdir).items() if x.get("attempt") == i}
            by_host = {}
            for r, x in prog.items():
                by_host.setdefault(x["host"], []).append(r)
            keys = {cluster.hosts[k].name: k for k in cluster.worker_names}
            rank0_host = prog[0]["host"]
            others = sorted(h for h in by_host if h != rank0_host)
            if kind == "rank0_kill" or not others:
                host = rank0_host  # a lone rank 0 is also every other rank's host
            else:
                host = rng.choice(others)
            victim = keys[host]
            step_at = prog[by_host[host][0]]["step"]
            t_fault = time.time()
            if kind == "link_cut":
                cluster.cut_link(victim)
                gone.add(victim)
                pids = []
            else:
                pids = executor_jvms(cluster, victim)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                if not pids:
                    raise AssertionError(f"no executor JVM on {host} to kill (fault {i})")
            faults.append({"n": i, "kind": kind, "victim": host, "victim_ranks": by_host[host],
                           "nodes": len(by_host), "step_at_fault": step_at, "t_fault": t_fault,
                           "jvm_pids": pids})
            log(f"fault {i}: {kind} on {host} (ranks {by_host[host]}, step {step_at})")
        r = finish_driver(cfg, p, t0, (time.monotonic() - t0) + RECOVER_TIMEOUT + steps * sleep
                          * 4)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    res = r.result(tag)
    att = res.get("attempts") or []
    # Processes: the cut hosts' executors give up after FAULT_CONF's failed heartbeats.
    left = wait_no_training_processes(cluster, 60)
    w = _written(pdir)
    for f in faults:
        nxt = [t for (a, _r), rows in w.items() if a == f["n"] + 1 for (s, t, _h) in rows
               if s == 0]
        f["resumed_after_s"] = round(min(nxt) - f["t_fault"], 2) if nxt else None
        a = att[f["n"]] if len(att) > f["n"] else {}
        f["noticed_after_s"] = round(a["root_at"] - f["t_fault"], 2) if a.get("root_at") \
            else None
        f["cause"] = a.get("cause")
        f["excluded_executor"] = a.get("excluded_executor")
        if timeline:
            f["phases"] = phases(f, att, res.get("spark") or {}, pdir, w)
    printed = {}
    wrong = []
    for m in LINE_RE.finditer(r.output):
        ka, kr, a, rk, n = map(int, m.groups())
        if (ka, kr) != (a, rk):
            wrong.append(m.group(0))
        printed.setdefault((a, rk), set()).add(n)
    lost, undeliverable = [], []
    fault_of = {f["n"]: f for f in faults}
    for (a, rk), rows in sorted(w.items()):
        f = fault_of.get(a)
        for s, t, h in rows:
            if s in printed.get((a, rk), ()):
                continue
            if f and h == f["victim"] and t >= f["t_fault"]:
                undeliverable.append((a, rk, s))
            else:
                lost.append((a, rk, s))
    written = sum(len(v) for v in w.values())
    return {"faults": faults, "result": res, "attempts": att, "left": left,
            "written": written, "lost": lost, "undeliverable": undeliverable,
            "wrong_prefix": wrong, "driver": r, "gone": sorted(gone)}
