"""The failure report: what failed (rank, host, exit code or signal, the agent's
error-file message, the last lines of output), carried from a barrier task to the driver
inside the task's exception text, and turned into one readable message.

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
MESSAGE_LINES = 40
TAIL_IN_MESSAGE = 20


class TorchDistributorError(RuntimeError):
    """Raised by TorchDistributor.run() when training failed on any rank.

    Attributes name the root cause: ``rank``, ``node_rank``, ``local_rank``, ``host``,
    ``exitcode``, ``signal`` (0 when none), ``error_message`` (from the rank's error
    file), ``output_tail`` (its last output lines) and ``report`` (all of it, a dict).
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
        self.output_tail: List[str] = list(report.get("tail") or [])


def _error_file_message(data: Optional[Dict]) -> Optional[str]:
    if not data:
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        text = msg.get("message")
        extra = msg.get("extraInfo") or {}
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        if stack and isinstance(stack, str) and (not text or text not in stack):
            return f"{text}\n{stack}" if text else stack
        return str(text) if text is not None else None
    return str(msg) if msg is not None else None


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
    exitcode = ts.get("exitcode", returncode if returncode >= 0 else 128 - returncode)
    sig = ts.get("signal", -returncode if returncode < 0 else 0)
    if not sig and isinstance(exitcode, int) and exitcode > 128 and "signal" not in ts:
        sig = exitcode - 128
    local_rank = ts.get("local_rank")
    rank = ts.get("rank")
    if rank is None and nproc_per_node == 1:
        rank, local_rank = node_rank, 0
    tail = rank_tail(list(tail), rank)
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
        "message": _error_file_message(error_file),
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
    msg = report.get("message")
    if msg:
        msg_lines = str(msg).rstrip().splitlines()
        if len(msg_lines) > MESSAGE_LINES:
            msg_lines = msg_lines[:MESSAGE_LINES // 2] + ["  ..."] + msg_lines[-MESSAGE_LINES // 2:]
        lines.append("Error:")
        lines += ["  " + ln for ln in msg_lines]
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
