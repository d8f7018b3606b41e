"""The driver's restart policy without Spark (torchspark/_restart.py): the knobs' checks,
the cause each attempt hands on, the final message. The policy on a real cluster, with
executors killed, is tests/e2e/test_restart.py."""
import logging

import pytest

from torchspark import _restart
from torchspark._report import TorchDistributorError


def test_a_lost_executor_is_the_cause_not_the_survivors_error():
    try:
        try:
            raise RuntimeError(
                "Job aborted due to stage failure: Could not recover from a failed barrier "
                "ResultStage. Most recent failure reason: Stage failed because barrier task "
                "ResultTask(1, 1) finished unsuccessfully.\nExecutorLostFailure (executor 1 "
                "exited caused by one of the running tasks) Reason: Command exited with code "
                "137\n\tat ...")
        except RuntimeError as spark_error:
            raise TorchDistributorError(
                "TorchDistributor (distributed) failed: rank 0 (node 0, local rank 0) on host h "
                "exited with code 1.\nError: gloo Connection reset by peer") from spark_error
    except TorchDistributorError as e:
        cause = _restart.root_cause(e)
    assert cause == ("executor 1 exited caused by one of the running tasks: Command exited "
                     "with code 137 (ExecutorLostFailure)")
    plain = TorchDistributorError("TorchDistributor (distributed) failed: rank 1 exited.\nx")
    assert _restart.root_cause(plain) == "rank 1 exited."


def test_a_decommissioned_node_is_the_cause():
    # The node's rank printed torchspark.checkpoint's line after a checkpoint on request
    # (the plugin's decommission notice), then was stopped: RestartPolicy.java's wording.
    e = TorchDistributorError(
        "TorchDistributor (distributed) failed: rank 1 (node 1, local rank 0) on host h "
        "was terminated by signal 15.", {"node_rank": 1, "tail": [
            "step 11", "torchspark.checkpoint: step 12 checkpointed on request (executor "
            "decommission); waiting to be stopped"]})
    assert _restart.root_cause(e) == ("node 1's executor is being decommissioned: step 12 "
                                      "was checkpointed on request and the node stopped")
    # The line only in the lines the message shows (the driver's), not in the report's.
    shown = TorchDistributorError(
        "TorchDistributor (distributed) failed: rank 1 (node 1, local rank 0) on host h "
        "exited with code 143.\nLast 2 lines of rank 1's output:\n  [rank 1] step 11\n"
        "  [rank 1] torchspark.checkpoint: step 11 checkpointed on request (executor "
        "decommission); waiting to be stopped", {"node_rank": 1, "tail": []})
    assert _restart.root_cause(shown).startswith("node 1's executor is being decommissioned: "
                                                 "step 11 was checkpointed")


def test_each_attempt_gets_the_previous_cause_and_the_end_lists_them_all():
    seen = []

    def once(attempt, cause, nodes):
        assert nodes == 2  # no survivors rule (min_nodes): every attempt on all the nodes
        seen.append((attempt, cause, _restart.attempt_env(attempt, 2, cause)))
        raise TorchDistributorError(f"TorchDistributor (distributed) failed: boom {attempt}",
                                    {"rank": attempt})

    with pytest.raises(TorchDistributorError) as ei:
        _restart.run(once, limit=2, spark=None, need_slots=2, replacement_timeout_s=0,
                     remote=True, logger=logging.getLogger("t"))
    assert [(a, c) for a, c, _ in seen] == [(0, None), (1, "boom 0"), (2, "boom 1")]
    assert seen[0][2] == {"TORCHSPARK_ATTEMPT": "0", "TORCHSPARK_MAX_RESTARTS": "2"}
    assert seen[2][2]["TORCHSPARK_RESTART_CAUSE"] == "boom 1"
    text = str(ei.value)
    assert text.startswith("TorchDistributor (distributed) failed after 3 attempt(s) "
                           "(max_restarts=2)"), text
    assert "  attempt 0: boom 0\n  attempt 1: boom 1\n  attempt 2: boom 2" in text, text
    assert ei.value.report["attempts"] == ["boom 0", "boom 1", "boom 2"]
    assert str(ei.value.__cause__).endswith("boom 2")


def test_success_after_a_restart_returns_its_result():
    calls = []

    def once(attempt, cause, nodes):
        calls.append(attempt)
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: lost")
        return "result"

    assert _restart.run(once, limit=3, spark=None, need_slots=1, replacement_timeout_s=0,
                        remote=True, logger=logging.getLogger("t")) == "result"
    assert calls == [0, 1]


def test_other_errors_are_not_retried():
    def once(attempt, cause, nodes):
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        _restart.run(once, limit=3, spark=None, need_slots=1, replacement_timeout_s=0,
                     remote=True, logger=logging.getLogger("t"))


def test_min_nodes_on_spark_connect_leaves_out_the_lost_node():
    # The Connect client cannot count slots: the next attempt runs without the nodes the
    # last one lost with their executors, when min_nodes allows; else on all of them.
    lost = {"cause": "executor 1 exited caused by one of the running tasks: Command exited "
                     "with code 137 (ExecutorLostFailure)"}
    gone = {"cause": "node 1's executor is being decommissioned: step 8 was checkpointed on "
                     "request and the node stopped"}
    silent = {"cause": "lost connection to node 1 (host h, address a): it went silent",
              "silent_node": 1}
    failed = {"cause": "rank 1 (node 1, local rank 0) on host h exited with code 1"}
    assert [_restart.lost_nodes(e) for e in (lost, gone, silent, failed, {})] == [1, 1, 1, 0, 0]
    assert _restart.next_nodes(None, 3, 1, 0, remote=True, lost=1) == 2
    assert _restart.next_nodes(None, 2, 2, 0, remote=True, lost=1) == 2  # not elastic
    assert _restart.next_nodes(None, 2, 1, 0, remote=True, lost=0) == 2
    seen = []

    def once(attempt, cause, nodes):
        seen.append(nodes)
        if attempt == 0:
            raise TorchDistributorError("TorchDistributor (distributed) failed: rank 1 (node "
                                        "1, local rank 0) on host h was terminated by signal "
                                        "15.", {"node_rank": 1, "tail": [
                                            "torchspark.checkpoint: step 8 checkpointed on "
                                            "request (executor decommission); waiting to be "
                                            "stopped"]})
        return "done"

    assert _restart.run(once, limit=1, spark=None, need_slots=2, least_slots=1,
                        replacement_timeout_s=0, remote=True,
                        logger=logging.getLogger("t")) == "done"
    assert seen == [2, 1]


LOST = ("Job aborted due to stage failure: Task 1 in stage 0.0 failed 1 times, most recent "
        "failure: Lost task 1.0 in stage 0.0 (TID 1) (10.0.0.8 executor 1): ExecutorLostFailure "
        "(executor 1 exited caused by one of the running tasks) Reason: Command exited with code "
        "137  \nDriver stacktrace:")


def test_root_cause_of_a_lost_executor_is_the_outcome_tables():
    """Spark's ExecutorLostFailure is read by the C core's outcome table, not by the glue
    (issue 29): the same cause as RestartPolicy.rootCause (RunnerTest)."""
    e = TorchDistributorError("TorchDistributor (distributed) failed: rank 1 ... Connection "
                              "reset by peer")
    e.__cause__ = RuntimeError(LOST)
    assert _restart.root_cause(e) == ("executor 1 exited caused by one of the running tasks: "
                                      "Command exited with code 137 (ExecutorLostFailure)")
    e.__cause__ = RuntimeError(LOST.replace("Command exited with code 137",
                                            "Executor decommission: worker decommissioned"))
    assert _restart.root_cause(e).endswith(": Executor decommission: worker decommissioned "
                                           "(ExecutorLostFailure)")
    e.__cause__ = RuntimeError("Job 3 cancelled because SparkContext was shut down")
    assert _restart.root_cause(e) == "rank 1 ... Connection reset by peer"
