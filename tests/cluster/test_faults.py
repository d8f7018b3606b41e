"""Faults on the namespace cluster: a worker host's link is cut mid-training, or every process
on a worker host is killed. run() must raise within FAULT_BOUND seconds of the fault, and within
CLEANUP_BOUND seconds after that no training process may survive on any host (processes are
found by the run's TSP_TEST_MARKER in /proc/*/environ).

The Spark conf of these runs (harness.FAULT_CONF) makes Spark notice a silent executor after
20 s and a partitioned executor give up after 5 failed heartbeats, instead of the 120 s /
60 x 10 s defaults; the bounds below are stated for that conf.

Run for torchspark (asserted) and for stock PySpark (run() raising is asserted; surviving
training processes are the known stock defect and reported as xfail with the list).
"""

import json
import os
import time
from pathlib import Path

import pytest

from harness import (FAULT_CONF, finish_driver, start_driver, torchspark_unavailable,
                     training_processes, wait_no_training_processes, write_config)

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
    if flavor == "stock" and os.environ.get("TSP_CLUSTER_FULL") != "1":
        pytest.skip(f"stock comparison run ({fault}); set TSP_CLUSTER_FULL=1 to run it "
                    "(~1.5 min each)")


def _progress(d: Path):
    out = {}
    for p in d.glob("rank*.json"):
        try:
            r = json.loads(p.read_text())
        except ValueError:
            continue
        out[r["rank"]] = r
    return out


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


def test_link_cut_restarts_on_the_survivor(make_cluster, record_property):
    """Issue 20 on the namespace cluster: a worker host's link is cut mid-training in a run
    with max_restarts=1 and min_nodes=1. The driver notices it through the log channel
    (TCP keepalive or the agents' PINGs: about 6 s, docs/protocol.md 1.7), well before
    Spark's heartbeat timeout (20 s under FAULT_CONF), cancels the attempt, excludes the cut
    host's executor by its id and runs the next one at once on the other host; run()
    returns. Stock has no restart: it fails (test_worker_host_fault above)."""
    if torchspark_unavailable():
        pytest.skip(torchspark_unavailable())
    c = make_cluster(workers=NHOSTS)
    progress = Path(c.run_dir) / "progress"
    progress.mkdir()
    run = {"tag": "restart", "num_processes": NHOSTS, "kw": {"max_restarts": 1, "min_nodes": 1},
           "train": {"steps": 60, "sleep": 0.1, "progress_dir": str(progress)}}
    cfg = write_config(c, "torchspark", [run], conf=FAULT_CONF, tag="restart")
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
                            f"{r.result('restart')['error']}\n{r.stderr[-3000:]}")
            time.sleep(0.2)
        victim = next(k for k, h in c.hosts.items() if h.name == prog[1]["host"])
        t_cut = time.time()
        c.cut_link(victim)
        r = finish_driver(cfg, p, t0, (time.monotonic() - t0) + 120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    res = r.result("restart")
    att = res.get("attempts") or []
    observed = {"victim": c.hosts[victim].name, "ok": res["ok"],
                "nodes": [a["nodes"] for a in att],
                "noticed_after_s": round(att[0]["root_at"] - t_cut, 2) if att and
                att[0].get("root_at") else None,
                "next_attempt_after_s": round(att[1]["started"] - t_cut, 2)
                if len(att) > 1 else None,
                "cause": att[0]["cause"] if att else None,
                "excluded_executor": att[0].get("excluded_executor") if att else None,
                "error": (res["error"] or "")[:300]}
    record_property("observed", json.dumps(observed))
    print("OBSERVED " + json.dumps(observed))
    assert res["ok"], f"run() failed after the link cut: {res['error']}\n{r.stderr[-3000:]}"
    assert [a["nodes"] for a in att] == [2, 1], att
    h = c.hosts[victim]
    assert h.name in att[0]["cause"] or h.addr in att[0]["cause"], att[0]["cause"]
    assert observed["noticed_after_s"] is not None and observed["noticed_after_s"] <= 10, observed
    # The cut host's executor is excluded by its id (SparkContext.killAndReplaceExecutor), not
    # left in Spark's view until its heartbeat timeout.
    assert observed["excluded_executor"] is not None, observed
    assert len(res["result"]["ranks"]) == 1  # the second attempt ran on the survivor alone
