"""The exception of a failed distributed job, as the C core's outcome says (outcome.c,
docs/protocol.md 10: the channel's structured root record first, then what a task carried
in Spark's text, Spark's own text last); the messages are the C core's (report.c,
outcome.c)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from torchspark.driver import _report
from torchspark.native import _native
from torchspark.driver._report import TorchDistributorError


class NotInstalled(Exception):
    """A task could not import the driver's torchspark (_boot.prepare): ship it."""


class NoRendezvous(Exception):
    """A task could not reach the driver's rendezvous (_rendezvous.py): use allGather."""


def of_job(out: Any, ch: Any, nproc: int) -> Exception:
    """The exception of the job whose _job.Outcome is out; ch: its _channel.Channel. The
    C core's outcome (docs/protocol.md 10) decides which of the channel's root record and
    what Spark's text holds is the cause; this performs it."""
    root = out.root
    text = str(out.spark_error) if out.spark_error is not None else ""
    found = _report.outcome(root, text or type(out.spark_error).__name__,
                            _report._OUTPUT_WENT["distributed"])
    if found["carried"] is not None:  # the failure document a task carried
        failure = _report.Failure.from_document(found["carried"])
        return failure.error("distributed", ch.tail(failure.fields))
    if found["kind"] == "failure" and root.get("report"):
        failure = _report.Failure.from_document(
            root["report"], node_rank=root.get("node_rank", -1),
            host=root.get("host") or "?", nproc_per_node=nproc)
        return failure.error("distributed", ch.tail(failure.fields), root.get("detail"))
    if found["kind"] in ("failure", "lost"):  # a record without a document: the node's lines
        return lost_node(root, ch, nproc)
    if found["kind"] == "task":  # a task's set-up error: ship, go on through allGather, raise
        return _SETUP.get(found["setup"], TorchDistributorError)(found["text"])
    return TorchDistributorError(
        f"TorchDistributor (distributed) failed: {found['cause']}\n{found['advice']}",
        {"version": 2, "kind": found["kind"], "reason": found["reason"]})


def lost_node(root: Dict, ch: Any, nproc: int) -> TorchDistributorError:
    """A node whose agent vanished (host or executor died, network cut): the log
    server's document of it (docs/protocol.md 1.7), finished with the node's last lines
    by the C core, which writes the message."""
    node = int(root.get("node_rank", -1))
    tail: List[str] = []
    for rank in range(node * nproc, (node + 1) * nproc) if node >= 0 else ():
        got = ch.tail({"rank": rank}) or []
        tail += [_native.line_prefix(rank) + ln for ln in got]
    failure = _report.Failure.from_document(
        root.get("report"), node_rank=node, host=root.get("host") or "?", tail=tail)
    return failure.error("distributed")


# What a task's set-up error asks of the driver (the outcome's "setup"): the others raise.
_SETUP: Dict[str, Callable[[str], Exception]] = {"not_installed": NotInstalled,
                                                "rendezvous_unreachable": NoRendezvous}
