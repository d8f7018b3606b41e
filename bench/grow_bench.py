"""Elastic size that grows back (issue 31): cycles of one run each on
local-cluster[3,1,1024] with num_processes=3, max_restarts=1, min_nodes=2: node 1's
executor JVM is SIGKILLed mid-training, the run goes on with 2 nodes at once, the standalone
worker registers a replacement executor, and the driver grows the run back to 3 nodes from
the step it checkpointed on request (test_restart.grow_back, the suite's 2-node test).

Per cycle: passed (nodes 3 -> 2 -> 3, 0 steps lost when it grew, no training process left),
the time from Spark's 3 slots to the 2-node attempt stopped at its checkpoint (the driver's
part), and to the first step on 3 nodes (the regrow, a new attempt's start included).

--jvm: the same cycle through the JVM runner, one spark-submit of TrainApp (restart mode,
options onrequest,elastic,grow) per cycle on local-cluster[2,1,1024] with 2 nodes, minNodes(1):
node 1's executor SIGKILLed, nodes 2 -> 1 -> 2 (test_jvm_restart's preemption test with
SIGKILL); "3 slots" reads "2 slots" there, Spark's registration of the replacement (a
listener in TrainApp).

--dynamic: every cycle on local-cluster[3,1,1024] with dynamic allocation on (from 0
executors, maxExecutors 3, a 5 s idle timeout): every attempt is a gang launch
(spark.torchspark.launch auto), and a replacement executor starts only within Spark's
requested total, which each attempt's gang launch sets (requestTotalExecutors); the smaller
attempt holds a slot for the missing node (_gang.Hold), which keeps the replacement from the
idle timeout. Stock TorchDistributor is tried once first in the same session: it is refused at
submission (SPARK-24942), recorded as "stock". With --jvm: the TrainApp cycle with the same
settings (maxExecutors 2).

--connect: the cycle through Spark Connect, TorchDistributor.run() in function mode (the
Connect suite's training, test_distributor_connect._train_on_request) from a client of a real
Connect server (tests/helpers/tsp_connect.py) on local-cluster[3,1,1024] whose executors lack
torchspark (it ships itself as a session artifact), the plugin on: node 1's executor
decommissioned (SIGPWR: it checkpoints on request, test_distributor_connect's path), on 2 nodes
at once from the next step (min_nodes 2: the client knows the node it lost), grown back to 3
once the client's probe job ran (_connect.Probe). --sigkill: SIGKILL in its place, no
notice: the node's agent tells the client's log server that its executor JVM is gone (the
nodes lost, docs/protocol.md 1.7), so the 2-node attempt starts at once from the last
periodic checkpoint (steps since it are lost: resumed_next_step false) and grows back as
above. Before 30c1418 the client took a survivor's gloo error for the root cause and
restarted on 3 nodes, waiting for Spark's barrier slot check. "3 slots"
reads: the server's driver registered the replacement executor (its log). With --dynamic the
server runs with dynamic allocation (as above): every attempt a gang launch, the probe k
ordinary tasks that overlap; stock refused in the session.

--preempt (with --jvm): SIGTERM to node 1's executor JVM in place of SIGKILL, the executor
plugin on (test_jvm_restart's preemption test): per cycle also the checkpoint's time after the
signal (goal <= 2 s) and attempt 1's first step right after it (0 steps lost).

    .venv/bin/python -m bench.grow_bench [--runs 10] [--quick] [--jvm [--preempt] | --connect
        [--sigkill]] [--dynamic]
"""
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from bench import harness

DYNAMIC = {  # --dynamic: as tests/e2e/test_gang_launch.py, 3 executors at most
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.minExecutors": "0",
    "spark.dynamicAllocation.initialExecutors": "0",
    "spark.dynamicAllocation.maxExecutors": "3",
    "spark.dynamicAllocation.executorIdleTimeout": "5s",
}

tsp_spark, tr = harness.helpers("tsp_spark", "test_restart")


def cycle(spark, tmp: Path, i: int) -> dict:
    t0 = time.time()
    got = tr.grow_back(spark, tmp, f"cycle{i}", nodes=3)
    return _verdict(got["attempts"], got["log"], got["back"],
                    tsp_spark.wait_gone(tr.MARK_VALUE, 15), t0, got["killed"])


def connect_cycle(server, tmp: Path, mark: str, sig: int) -> dict:
    """One run() through Spark Connect: nodes 3 -> 2 -> 3 (node 1's executor sent sig)."""
    import threading

    tc = harness.helper("test_distributor_connect")
    t0, box, steplog = time.time(), {}, tmp / "steplog"

    def train():
        try:
            box["dist"] = tc.TorchDistributor(num_processes=3, local_mode=False, use_gpu=False,
                                              max_restarts=1, min_nodes=2)
            box["dist"].run(tc._train_on_request, str(tmp / "ckpt"), str(steplog), 100000,
                            tr.EVERY, "2", 6)
        except BaseException as e:  # noqa: B902 - recorded below
            box["error"] = e

    t = threading.Thread(target=train, daemon=True)
    t.start()
    deadline = time.monotonic() + 300
    while len(tr._steplog(steplog)) < tr.STEPS_PER_ATTEMPT and time.monotonic() < deadline:
        time.sleep(0.02)
    jvm = tr.executor_of_node(1, mark)
    assert jvm, f"no executor runs node 1 ({box})"
    registered = tc._registered(server)
    os.kill(jvm, sig)
    killed, back = time.time(), None
    while t.is_alive() and time.monotonic() < deadline + 300:
        if back is None and tc._registered(server) - registered:
            back = time.time()  # the server's driver registered the replacement
        time.sleep(0.1)
    t.join(1)
    assert not t.is_alive() and "error" not in box, f"the run did not end well: {box}"
    log = tr._steplog(steplog)
    last0, first1 = ([s for a, s, _ in log if a == n] for n in ("0", "1"))
    return {**_verdict(box["dist"].attempts, log, back, tsp_spark.wait_gone(mark, 15), t0,
                       killed), "resumed_next_step": bool(first1) and first1[0] == last0[-1] + 1}


def _verdict(att, log, back, left, t0, killed) -> dict:
    last1 = [s for a, s, _ in log if a == "1"][-1] if any(a == "1" for a, _, _ in log) else None
    grown = [s for a, s, _ in log if a == "2"]
    ok = ([a["nodes"] for a in att] == [3, 2, 3] and last1 is not None and bool(grown)
          and grown[0] == last1 + 1 and not left and back is not None)
    first2 = next((ts for a, _, ts in log if a == "2"), None)
    return {"passed": ok, "nodes": [a["nodes"] for a in att], "left": len(left),
            "back_after_kill_s": round(back - killed, 2) if back else None,
            "stopped_s": round(att[1]["ended"] - back, 2) if ok else None,
            "regrow_s": round(first2 - back, 2) if ok and first2 else None,
            "cycle_s": round(time.time() - t0, 1)}


def jvm_cycle(tmp: Path, dynamic: bool, preempt: bool) -> dict:
    """One TrainApp run through the JVM runner: nodes 2 -> 1 -> 2."""
    t0 = time.time()
    jr = harness.helper("test_jvm_restart")
    conf = {**jr.CONF, **DYNAMIC, "spark.dynamicAllocation.maxExecutors": "2"} if dynamic else jr.CONF
    out, _, killed = jr._run_and_kill(tmp, -1, 100000, 8, fail_run=False,
                                      sig=signal.SIGTERM if preempt else signal.SIGKILL,
                                      opts=("onrequest", "elastic", "grow"), conf=conf)
    att = [json.loads(a) for a in out.get("ATTEMPT", [])]
    log = tr._steplog(tmp / "steplog")
    last1 = [s for a, s, _ in log if a == "1"][-1] if any(a == "1" for a, _, _ in log) else None
    grown = [s for a, s, _ in log if a == "2"]
    added = [t / 1000 for t in json.loads(out.get("EXECUTOR_ADDED", ["[]"])[0]) if t / 1000 > killed[0][0]]
    back = min(added) if added else None
    ok = ([a["nodes"] for a in att] == [2, 1, 2] and last1 is not None and bool(grown)
          and grown[0] == last1 + 1 and out.get("LEFT") == ["0"] and back is not None)
    first2 = next((ts for a, _, ts in log if a == "2"), None)
    if preempt:  # the checkpoint after the signal, attempt 1 right after it (0 steps lost)
        ckpt = [s for a, s, _ in log if a == "0"][-1] if log else None
        saved = killed[-1].get(ckpt) if ckpt is not None else None
        first1 = [s for a, s, _ in log if a == "1"][:1]
        lost0 = first1 == [ckpt + 1] if ckpt is not None else False
        ok = ok and lost0 and saved is not None and saved - killed[0][0] <= 2.0
        extra = {"checkpoint_s": round(saved - killed[0][0], 2) if saved else None,
                 "zero_lost": lost0}
    else:
        extra = {}
    return {"passed": ok, **extra, "nodes": [a["nodes"] for a in att], "left": out.get("LEFT"),
            "stopped_s": round(att[1]["ended"] / 1000 - back, 2) if ok else None,
            "regrow_s": round(first2 - back, 2) if ok and first2 else None,
            "cycle_s": round(time.time() - t0, 1)}


def connect_server(mark: str, dynamic: bool):
    """A real Connect server on local-cluster[3,1,1024] as the suite's (tests/e2e/conftest.py:
    the plugin, decommission on, the executors' Python without torchspark); with dynamic
    allocation when asked."""
    tsp_connect = harness.helper("tsp_connect")
    where = Path(tempfile.mkdtemp(prefix="grow-bench-connect-"))
    jvmutil = harness.helper("jvmutil")
    server = tsp_connect.ConnectServer(where, {f"spark.executorEnv.{tsp_spark.MARK}": mark,
                                               "spark.plugins": jvmutil.PLUGIN,
                                               "spark.jars": str(jvmutil.JAR),
                                               "spark.decommission.enabled": "true",
                                               **(DYNAMIC if dynamic else {})},
                                       master="local-cluster[3,1,1024]",
                                       env={"PYSPARK_PYTHON": tsp_spark.python_without_torchspark(
                                           where / "venv")})
    try:
        server.wait_ready()
    except BaseException:  # noqa: B902 - interrupted or failed: no server left behind
        server.stop()
        raise
    print(json.dumps({"connect_server": server.url, "log": str(server.log_path)}), flush=True)
    return server


def _stock_step():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_world_size()


def stock(spark) -> str:
    """Stock TorchDistributor in the same session: its error's first line, or "ran"."""
    from pyspark.ml.torch.distributor import TorchDistributor as StockDistributor

    try:
        StockDistributor(num_processes=3, local_mode=False, use_gpu=False).run(_stock_step)
        return "ran"
    except Exception as e:  # noqa: B902 - recorded: the comparison's other side
        text = f"{e} {e.__cause__}"
        return ("refused at submission (SPARK-24942)" if "SPARK-24942" in text
                else text.splitlines()[0][:200])


def main() -> None:
    ap = harness.cli(__doc__, runs=10)
    ap.add_argument("--jvm", action="store_true", help="the JVM runner's cycle (TrainApp)")
    ap.add_argument("--dynamic", action="store_true", help="dynamic allocation on (gang launch)")
    ap.add_argument("--connect", action="store_true", help="run() from a Spark Connect client")
    ap.add_argument("--sigkill", action="store_true", help="with --connect: SIGKILL, not SIGPWR")
    ap.add_argument("--preempt", action="store_true", help="with --jvm: SIGTERM, the plugin on")
    args = harness.parse(ap)
    name = ("grow_bench" + ("_jvm" if args.jvm else "") + ("_connect" if args.connect else "")
            + ("_sigkill" if args.connect and args.sigkill else "") + ("_dynamic" if args.dynamic else "")
            + ("_preempt" if args.jvm and args.preempt else ""))
    run = harness.Run(name, args)
    server, mark = None, tsp_spark.CONNECT_MARK
    if args.connect:
        server = connect_server(mark, args.dynamic)
        spark = server.session()
    else:
        spark = None if args.jvm else harness.spark_session("local-cluster[3,1,1024]", {
            f"spark.executorEnv.{tsp_spark.MARK}": tr.MARK_VALUE,
            "spark.torchspark.job.replacementTimeout": "180s",
            **(DYNAMIC if args.dynamic else {}),
        })
    cycles, refused = [], None
    try:
        if args.dynamic and spark is not None:
            refused = stock(spark)
            print(json.dumps({"stock": refused}), flush=True)
        for i in range(args.runs):
            tmp = Path(tempfile.mkdtemp(prefix="grow-bench-"))
            try:
                cycles.append(jvm_cycle(tmp, args.dynamic, args.preempt) if args.jvm
                              else connect_cycle(server, tmp, mark, signal.SIGKILL if args.sigkill
                                                 else signal.SIGPWR) if server
                              else cycle(spark, tmp, i))
            except AssertionError as e:
                cycles.append({"passed": False, "error": str(e)[:300]})
            print(json.dumps(cycles[-1]), flush=True)
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
    ok = [c for c in cycles if c["passed"]]
    n = 2 if args.jvm else 3
    stopped = run.figure(f"{n} slots -> the {n - 1}-node attempt stopped", [c["stopped_s"] for c in ok], "s", 2)
    regrow = run.figure(f"{n} slots -> first step on {n} nodes", [c["regrow_s"] for c in ok], "s", 2)
    if args.jvm and args.preempt:
        run.figure("SIGTERM -> checkpoint complete", [c["checkpoint_s"] for c in ok], "s", 2)
    res = {"cycles": len(cycles), "passed": len(ok),
           **({"stock": refused} if refused else {}), "stopped_median_s": stopped["median"],
           "regrow_median_s": regrow["median"], "regrow_max_s": regrow["max"], "each": cycles}
    print(json.dumps(res, indent=1))
    run.results = res
    run.finish()


if __name__ == "__main__":
    main()
