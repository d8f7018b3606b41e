"""The exception of a failed distributed job, as the C core's outcome says (outcome.c,
docs/protocol.md 10: the channel's structured root record first, then what a task carried
in Spark's text, Spark's own text last); the messages and reports are the C core's
(report.c, outcome.c)."""
from __future__ import annotations

from typing import Any, Callable, Dict

from torchspark.driver import _report
from torchspark.driver._report import TorchDistributorError


class NotInstalled(Exception):
    """A task could not import the driver's torchspark (_boot.prepare): ship it."""


class NoRendezvous(Exception):
    """A task could not reach the driver's rendezvous (_rendezvous.py): use allGather. Its
    text: the library's line saying so, which the driver logs."""


def of_job(out: Any, ch: Any, nproc: int) -> Exception:
    """The exception of the job whose _job.Outcome is out; ch: its _channel.Channel. The
    C core's outcome (docs/protocol.md 10) decides and writes it; a failure document it
    names is finished by the C core with the driver's lines of the ranks it asks for."""
    found = _report.outcome(out.root, _report.spark_text(out.spark_error),
                            **_report.product("distributed"), nproc_per_node=nproc)
    if found["setup"] in _SETUP:  # a task's set-up error: ship, go on through allGather
        return _SETUP[found["setup"]](found["message"])  # the text, or the line to log
    if found["finish"] is None:
        return TorchDistributorError(found["message"], found["report"])
    lines = {str(r): "\n".join(ch.tail({"rank": r}) or []) for r in found["lines_of"]}
    return _report.raised({**found["finish"], "lines": lines})


# What a task's set-up error asks of the driver (the outcome's "setup"): the others raise.
_SETUP: Dict[str, Callable[[str], Exception]] = {"not_installed": NotInstalled,
                                                "rendezvous_unreachable": NoRendezvous}
