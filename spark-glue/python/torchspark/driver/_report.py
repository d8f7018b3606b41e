"""The failure, read: the C core writes it (torchspark/failure.h, docs/protocol.md §8), this
module only carries it and raises it.

The agent's failure document (its --error-file JSON, the same text it sends the driver
over the log channel) is finished by ``tsp_failure_report``: the agent's exit status when
it left no document, the failing rank's last lines, the one-line summary, and the
exception's message. :meth:`Failure.from_document` is the one way in, for both carriers:
the log server's root record and a task's exception text, where a task carries its
finished document as ``TORCHSPARK-FAILURE-REPORT-V2:<base64 JSON>`` (Spark copies that
message into the job's failure, where the driver finds it).
"""
from __future__ import annotations

import base64
import json
from typing import Any, Dict, List, Optional

from torchspark.native._lib import json_call

MARKER = "TORCHSPARK-FAILURE-REPORT-V2:"  # read by the C outcome (docs/protocol.md 10, row 4)
# Where every rank's output went, by mode, for the message's last sentence.
_OUTPUT_WENT = {"local": "the driver's stderr",
                "distributed": "the driver's stderr and the executors' logs"}


class TorchDistributorError(RuntimeError):
    """Raised by TorchDistributor.run() when training failed on any rank.

    Attributes name the root cause: ``rank``, ``node_rank``, ``local_rank``, ``host``,
    ``exitcode``, ``signal`` (0 when none), ``error_message`` (the rank's error, one
    line), ``traceback`` (its whole traceback, chained causes included, capped at 200
    lines), ``output_tail`` (its last output lines) and ``report`` (all of it, a dict).
    The Spark exception, when there is one, is the ``__cause__``.
    """

    def __init__(self, message: str, report: Optional[Dict] = None) -> None:
        super().__init__(message)
        report = report or {}
        self.report = report
        self.rank = report.get("rank")
        self.node_rank = report.get("node_rank")
        self.local_rank = report.get("local_rank")
        self.host = report.get("host")
        self.exitcode = report.get("exitcode")
        self.signal = report.get("signal") or 0
        self.error_message = report.get("message")
        self.traceback = report.get("traceback")
        self.output_tail: List[str] = list(report.get("tail") or [])


class Failure:
    """A finished failure document and, when asked for, its message."""

    def __init__(self, document: Dict[str, Any], message: Optional[str],
                 report: Optional[Dict[str, Any]] = None) -> None:
        self.document = document
        self.message = message
        self.report = report  # the exception's report (with a message), written by the C core
        self.fields: Dict[str, Any] = dict(document.get("torchspark") or {})

    @classmethod
    def from_document(cls, document: Optional[Dict[str, Any]], *, status: int = 1,
                      node_rank: int = -1, host: str = "?", nproc_per_node: int = 0,
                      tail: Optional[List[str]] = None, mode: Optional[str] = None,
                      shown_tail: Optional[List[str]] = None,
                      detail: Optional[str] = None) -> "Failure":
        """The agent's document (None: it left none; status is then the agent's Popen
        returncode) finished by the C core with what this side knows: the agent's output
        ``tail`` (the failing rank's lines are kept), and, with ``mode``, the message
        showing ``shown_tail`` (the driver's lines of that rank) or the document's.
        A document with the agent's own lines of the rank keeps them: ``tail`` is then
        not sent (docs/protocol.md section 8)."""
        if tail is not None and ((document or {}).get("torchspark") or {}).get("tail"):
            tail = None
        request: Dict[str, Any] = {
            "document": document, "status": status, "node_rank": node_rank, "host": host,
            "nproc_per_node": nproc_per_node,
            "tail": None if tail is None else "\n".join(tail)}
        if mode is not None:
            request.update(product="TorchDistributor", mode=mode, output_went=_OUTPUT_WENT[mode],
                           shown_tail=None if shown_tail is None else "\n".join(shown_tail),
                           detail=detail)
        reply = json_call("tsp_failure_report", request)
        return cls(reply["document"], reply["message"], reply.get("report"))

    def error(self, mode: str, shown_tail: Optional[List[str]] = None,
              detail: Optional[str] = None) -> TorchDistributorError:
        """The exception: the C core's message for this mode ("local" or "distributed"),
        showing ``shown_tail`` (the driver's lines of the rank) or the document's tail, and
        ``detail`` (the driver's job-wide view); the document's fields as attributes."""
        done = Failure.from_document(self.document, mode=mode, shown_tail=shown_tail,
                                     detail=detail)
        return TorchDistributorError(str(done.message), done.report)

    def encode(self) -> str:
        """The task's carrier: one line of its exception text."""
        return MARKER + base64.b64encode(json.dumps(self.document).encode()).decode()


def outcome(root: Optional[Dict[str, Any]], spark_error: Optional[str],
            output_went: Optional[str] = None) -> Dict[str, Any]:
    """A failed run's outcome, classified by the C core (torchspark/outcome.h,
    docs/protocol.md §10) from the log server's root record (None when it has none) and
    Spark's failure text (None when none): kind, reason, restart, node_rank, executor,
    exclude, cause, the set-up error and the failure document a task carried in Spark's
    text (setup, text, carried), and advice (naming output_went, where every rank's output
    went)."""
    request: Dict[str, Any] = {"root": root, "spark_error": spark_error}
    if output_went is not None:
        request["output_went"] = output_went
    result: Dict[str, Any] = json_call("tsp_outcome_classify", request)
    return result
