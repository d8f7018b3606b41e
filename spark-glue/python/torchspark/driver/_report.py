"""The failure, read: the C core writes it (torchspark/failure.h, docs/protocol.md §8), this
module only carries it and raises it.

The agent's failure document (its --error-file JSON, the same text it sends the driver
over the log channel) is finished by ``tsp_failure_report``: the agent's exit status when
it left no document, the failing rank's last lines, the one-line summary, and the
exception's message, for both carriers: the log server's root record and a task's exception
text, where a task carries its finished document as ``TORCHSPARK-FAILURE-REPORT-V2:<base64
JSON>`` (Spark copies that message into the job's failure, where the C outcome finds it).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from torchspark.native._lib import json_call

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
    """A node's finished failure document (tsp_task_finish's), carried to the driver."""

    def __init__(self, document: Dict[str, Any]) -> None:
        self.document = document

    def error(self, mode: str, lines: Optional[Dict[str, str]] = None) -> TorchDistributorError:
        """The exception: the C core's message for this mode ("local" or "distributed"),
        showing the failed rank's driver lines of ``lines`` (rank -> its lines: the node's
        every rank, tsp_failure_report's "lines"), else the document's tail; the document's
        fields as attributes."""
        return raised({"document": self.document, **product(mode), "lines": lines})


def product(mode: str) -> Dict[str, str]:
    """What asks the C core for this glue's message: its product, the mode, where the
    ranks' output went."""
    return {"product": "TorchDistributor", "mode": mode, "output_went": _OUTPUT_WENT[mode]}


def raised(request: Dict[str, Any]) -> TorchDistributorError:
    """The exception of the failure document that ``tsp_failure_report`` finishes from
    request (docs/protocol.md section 8), its message and report the C core's."""
    reply = json_call("tsp_failure_report", request)
    return TorchDistributorError(reply["message"], reply["report"])


def spark_text(error: Optional[BaseException]) -> Optional[str]:
    """Spark's failure text, the only prose the C core reads (its outcome table): the
    exception's text (a Py4J error's holds its Java causes), else its type; None."""
    return None if error is None else str(error) or type(error).__name__


def outcome(root: Optional[Dict[str, Any]], spark_error: Optional[str],
            output_went: Optional[str] = None, **keys: Any) -> Dict[str, Any]:
    """A failed run's outcome, classified by the C core (torchspark/outcome.h,
    docs/protocol.md §10) from the log server's root record (None when it has none) and
    Spark's failure text (None when none): kind, reason, restart, node_rank, executor,
    exclude, cause, the set-up error and the failure document a task carried in Spark's
    text (setup, text, carried), and advice (naming output_went, where every rank's output
    went); with keys product, mode and nproc_per_node, what the glue raises (message,
    report; finish and lines_of for a failure document)."""
    result: Dict[str, Any] = json_call("tsp_outcome_classify", {
        "root": root, "spark_error": spark_error, "output_went": output_went, **keys})
    return result
