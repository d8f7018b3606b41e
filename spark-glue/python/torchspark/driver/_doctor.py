"""The hang doctor's watchdog on the driver (docs/distributor.md, "The hang doctor").

When no rank has printed a line or reported for ``hang_timeout`` seconds (counted from
the attempt's workers' start: the first agent's authenticated connection, right before it
starts its workers, so that a job that hangs before its first line is named too), it asks every
agent for its workers' Python stacks (DUMP, docs/protocol.md 1.9), collects each rank's
dump from the log server's per-rank tail, prints one line naming the culprit
(:mod:`torchspark.driver._hang`), and with ``hang_action="cancel"`` stops the run, keeping the
diagnosis for run()'s TorchDistributorError. One dump per hang: it asks again only after
the ranks printed something since the last one.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from torchspark.driver import _hang
from torchspark.driver._pump import _LogPump

__all__ = ["HangDoctor", "configure", "TIMEOUT_CONF", "ACTION_CONF", "TAIL_LINES"]

TIMEOUT_CONF = "spark.torchspark.hangTimeout"
ACTION_CONF = "spark.torchspark.hangAction"
# Lines kept per rank by the log server when the doctor is on: a dump of a few threads
# with deep stacks (faulthandler prints at most 100 frames a thread) fits.
TAIL_LINES = 2000
QUIET_S = 0.5  # a dump is complete once every rank answered and the lines were quiet this long ...
COLLECT_MAX_S = 5.0  # ... or after this
TICK_S = 0.1
# A dump that finds the workers still starting (a rank without a Python stack yet or inside
# an import, the others waiting for it: docs/protocol.md 1.11) restarts the clock silently,
# this many times at most: then it is named (an import that never ends is a hang too).
MAX_STARTS = 3


def configure(dist: Any, hang_timeout_ms: Optional[int], hang_action: str) -> None:
    """The constructor's part: ``dist.hang_timeout`` (seconds, None when off) and
    ``dist.hang_action`` from the settings (the arguments, else the Spark conf: _conf.py)."""
    timeout = None if hang_timeout_ms is None else hang_timeout_ms / 1000
    action = hang_action
    dist.hang_timeout = timeout
    dist.hang_action = action
    dist.hang_reports = []


class HangDoctor:
    """Watches ``pump`` and ``hub`` (their ``last_activity``) for ``timeout`` seconds of
    silence; see the module's doc. ``world``: the number of ranks."""

    def __init__(self, server: Any, pump: Any, hub: Any, timeout: float, action: str,
                 world: int, logger: Any = None, reports: Optional[List[Any]] = None) -> None:
        self.server, self.pump, self.hub = server, pump, hub
        self.timeout, self.action, self.world = timeout, action, world
        self.logger = logger
        self.diagnoses: List[_hang.Diagnosis] = reports if reports is not None else []
        self.cancelled: Optional[_hang.Diagnosis] = None
        self._request = 0
        self._armed_after = time.monotonic()  # a dump needs activity after this
        self._started = 0.0  # when the first agent connected: its workers start
        self._starts = 0  # dumps that found the workers still starting
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="torchspark-hang-doctor")
        self._thread.start()

    def _last_activity(self) -> float:
        """When a rank last printed or reported, else when the attempt's workers started
        (the first agent's handshake with the log server: an agent connects as it starts
        its workers); 0 before that. A hang before the first line (init_process_group,
        the first collective) is a hang too: the timeout covers the workers' start."""
        if not self._started and self.server.stats().get("authenticated", 0) > 0:
            self._started = time.monotonic()
        return max([getattr(x, "last_activity", 0.0) for x in (self.pump, self.hub) if x]
                   + [self._started])

    def _run(self) -> None:
        try:
            while not self._stop.wait(TICK_S):
                last = self._last_activity()
                if not last or (self._request and last <= self._armed_after):
                    continue  # nothing printed since the last dump: one dump per hang
                if time.monotonic() - last >= self.timeout:
                    self._doctor()
                    if self.cancelled is not None:
                        return
        except Exception as e:  # never fail training because of the doctor
            self._say(f"torchspark: the hang doctor stopped: {e!r}")

    def _doctor(self) -> None:
        last = self._last_activity()
        silent_s = time.monotonic() - last
        n = self.server.dump_all()
        if n <= 0:
            self._say("torchspark: hang doctor: no rank printed or reported for "
                      f"{silent_s:.0f}s, but the agents cannot be asked for their stacks "
                      "(the log server stopped)")
            self._request = -1
            self._armed_after = time.monotonic()
            return
        self._request = n
        diag = _hang.diagnose(self._collect(n), self.world, n)
        self._armed_after = time.monotonic()
        diag.after_s = self._armed_after - last
        if diag.starting and self._starts < MAX_STARTS:  # the clock starts again, nothing said
            self._starts += 1
            self._started, self._request = self._armed_after, 0
            if self.logger is not None:
                self.logger.debug("torchspark: hang doctor: the workers are still starting; "
                                  + diag.line)
            return
        self.diagnoses.append(diag)
        head = (f"torchspark: hang doctor: no rank printed or reported for {silent_s:.0f}s; "
                + diag.line)
        self._say(head)
        diag.stacks_file = _write_stacks(diag)
        if diag.stacks_file:
            self._say(f"torchspark: every rank's stacks (hang doctor): {diag.stacks_file}")
        if self.logger is not None:  # DEBUG: the line and the stacks are on stderr already
            try:
                self.logger.debug(head + "\n" + diag.stacks_text())
            except Exception:
                pass
        if self.action == "cancel":
            self.cancelled = diag
            self.server.stop_all(("the hang doctor cancelled the run: " + diag.line)[:390])

    def _collect(self, request: int) -> Dict[int, List[str]]:
        deadline = time.monotonic() + COLLECT_MAX_S
        seen: Dict[int, List[str]] = {}
        quiet_since = time.monotonic()
        while True:
            now = time.monotonic()
            got = {r: self._section(r, request) for r in range(self.world)}
            if got != seen:
                seen, quiet_since = got, now
            complete = all(_answered(seen[r]) for r in seen)
            if (complete and now - quiet_since >= QUIET_S) or now >= deadline:
                break
            time.sleep(TICK_S)
        return seen

    def _section(self, rank: int, request: int) -> List[str]:
        lines = [b.decode("utf-8", "replace") for b in self.server.tail(rank)]
        tag = f"torchspark: stack dump #{request} of rank {rank} "
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith(tag):
                return lines[i:]
        return []

    def _say(self, text: str) -> None:
        with _LogPump._print_lock:
            if _LogPump.status_shown:
                sys.stderr.write("\r\x1b[K")
                _LogPump.status_shown = False
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=COLLECT_MAX_S + 5)


def _write_stacks(diag: _hang.Diagnosis) -> Optional[str]:
    """Every rank's stacks in a new file of the driver's temporary directory (mode 0600,
    a fresh name: the host is shared), for when there are too many to read on stderr;
    None when it cannot be written."""
    try:
        fd, path = tempfile.mkstemp(prefix="torchspark-hang-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(diag.line + "\n" + diag.stacks_text() + "\n")
        return path
    except OSError:
        return None


def _answered(lines: List[str]) -> bool:
    """A rank's dump is complete once its marker came and either says it cannot answer or
    its flight-recorder thread wrote (it always writes at least one line, docs/protocol.md
    1.9; maybe inside a line of faulthandler's, which the C analysis mends); a thread that
    cannot get the GIL leaves it to COLLECT_MAX_S."""
    return bool(lines) and (any(": cannot answer: " in ln for ln in lines[:2]) or any(
        _hang.RECORDER_PREFIX in ln for ln in lines[1:]))


def cancel_message(diag: _hang.Diagnosis, timeout: float, mode: str) -> str:
    """The TorchDistributorError's text of a run the doctor cancelled."""
    return (f"TorchDistributor ({mode}) was cancelled by the hang doctor: no rank printed "
            f"or reported for {timeout:g}s (spark.torchspark.hangTimeout); {diag.line}.\n"
            "Every rank's Python stacks:\n" + diag.stacks_text())


def report(diag: _hang.Diagnosis) -> Dict[str, Any]:
    """TorchDistributorError.report of a run the doctor cancelled: the C core's document
    (docs/protocol.md 1.11), the same as the JVM runner's."""
    return diag.report
