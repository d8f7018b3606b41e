"""The exception of a failed distributed job: from the channel's structured root record
first (docs/protocol.md 1.7), from Spark's error text only as a fallback, one ordered
table (_SPARK_TEXT) read in order; the messages are the C core's (report.c, outcome.c)."""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from torchspark.driver import _report
from torchspark.native import _native, _rendezvous
from torchspark.task import _boot
from torchspark.driver._report import TorchDistributorError


class NotInstalled(Exception):
    """A task could not import the driver's torchspark (_boot.prepare): ship it."""


class NoRendezvous(Exception):
    """A task could not reach the driver's rendezvous (_rendezvous.py): use allGather."""


def of_job(out: Any, ch: Any, nproc: int) -> Exception:
    """The exception of the job whose _job.Outcome is out; ch: its _channel.Channel."""
    root = out.root
    if root is not None and root.get("kind") == "failure" and root.get("report"):
        failure = _report.Failure.from_document(
            root["report"], node_rank=root.get("node_rank", -1),
            host=root.get("host") or "?", nproc_per_node=nproc)
        return failure.error("distributed", ch.tail(failure.fields), root.get("detail"))
    text = str(out.spark_error) if out.spark_error is not None else ""
    for marker, make in _SPARK_TEXT:
        if marker == _report.MARKER and root is not None:
            # The channel's other record, a node lost, outranks what a task carried
            # (but not a set-up error: that node was lost to Spark's abort).
            return lost_node(root, ch, nproc)
        found = make(text)
        if isinstance(found, _report.Failure):
            return found.error("distributed", ch.tail(found.fields))
        if found is not None:
            return found
    if root is not None:
        return lost_node(root, ch, nproc)
    # Spark's own text, classified by the C core's outcome table (torchspark/outcome.h).
    spark = _report.outcome(None, text or type(out.spark_error).__name__,
                            _report._OUTPUT_WENT["distributed"])
    return TorchDistributorError(
        f"TorchDistributor (distributed) failed: {spark['cause']}\n{spark['advice']}",
        {"version": 2, "kind": spark["kind"], "reason": spark["reason"]})


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


def _after(marker: str, make: Callable[[str], Exception]) -> Callable[[str], Optional[Exception]]:
    """A task's set-up error (_boot.py): ``marker: text`` in Spark's error text."""
    def read(text: str) -> Optional[Exception]:
        m = re.search(re.escape(marker) + r": (.*)", text)
        return make(m.group(1).strip()) if m else None
    return read


def _carried(text: str) -> Optional[_report.Failure]:
    """The oldest failure document a task carried in Spark's error text."""
    documents = _report.find(text)
    return _report.Failure.from_document(documents[0]) if documents else None


# Spark's error text, read only where the channel recorded no failed rank: one ordered
# table of (marker, constructor), the first found wins.
_Found = Optional[Union[Exception, _report.Failure]]
_SPARK_TEXT: Tuple[Tuple[str, Callable[[str], _Found]], ...] = (
    (_boot.NOT_INSTALLED, _after(_boot.NOT_INSTALLED, NotInstalled)),
    (_rendezvous.UNREACHABLE, _after(_rendezvous.UNREACHABLE, NoRendezvous)),
    (_boot.SETUP_ERROR, _after(_boot.SETUP_ERROR, TorchDistributorError)),
    (_report.MARKER, _carried),
)
