"""Faults on the namespace cluster: a worker host's link is cut mid-training, or every process
on a worker host is killed. run() must raise within FAULT_BOUND seconds of the fault, and within
CLEANUP_BOUND seconds after that no training process may survive on any host (processes are
found by the run's TSP_TEST_MARKER in /proc/*/environ).

The Spark conf of these runs (harness.FAULT_CONF) makes Spark notice a silent executor after
20 s and a partitioned executor give up after 5 failed heartbeats, instead of the 120 s /
60 x 10 s defaults; the bounds below are stated for that conf.

Run for torchspark (asserted) and for stock PySpark (run() raising is asserted; surviving
training processes are the known stock defect and reported as xfail with the list).

With restarts (torchspark, issue 20): one job survives three faults in sequence
(kill_series.py; the long series is bench/kill_series.py).
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cluster_harness import (FAULT_CONF, finish_driver, start_driver, torchspark_unavailable,
                     training_processes, wait_no_training_processes, write_config)
from tests.cluster.kill_series import progress as _progress, run_series

START_TIMEOUT = 240  # driver + executors up and every rank past step 2
FAULT_BOUND = 60  # run() raises within this many seconds of the fault
CLEANUP_BOUND = 60  # then no training process is left on any host within this many seconds
# torchspark learns of the fault from its log channel (docs/protocol.md 1.7: EOF at once, or
# TCP keepalive after ~5 s, plus a 1 s grace and up to 3 s for Spark's own error), not from
# Spark's spark.network.timeout: its run() must raise within this bound.
TORCHSPARK_FAULT_BOUND = 15
NHOSTS = 2


@pytest.fixture(params=["stock", "torchspark"])
def flavor(request):
    if request.param == "torchspark" and torchspark_unavailable():
        pytest.skip(torchspark_unavailable())
    return request.param


def _budget_skip(flavor, fault):
    # CI budget: stock's runs are comparisons only (docs/cluster.md records them). Its host-kill
    # run: Spark notices a dead executor at once, and stock then cleans up like torchspark; its
    # link cut: run() raises after Spark's heartbeat timeout and leaves torchrun's children.
    if os.environ.get("TSP_CLUSTER_FULL") == "1":
        return
    if flavor == "stock":
        pytest.skip(f"stock comparison run ({fault}); set TSP_CLUSTER_FULL=1 to run it "
                    "(~1.5 min each)")
    # torchspark's link cut without restarts: the three link cuts of
    # test_three_faults_restart_in_one_job take the same path (the log channel names the cut
    # host within 10 s, the attempt fails, nothing is left on any host); without restarts
    # that failure is run()'s error (test_restart_policy, and host_killed here).
    if fault == "link_cut":
        pytest.skip("torchspark link cut without restarts: covered by the restart series' "
                    "three link cuts; set TSP_CLUSTER_FULL=1 to run it (~50 s)")


@pytest.mark.parametrize("fault", ["link_cut", "host_killed"])
def test_worker_host_fault(make_cluster, flavor, fault, record_property):
    _budget_skip(flavor, fault)
    c = make_cluster(workers=NHOSTS)
    progress = Path(c.run_dir) / "progress"
    progress.mkdir()
    run = {"tag": fault, "num_processes": NHOSTS,
           "train": {"steps": 100000, "sleep": 0.2, "progress_dir": str(progress)}}
    cfg = write_config(c, flavor, [run], conf=FAULT_CONF, tag=fault)
    t0 = time.monotonic()
    p = start_driver(c, cfg)
    try:
        deadline = t0 + START_TIMEOUT
        while True:
            prog = _progress(progress)
            if len(prog) == NHOSTS and all(r["step"] >= 2 for r in prog.values()):
                break
            if p.poll() is not None or time.monotonic() > deadline:
                r = finish_driver(cfg, p, t0, 1)
                pytest.fail(f"training did not get going (progress {prog}): "
                            f"{r.result(fault)['error']}\n{r.stderr[-3000:]}")
            time.sleep(0.5)
        started = time.monotonic() - t0
        victim = next(k for k, h in c.hosts.items() if h.name == prog[1]["host"])
        before = training_processes(c)
        t_fault = time.monotonic()
        if fault == "link_cut":
            c.cut_link(victim)
        else:
            killed = c.kill_host(victim)
            assert killed, f"nothing to kill on {victim}"
        r = finish_driver(cfg, p, t0, (t_fault - t0) + FAULT_BOUND)
        detect = time.monotonic() - t_fault
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    res = r.result(fault)
    left = wait_no_training_processes(c, CLEANUP_BOUND)
    cleanup = time.monotonic() - t_fault - detect
    observed = {"flavor": flavor, "fault": fault, "victim": c.hosts[victim].name,
                "training_started_after_s": round(started, 1), "raised_after_s": round(detect, 1),
                "error_type": res["error_type"],
                "error_head": (res["error"] or "")[:300],
                "training_processes_before": len(before),
                "survivors_after_cleanup_bound": [(x["host"], x["cmdline"][:100]) for x in left],
                "cleanup_s": round(cleanup, 1)}
    record_property("observed", json.dumps(observed))
    print("OBSERVED " + json.dumps(observed))

    assert before, "no training process was found before the fault: the process census is broken"
    assert not res["ok"], f"run() returned normally after {fault} on {victim}"
    assert res["error"], f"run() did not raise within {FAULT_BOUND}s of {fault} on {victim} " \
                         f"(driver killed after {detect:.0f}s)"
    assert detect <= FAULT_BOUND + 5
    if left:
        msg = f"{len(left)} training processes survived {CLEANUP_BOUND}s after run() raised: " + \
              "; ".join(f"{x['host']}: {x['cmdline'][:100]}" for x in left)
        if flavor == "stock":
            pytest.xfail("known stock defect (torchrun's children are not killed): " + msg)
        pytest.fail(msg)
    if flavor == "torchspark":
        assert detect <= TORCHSPARK_FAULT_BOUND, \
            f"torchspark raised {detect:.1f}s after {fault}, over its {TORCHSPARK_FAULT_BOUND}s bound"
        # run()'s own message (not only a chained cause) must say where: the lost host.
        h = c.hosts[victim]
        assert h.name in res["error"] or h.addr in res["error"], \
            f"run()'s error does not name the lost host {h.name} ({h.addr}): {res['error']}"


# Issue 20's series: jobs of one fault of each kind, each round in its own order, so that over
# the three rounds every kind comes once first, once second and once last (after the other
# two: fewer nodes, a replacement executor, a cut host gone).
ROUNDS = [["exec_kill", "link_cut", "rank0_kill"],
          ["link_cut", "rank0_kill", "exec_kill"],
          ["rank0_kill", "exec_kill", "link_cut"]]


def _rounds():
    """The rounds this run takes: all three with TSP_CLUSTER_FULL=1; else one (80-100 s each
    in CI, issue 33), which still has every kind, and which one turns with the commit (the
    number its hash spells, modulo 3): a commit always gets the same round, and commits in
    turn get every order. Not the date: pytest-xdist's workers must collect the same ids."""
    if os.environ.get("TSP_CLUSTER_FULL") == "1":
        return ROUNDS
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                          capture_output=True, text=True, timeout=30).stdout.strip()
    return [ROUNDS[int(head[:8] or "0", 16) % len(ROUNDS)]]


@pytest.mark.parametrize("kinds", _rounds(), ids=lambda k: "-".join(k))
def test_three_faults_restart_in_one_job(make_cluster, record_property, kinds):
    """Issue 20 on the namespace cluster, its CI variant (bench/kill_series.py runs the long
    series): one job on 3 worker hosts with max_restarts=3 and min_nodes=1 survives three
    faults in sequence (one of each kind, in this round's order), each at a random time once
    the attempt trains: SIGKILL of a non-rank-0 executor JVM (the standalone worker starts a
    replacement), a host's link cut (a non-rank-0 host while there is one; it stays gone),
    SIGKILL of rank 0's executor JVM. Every attempt but the last fails and the next one
    trains; run() returns. The link cut is noticed through the log channel (keepalives: about
    6 s, docs/protocol.md 1.7) well before Spark's heartbeat timeout (20 s under FAULT_CONF),
    the cause names the host and its executor is excluded by its id. After the run no
    training process is left on any host, and every line a rank printed is in the driver's
    output as ``[attempt k] [rank r] ...`` with its own attempt (kill_series.py)."""
    if torchspark_unavailable():
        pytest.skip(torchspark_unavailable())
    c = make_cluster(workers=3)
    s = run_series(c, kinds, steps=30, sleep=0.1, max_delay=1.0)
    res, att, faults = s["result"], s["attempts"], s["faults"]
    observed = {"ok": res["ok"], "nodes": [a["nodes"] for a in att],
                "faults": [{k: f[k] for k in ("kind", "victim", "victim_ranks", "step_at_fault",
                                              "noticed_after_s", "resumed_after_s",
                                              "excluded_executor")} for f in faults],
                "lines_written": s["written"], "lost": s["lost"][:20],
                "undeliverable": len(s["undeliverable"]), "wrong_prefix": s["wrong_prefix"][:5],
                "left": [(x["host"], x["cmdline"][:100]) for x in s["left"]],
                "error": (res["error"] or "")[:300]}
    record_property("observed", json.dumps(observed))
    print("OBSERVED " + json.dumps(observed))
    out = s["driver"].output
    assert res["ok"], f"run() failed after the faults: {res['error']}\n{out[-3000:]}"
    assert len(att) == len(kinds) + 1, att
    for f in faults:  # each failed attempt was followed by one that trained
        assert f["resumed_after_s"] is not None, f"no attempt trained after {f}"
    assert [a["cause"] is None for a in att] == [False] * len(kinds) + [True], att
    cut = next(f for f in faults if f["kind"] == "link_cut")
    host = c.hosts[next(k for k in c.worker_names if c.hosts[k].name == cut["victim"])]
    assert host.name in cut["cause"] or host.addr in cut["cause"], cut["cause"]
    assert cut["noticed_after_s"] is not None and cut["noticed_after_s"] <= 10, cut
    # The cut host's executor is excluded by its id (SparkContext.killAndReplaceExecutor), not
    # left in Spark's view until its heartbeat timeout.
    assert cut["excluded_executor"] is not None, cut
    assert all(r["host"] != cut["victim"] for r in res["result"]["ranks"]), res["result"]
    assert not s["left"], observed["left"]
    assert s["written"] > 0 and not s["lost"], observed
    assert not s["wrong_prefix"], observed
