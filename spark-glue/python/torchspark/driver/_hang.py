"""The hang doctor's analysis: which rank is stuck, from the stacks the ranks dumped.

The analysis itself is the C core's (``tsp_hang_diagnose``, native/src/driver/hang.c,
docs/protocol.md 1.11), the same for the JVM glue, called by the driver's watchdog
(logwatch.c, docs/protocol.md 1.12): this module keeps the structured diagnosis its event
carries (:func:`from_reply`; the golden cases: tests/contracts/hang.json, replayed through
tests/helpers/hang.py). The glue's end of the watchdog is :mod:`torchspark.driver._doctor`;
the wire protocol is docs/protocol.md 1.9.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from torchspark.native._lib import json_call

__all__ = ["RankDump", "Diagnosis", "from_reply"]


@dataclass
class RankDump:
    """Whom one rank's answer came from (its marker's fields; its lines are the report's
    ``stacks`` and the stacks file's)."""

    rank: int
    host: str = "?"
    pid: int = 0
    state: str = "?"


@dataclass
class Diagnosis:
    line: str  # the one line naming the culprit(s)
    culprits: List[int]
    waiting: Dict[str, List[int]]  # collective (or place) -> ranks waiting in it
    dumps: Dict[int, RankDump]
    groups: List[Dict[str, Any]] = field(default_factory=list)  # {kind, ranks, text}
    starting: bool = False  # no rank has a Python stack yet: still starting, no hang
    stacks_file: Optional[str] = None  # where the watchdog wrote every rank's stacks
    # set by the driver's watchdog: seconds from the ranks' last line or report to this line
    after_s: float = 0.0
    # TorchDistributorError.report of a run the doctor cancels: the C core's document, the
    # same as the JVM runner's TorchSparkException.reportJson() (docs/protocol.md 1.11), its
    # "stacks" each answering rank's lines; the watchdog's event carries it with cancel only
    report: Dict[str, Any] = field(default_factory=dict)

    def stacks_text(self) -> str:
        """Every rank's dump, rank-prefixed: the stacks file's text after its first line
        (the line), which the watchdog wrote, read back by the C core (the op stacks);
        "" without a file (at 16,384 ranks ~10 MB: read when asked for, not kept)."""
        if not self.stacks_file:
            return ""
        req = {"op": "stacks", "file": self.stacks_file}  # an op without a server: handle NULL
        return "\n".join(json_call("tsp_logserver_call", req, handle=0)["lines"])


def from_reply(reply: Mapping[str, Any]) -> Diagnosis:
    """The Diagnosis of tsp_hang_diagnose's reply (docs/protocol.md 1.11)."""
    dumps = {d["rank"]: RankDump(d["rank"], d["host"], d["pid"], d["state"])
             for d in reply["dumps"]}
    return Diagnosis(reply["line"], reply["culprits"], reply["waiting"], dumps,
                     reply["groups"], reply["starting"], report=reply.get("report") or {})
