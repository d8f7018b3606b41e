"""The driver's restart loop without Spark (torchspark/driver/_restart.py, an adapter of the C run
controller): what the glue hands the controller and how it performs its actions. The
decisions themselves are the golden cases of tests/contracts/runctl.json
(test_contracts.py::test_runctl_golden); the loop on a real cluster, with executors killed,
is tests/e2e/test_restart.py."""
import logging

import pytest

from torchspark.driver import _restart
from torchspark.driver._report import TorchDistributorError

LOST = ("Job aborted due to stage failure: Task 1 in stage 0.0 failed 1 times, most recent "
        "failure: Lost task 1.0 in stage 0.0 (TID 1) (10.0.0.8 executor 1): ExecutorLostFailure "
        "(executor 1 exited caused by one of the running tasks) Reason: Command exited with code "
        "137  \nDriver stacktrace:")


def _run(once, **kw):
    args = dict(limit=2, spark=None, need_slots=2, replacement_timeout_s=0, remote=True,
                logger=logging.getLogger("t"))
    args.update(kw)
    return _restart.run(once, **args)


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
    # node's executor, and the report's structured reason and checkpoint step (the agent's
    # record of a node stopped after its checkpoint on request), never its lines.
    try:
        try:
            raise RuntimeError(LOST)
        except RuntimeError as spark_error:
            raise TorchDistributorError("TorchDistributor (distributed) failed: rank 0 ... "
                                        "reset", {"node_rank": 0}) from spark_error
    except TorchDistributorError as e:
        ev = _restart.failed_event(e, {"silent_node": 1, "silent_executor": "4"})
        text = str(e)
    assert ev == {"event": "attempt_failed", "message": text, "spark_error": LOST,
                  "node_rank": 0, "reason": "silent", "executor": "4", "checkpoint_step": None}
    stopped = TorchDistributorError("x", {"node_rank": 1, "reason": "decommission",
                                          "checkpoint_step": 12, "tail": ["step 11"]})
    ev = _restart.failed_event(stopped, {})
    assert (ev["reason"], ev["checkpoint_step"], ev["node_rank"]) == ("decommission", 12, 1)
    assert _restart.failed_event(TorchDistributorError("x", {"reason": "exit"}),
                                 {})["checkpoint_step"] is None


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


def test_min_nodes_is_checked_by_the_controller():
    assert _restart.min_nodes(None, 4) == 4  # not elastic
    assert _restart.min_nodes(2, 4) == 2
    with pytest.raises(ValueError, match="min_nodes is 5: give a whole number of nodes "
                                         r"\(barrier tasks\) from 1 to the run's 4"):
        _restart.min_nodes(5, 4)
