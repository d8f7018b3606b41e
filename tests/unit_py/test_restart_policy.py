"""The driver's restart loop without Spark (torchspark/driver/_restart.py, an adapter of the C run
controller): what the glue hands the controller and how it performs its actions. The
decisions themselves are the golden cases of tests/contracts/runctl.json
(test_contracts.py::test_runctl_golden); the loop on a real cluster, with executors killed,
is tests/e2e/test_restart.py."""
import logging

import pytest

from torchspark.driver import _connect, _restart
from torchspark.driver._report import TorchDistributorError

LOST = ("Job aborted due to stage failure: Task 1 in stage 0.0 failed 1 times, most recent "
        "failure: Lost task 1.0 in stage 0.0 (TID 1) (10.0.0.8 executor 1): ExecutorLostFailure "
        "(executor 1 exited caused by one of the running tasks) Reason: Command exited with code "
        "137  \nDriver stacktrace:")


def _run(once, *, limit=2, spark=None, need_slots=2, remote=True, least_slots=None, batch=None,
         launch=None, dynamic=False, record=None, times=None):
    start = {"event": "start", "glue": "python", "nodes": need_slots, "max_restarts": limit,
             "min_nodes": least_slots, "replacement_timeout_ms": 0, "remote": remote,
             "batch": batch, "launch": launch, "dynamic": dynamic}
    return _restart.run(lambda submit: once(submit["attempt"], submit["env"], submit["nodes"]),
                        start, spark=spark, logger=logging.getLogger("t"),
                        record=[] if record is None else record, times={} if times is None else times)


def test_the_attempt_gets_the_submit_whose_last_says_a_failure_raises():
    """run_once gets the controller's submit: its last (not the attempt number against
    max_restarts: a grow is no restart) chooses the wait for Spark's own error (_job)."""
    seen = []

    def once(submit):
        seen.append((submit["attempt"], submit["last"]))
        raise TorchDistributorError("TorchDistributor (distributed) failed: boom")

    start = {"event": "start", "glue": "python", "nodes": 1, "max_restarts": 1, "min_nodes": None,
             "replacement_timeout_ms": 0, "remote": True}
    with pytest.raises(TorchDistributorError):
        _restart.run(once, start, spark=None, logger=logging.getLogger("t"), record=[], times={})
    assert seen == [(0, False), (1, True)]


def test_each_attempt_gets_the_previous_cause_and_the_end_lists_them_all():
    seen = []

    def once(attempt, env, nodes):
        assert nodes == 2  # no survivors rule (min_nodes): every attempt on all the nodes
        seen.append((attempt, env))
        raise TorchDistributorError(f"TorchDistributor (distributed) failed: boom {attempt}",
                                    {"rank": attempt})

    record = []
    with pytest.raises(TorchDistributorError) as ei:
        _run(once, record=record)
    assert [a for a, _ in seen] == [0, 1, 2]
    assert seen[0][1] == {"TORCHSPARK_ATTEMPT": "0", "TORCHSPARK_MAX_RESTARTS": "2"}
    assert seen[2][1]["TORCHSPARK_RESTART_CAUSE"] == "boom 1"
    text = str(ei.value)
    assert text.startswith("TorchDistributor (distributed) failed after 3 attempt(s) "
                           "(max_restarts=2)"), text
    assert "  attempt 0: boom 0\n  attempt 1: boom 1\n  attempt 2: boom 2" in text, text
    assert ei.value.report["attempts"] == ["boom 0", "boom 1", "boom 2"]
    assert ei.value.report["rank"] == 2  # the last attempt's report, with the history
    assert str(ei.value.__cause__).endswith("boom 2")
    assert [r["cause"] for r in record] == ["boom 0", "boom 1", "boom 2"]
    assert all(r["ended"] >= r["started"] for r in record)


def test_success_after_a_restart_returns_its_result():
    calls = []

    def once(attempt, env, nodes):
        calls.append(attempt)
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: lost")
        return "result"

    assert _run(once, limit=3, need_slots=1) == "result"
    assert calls == [0, 1]


def test_other_errors_are_not_retried():
    def once(attempt, env, nodes):
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        _run(once, limit=3, need_slots=1)


def test_no_restarts_raise_the_attempts_own_error():
    err = TorchDistributorError("TorchDistributor (distributed) failed: boom")

    def once(attempt, env, nodes):
        raise err

    with pytest.raises(TorchDistributorError) as ei:
        _run(once, limit=0)
    assert ei.value is err


def test_what_the_glue_hands_the_controller():
    # Spark's text as the exception's cause (read by the C outcome table only), a silent
    # node's executor, and the exception's report as it is (the controller reads its
    # structured reason and checkpoint step: the agent's record of a node stopped after its
    # checkpoint on request), never its lines.
    try:
        try:
            raise RuntimeError(LOST)
        except RuntimeError as spark_error:
            raise TorchDistributorError("TorchDistributor (distributed) failed: rank 0 ... "
                                        "reset", {"node_rank": 0}) from spark_error
    except TorchDistributorError as e:
        class Server:
            def nodes_lost(self):
                return [2]

        ev = _restart.failed_event(e, {"silent_node": 1, "silent_executor": "4",
                                       "server": Server(), "root_at": 1.5, "ended_at": 2.5})
        text = str(e)
    # the node the outcome excluded: a fact; its reason (silent, unless the record says
    # preempted), like the report's node, reason and checkpoint step, is the run
    # controller's reading (runctl.json); the log server's nodes lost, as they are; when
    # the failure was noticed and Spark's job ended, for the controller's record
    assert ev == {"event": "attempt_failed", "message": text, "spark_error": LOST,
                  "report": {"node_rank": 0}, "silent_node": 1, "executor": "4",
                  "lost_nodes": [2], "root_at": 1.5, "ended_at": 2.5}
    stopped = TorchDistributorError("x", {"node_rank": 1, "reason": "decommission",
                                          "checkpoint_step": 12, "tail": ["step 11"]})
    assert _restart.failed_event(stopped, {})["report"] is stopped.report
    assert _restart.failed_event(TorchDistributorError("x"), {})["report"] == {}


def test_the_attempts_are_the_controllers_record():
    """distributor.attempts is the controller's state's record of each attempt (runctl.json
    pins it): the glue's clock of each event ("at"), what it observed of a failure, the
    executor Spark excluded; the attempt in flight is there with ended and cause None."""
    class Spark:
        class sparkContext:
            class _jsc:
                @staticmethod
                def sc():
                    return Exec()

    class Exec:
        def killAndReplaceExecutor(self, eid):
            return eid == "7"

    record, times = [], {}

    def once(attempt, env, nodes):
        assert record[-1] == {"attempt": attempt, "nodes": nodes, "started": record[-1]["started"],
                              "ended": None, "cause": None}
        if attempt == 0:
            times.update(root_at=1.0, ended_at=2.0, silent_node=1, silent_executor="7")
            raise TorchDistributorError("TorchDistributor (distributed) failed: silent", {})
        return "done"

    assert _run(once, spark=Spark(), limit=1, least_slots=1, remote=False, record=record,
                times=times) == "done"
    first, second = record
    assert first["cause"] == "silent" and first["excluded_executor"] == "7"
    assert (first["root_at"], first["ended_at"], first["silent_node"]) == (1.0, 2.0, 1)
    assert first["started"] <= first["ended"] <= second["started"] <= second["ended"]
    assert second["cause"] is None and "silent_node" not in second


def test_spark_connect_leaves_out_the_decommissioned_node():
    seen = []

    def once(attempt, env, nodes):
        seen.append(nodes)
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: rank 1 (node "
                                        "1, local rank 0) on host h was terminated by signal "
                                        "15.", {"node_rank": 1, "reason": "decommission",
                                                "checkpoint_step": 8})
        return "done"

    record = []
    assert _run(once, limit=1, least_slots=1, record=record) == "done"
    assert seen == [2, 1]
    assert record[0]["cause"] == ("node 1's executor is being decommissioned: step 8 was "
                                  "checkpointed on request and the node stopped")


@pytest.mark.parametrize("launch, wait", [
    (None, "Spark's barrier slot check waits for the slots"),
    ("gang", "the gang launch waits for the slots (spark.torchspark.gang.timeout)")])
def test_a_connect_restart_names_the_wait_of_the_launch_it_uses(caplog, launch, wait):
    """The restart warning on Spark Connect says what waits for the slots: Spark's barrier
    slot check, or in a gang launch (no barrier stage) the gang's deadline; the launch is a
    structured field of the controller's start (runctl.json), never matched in text."""
    def once(attempt, env, nodes):
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: boom", {})
        return "done"

    with caplog.at_level(logging.WARNING, logger="t"):
        assert _run(once, limit=1, launch=launch) == "done"
    (text,) = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
    assert text.endswith(f"(Spark Connect: {wait})"), text


def test_spark_connect_leaves_out_the_nodes_the_log_server_saw_lost():
    """The attempt's root record is a survivor's gloo error; its log server (read after
    the attempt ended: its drain) saw node 1's executor go (docs/protocol.md 1.7)."""
    seen, times = [], {}

    class Server:
        def nodes_lost(self):
            return [1]

    def once(attempt, env, nodes):
        seen.append(nodes)
        if attempt == 0:
            times["server"] = Server()
            raise TorchDistributorError("TorchDistributor (distributed) failed: rank 0 (node 0, "
                                        "local rank 0) on host h exited with code 1.",
                                        {"node_rank": 0, "reason": "exit"})
        return "done"

    record = []
    assert _run(once, limit=1, least_slots=1, record=record, times=times) == "done"
    assert seen == [2, 1] and record[0]["lost_nodes"] == [1]
    assert record[0]["cause"].startswith("node 1 was lost: its executor or host went away")


def test_min_nodes_is_checked_by_the_controller():
    assert _restart.min_nodes(None, 4) == 4  # not elastic
    assert _restart.min_nodes(2, 4) == 2
    with pytest.raises(ValueError, match="min_nodes is 5: give a whole number of nodes "
                                         r"\(barrier tasks\) from 1 to the run's 4"):
        _restart.min_nodes(5, 4)


def test_a_shrunk_attempt_is_watched_and_asked_to_checkpoint_then_grows(monkeypatch):
    """The grow watch performs the controller's watch_slots / checkpoint_and_stop from its
    own thread while the attempt runs (docs/protocol.md 11, "Growing back"); the stop after
    the checkpoint (reason grow) is not a restart: max_restarts=1 is used by the first
    failure, and the run still goes on at its full size."""
    import threading

    slots = iter([1, 2])  # the shrunk attempt's counts: nothing new, then the slot is back
    monkeypatch.setattr(_restart, "count_slots", lambda spark: next(slots, 2))
    asked = threading.Event()

    class Server:
        def checkpoint_all(self, why):
            asked.set()
            return why == 1

        def nodes_lost(self):
            return []

    times, seen = {}, []

    def once(attempt, env, nodes):
        seen.append((attempt, nodes, env.get("TORCHSPARK_ELASTIC_BATCH")))
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: boom", {})
        if attempt == 1:
            times["server"] = Server()
            assert asked.wait(20), "never asked to checkpoint"
            raise TorchDistributorError("TorchDistributor (distributed) failed: grew",
                                        {"reason": "grow", "checkpoint_step": 7})
        return "done"

    record = []
    monkeypatch.setattr(_restart, "_WATCH_SCALE", 0.01)
    assert _run(once, limit=1, remote=False, least_slots=1, times=times, record=record,
                batch="global") == "done"
    assert seen == [(0, 2, "global"), (1, 1, "global"), (2, 2, "global")]
    assert "grows back" in record[1]["cause"] and "step 7" in record[1]["cause"]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_smaller_connect_attempt_probes_for_the_missing_slots_then_grows(monkeypatch, dynamic):
    """On Spark Connect the watch counts by a probe (docs/protocol.md 11, "Growing back on
    Spark Connect"): nothing before the attempt's agents connected, then one barrier job of
    the missing nodes under its own tag; once it ran, the attempt is asked to checkpoint and
    the run goes on at its full size. (The job itself on a real Connect server:
    test_distributor_connect.py::test_decommission_of_a_function_run_checkpoints_and_resumes.)"""
    import threading
    import time

    calls = []

    class Frame:
        def mapInArrow(self, fn, schema, barrier=False):
            calls.append(("mapInArrow", fn, schema, barrier))
            return self

        def collect(self):
            return [{"t0": 1.0, "t1": 2.0}]  # the probe's one task ran

    class Conf:
        def get(self, key, default):
            assert key == "spark.dynamicAllocation.enabled"
            return "true" if dynamic else default

    class Session:
        conf = Conf()

        def range(self, *args):
            calls.append(("range",) + args)
            return Frame()

        def addTag(self, tag):
            calls.append(("addTag", tag))

        def removeTag(self, tag):
            calls.append(("removeTag", tag))

        def interruptTag(self, tag):
            calls.append(("interruptTag", tag))

    asked = threading.Event()

    class Server:
        agents = 0

        def stats(self):
            return {"authenticated": self.agents}

        def nodes_lost(self):
            return []

        def checkpoint_all(self, why):
            asked.set()
            return True

    times, seen = {}, []

    def once(attempt, env, nodes):
        seen.append(nodes)
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: x",
                                        {"node_rank": 1, "reason": "decommission",
                                         "checkpoint_step": 8})
        if attempt == 1:
            times["server"] = server = Server()
            time.sleep(0.3)  # ten of the watch's periods: no probe before its agent is there
            assert calls == []
            server.agents = 1
            assert asked.wait(20), "never asked to checkpoint"
            raise TorchDistributorError("TorchDistributor (distributed) failed: grew",
                                        {"reason": "grow", "checkpoint_step": 12})
        return "done"

    record = []
    monkeypatch.setattr(_restart, "_WATCH_SCALE", 0.01)
    monkeypatch.setattr(_connect, "PROBE_HOLD_S", 0.05)
    assert _run(once, spark=Session(), limit=1, least_slots=1, times=times,
                record=record, dynamic=dynamic) == "done"
    assert seen == [2, 1, 2]
    assert "grows back" in record[1]["cause"] and "step 12" in record[1]["cause"]
    tag = calls[0][1]
    assert tag.startswith("torchspark-probe-") and len(tag) == len("torchspark-probe-") + 32
    fn = calls[2][1]
    assert calls[:4] == [("addTag", tag), ("range", 0, 1, 1, 1),
                         ("mapInArrow", fn, "t0 double, t1 double", not dynamic),
                         ("removeTag", tag)]
    # Each task reads its batches and yields its start and end, holding its slot between
    # (under dynamic allocation: Spark refuses barrier stages there, SPARK-24942).
    (out,) = list(fn(iter([1, 2])))
    t0, t1 = out.column("t0")[0].as_py(), out.column("t1")[0].as_py()
    assert t1 - t0 >= (0.05 if dynamic else 0)
    deadline = time.monotonic() + 5  # the hold's thread, under dynamic allocation
    while dynamic and len(calls) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    # One probe, ended before the attempt: nothing to interrupt. Under dynamic allocation the
    # slot it found is then held (_gang.Hold, whose DataFrame starts on the session).
    assert calls[4:] == ([("range", 0, 1, 1, 1)] if dynamic else [])


def test_a_probe_of_ordinary_tasks_counts_only_when_they_overlapped():
    """Under dynamic allocation the probe's k tasks show k free slots only when they all
    held their slots at once; a barrier probe's k rows are enough (Spark ran them together)."""
    at_once = [{"t0": 0.0, "t1": 3.0}, {"t0": 2.5, "t1": 5.5}]
    one_after_another = [{"t0": 0.0, "t1": 3.0}, {"t0": 3.1, "t1": 6.1}]
    assert _connect.probe_ran(at_once, 2, barrier=False)
    assert not _connect.probe_ran(one_after_another, 2, barrier=False)
    assert _connect.probe_ran(one_after_another, 2, barrier=True)
    assert not _connect.probe_ran(at_once[:1], 2, barrier=True)


@pytest.mark.parametrize("mode, world, rank, want", [
    (None, 3, 0, 8), ("per_rank", 3, 2, 8), ("global", 2, 0, 12), ("global", 3, 0, 8),
    ("global", 5, 0, 5), ("global", 5, 4, 4)])
def test_batch_size_keeps_the_per_rank_or_the_global_batch(monkeypatch, mode, world, rank, want):
    from torchspark import checkpoint

    env = {"TORCHSPARK_MAX_NODES": "3", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": str(world),
           "RANK": str(rank)}
    if mode:
        env["TORCHSPARK_ELASTIC_BATCH"] = mode
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert checkpoint.batch_size(8) == want  # 8 per rank at the full size: 24 in all
    with pytest.raises(ValueError, match="per_rank must be >= 1"):
        checkpoint.batch_size(0)


def test_the_start_is_the_distributors_run_with_its_launch_resolved():
    """start_event: what a TorchDistributor's run tells the controller (docs/protocol.md 11):
    its nodes and settings, the launch as the settings' read resolved it (auto: conf.c)."""
    from types import SimpleNamespace

    class Conf:
        def get(self, key, default):
            return "true" if key == "spark.dynamicAllocation.enabled" else default

    settings = {"job.replacementTimeout": 30000, "elastic.batch": "global", "launch": "gang"}
    dist = SimpleNamespace(spark=SimpleNamespace(conf=Conf()), _settings=settings, num_tasks=3,
                           max_restarts=2, min_nodes=2, is_remote=False)
    assert _restart.start_event(dist) == {
        "event": "start", "glue": "python", "nodes": 3, "max_restarts": 2, "min_nodes": 2,
        "replacement_timeout_ms": 30000, "remote": False, "batch": "global", "launch": "gang",
        "dynamic": True}
    assert _restart.step(None, _restart.start_event(dist))["state"]["gang"] == 1
