"""The failure report: what failed (rank, host, exit code or signal, the worker's error
and whole traceback, the last lines of output), carried from a barrier task to the driver
inside the task's exception text, and turned into one readable message.

It is built from the agent's failure document (its --error-file JSON, the same text the
agent sends the driver; native/src/agent/report.h owns it): the traceback there is the worker's
whole traceback, chained causes included, already capped by the agent (200 lines: the
first and last 100; docs/cli.md), and shown here as it is. The exit status follows the
agent's one rule: the document's "exitcode"/"signal"; without a document, the agent's own
status, 128 + signal when it was killed (:func:`exit_status`).

Carrier: a line ``TORCHSPARK-FAILURE-REPORT-V1:<base64 JSON>`` in the task's exception
message; Spark copies that message into the job's failure, where the driver finds it.
(docs/protocol.md, "Failure report")
"""
from __future__ import annotations

import base64
import json
import re
import signal as _signal
from typing import Dict, Iterable, List, Optional

from torchspark import _native

MARKER = "TORCHSPARK-FAILURE-REPORT-V1:"
_MARKER_RE = re.compile(re.escape(MARKER) + r"([A-Za-z0-9+/=]+)")
TAIL_IN_MESSAGE = 20


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


def _error_file_text(data: Optional[Dict]) -> "tuple[Optional[str], Optional[str]]":
    """(message, traceback) of a failure document (torchelastic's layout)."""
    msg = (data or {}).get("message")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        text = msg.get("message")
        return (str(text) if text is not None else None,
                stack if isinstance(stack, str) and stack else None)
    return (str(msg) if msg is not None else None), None


def exit_status(returncode: int) -> "tuple[int, int]":
    """(exit status, signal) as the shell reports a process's end, the agent's rule
    (tsp_proc_exit_code): the exit code, or 128 + signal for a Popen returncode of -signal."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, 0


def rank_tail(lines: List[str], rank: Optional[int]) -> List[str]:
    """The lines of one rank (by their "[rank R] " prefix), else all of them."""
    if rank is None:
        return lines
    prefix = _native.line_prefix(rank)
    mine = [ln for ln in lines if ln.startswith(prefix)]
    return mine or lines


def build(*, node_rank: int, host: str, returncode: int, tail: Iterable[str],
          error_file: Optional[Dict], nproc_per_node: int) -> Dict:
    """A report from one agent's exit status, output tail and --error-file JSON."""
    ts = (error_file or {}).get("torchspark") or {}
    status, sig = exit_status(returncode)
    exitcode = ts.get("exitcode", status)
    sig = ts.get("signal", sig)
    local_rank = ts.get("local_rank")
    rank = ts.get("rank")
    if rank is None and nproc_per_node == 1:
        rank, local_rank = node_rank, 0
    tail = rank_tail(list(tail), rank)
    message, traceback = _error_file_text(error_file)
    return {
        "version": 1,
        "node_rank": ts.get("node_rank", node_rank),
        "rank": rank,
        "local_rank": local_rank,
        "host": ts.get("host") or host,
        "pid": ts.get("pid"),
        "exitcode": exitcode,
        "signal": sig or 0,
        "time": ts.get("time"),
        "message": message,
        "traceback": traceback,
        "agent_exitcode": returncode,
        "tail": list(tail),
    }


def encode(report: Dict) -> str:
    return MARKER + base64.b64encode(json.dumps(report).encode()).decode()


def find(text: str) -> List[Dict]:
    """Every report carried in text (a Spark failure message), oldest root cause first."""
    found = []
    for m in _MARKER_RE.finditer(text):
        try:
            found.append(json.loads(base64.b64decode(m.group(1))))
        except ValueError:
            continue
    # The same report may appear twice (task message + chained cause): keep one.
    unique = list({json.dumps(r, sort_keys=True): r for r in found}.values())
    unique.sort(key=lambda r: (r.get("time") or "~"))
    return unique


def _what(report: Dict) -> str:
    sig = report.get("signal") or 0
    if sig:
        try:
            name = _signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by {name} ({sig})"
    return f"exited with code {report.get('exitcode')}"


def _who(report: Dict) -> str:
    rank = report.get("rank")
    parts = [f"rank {rank}" if rank is not None else "a worker"]
    inner = [f"node {report.get('node_rank')}"]
    if report.get("local_rank") is not None:
        inner.append(f"local rank {report.get('local_rank')}")
    return f"{parts[0]} ({', '.join(inner)}) on host {report.get('host')}"


def format_message(report: Dict, mode: str, tail: Optional[List[str]] = None) -> str:
    """One message naming the root cause; tail overrides the report's own tail."""
    lines = [f"TorchDistributor ({mode}) failed: {_who(report)} {_what(report)}."]
    text = report.get("traceback") or report.get("message")
    if text:
        lines.append("Error:")
        lines += ["  " + ln for ln in str(text).rstrip().splitlines()]
    out = tail if tail is not None else list(report.get("tail") or [])
    out = out[-TAIL_IN_MESSAGE:]
    rank = report.get("rank")
    who = f"rank {rank}" if rank is not None else f"node {report.get('node_rank')}"
    if out:
        lines.append(f"Last {len(out)} lines of {who}'s output:")
        lines += ["  " + ln for ln in out]
    else:
        lines.append(f"{who} printed nothing.")
    lines.append("To fix it: correct the error above in the training code or its inputs and "
                 "run again; every rank's full output went to the driver's stderr"
                 + (" and the executors' logs." if mode == "distributed" else "."))
    return "\n".join(lines)
