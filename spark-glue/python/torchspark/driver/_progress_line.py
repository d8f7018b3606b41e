"""The live progress line of a run's reports on the driver's stderr (PySpark only: the JVM
runner logs its lines and hands the reports to ``onReport``; ``spark.torchspark.progress``,
docs/jvm.md). Rewritten in place where stderr is a terminal, a plain line at most every
``PLAIN_EVERY_S`` seconds elsewhere (a log file, a notebook's captured stream), and a last
one when the run ends. The report hub (_progress.py) feeds it each report from its thread.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Dict

from torchspark.driver._pump import _LogPump

__all__ = ["ProgressLine"]

TTY_EVERY_S = 0.5  # in-place redraws of the progress line on a terminal
PLAIN_EVERY_S = 10.0  # a plain progress line at most this often elsewhere


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class ProgressLine:
    """The latest report of each rank and when the line was shown; off: shows nothing."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.latest: Dict[int, Any] = {}  # rank -> its latest Report with metrics
        self._shown_at = 0.0
        self._shown_count = 0
        self._tty = False

    def take(self, rep: Any) -> None:
        if rep.metrics:  # a params-only record leaves the progress line as it is
            self.latest[rep.rank] = rep

    def text(self, total: int) -> str:
        """``step S · rank R: name=value ... · N rank(s) reporting`` from the latest reports:
        the highest step of any rank, and rank 0's metrics (the lowest reporting rank's
        when rank 0 has not reported); total: the report() calls seen."""
        if not self.latest:
            return ""
        steps = [r.step for r in self.latest.values() if r.step is not None]
        head = min(self.latest)
        shown = self.latest[head]
        metrics = " ".join(f"{k}={_fmt(v)}" for k, v in shown.metrics.items())
        step = f"step {max(steps)} \u00b7 " if steps else ""
        return (f"torchspark: {step}rank {head}: {metrics} \u00b7 "
                f"{len(self.latest)} rank(s) reporting, {total} report(s)")

    def show(self, total: int, final: bool) -> None:
        """Draws the line when its interval passed (final: now, and ends it)."""
        if not self.on:
            return
        if total == self._shown_count:
            if final and self._tty and _LogPump.status_shown:
                with _LogPump._print_lock:  # the line in place is the last: end it
                    sys.stderr.write("\n")
                    sys.stderr.flush()
                    _LogPump.status_shown = False
            return
        now = time.monotonic()
        stream = sys.stderr
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        every = TTY_EVERY_S if self._tty else PLAIN_EVERY_S
        if not final and self._shown_at and now - self._shown_at < every:
            return
        if not final and not self._shown_at and not self._tty:
            self._shown_at = now  # the first plain line after a full interval, not at once
            return
        self._shown_at = now
        self._shown_count = total
        text = self.text(total)
        if self._tty:
            with _LogPump._print_lock:
                stream.write("\r\x1b[K" + text + ("\n" if final else ""))
                stream.flush()
                _LogPump.status_shown = not final
        else:
            _LogPump.write(text + "\n")
