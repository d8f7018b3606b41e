"""The hang doctor on the driver (docs/distributor.md, "The hang doctor").

The watchdog is the C log server's (docs/protocol.md 1.12): its clock from the attempt's
workers' start, the DUMP, the collection, the analysis, the stacks file and, with
``hang_action="cancel"``, the STOP to every agent. This glue configures it, prints the lines
of its one event as they are, and keeps the diagnosis for run()'s TorchDistributorError.
"""
from __future__ import annotations

import tempfile
import threading
from typing import Any, List, Optional

from torchspark.driver import _hang
from torchspark.driver._pump import _LogPump

__all__ = ["HangDoctor", "configure"]


def configure(dist: Any, hang_timeout_ms: Optional[int], hang_action: str) -> None:
    """The constructor's part: ``dist.hang_timeout`` (seconds, None when off) and
    ``dist.hang_action`` from the settings (the arguments, else the Spark conf: _conf.py)."""
    dist.hang_timeout = None if hang_timeout_ms is None else hang_timeout_ms / 1000
    dist.hang_action = hang_action
    dist.hang_reports = []


class HangDoctor:
    """Turns the server's watchdog on for ``world`` ranks and performs its events: the
    log pump calls :meth:`poll` between its batches (_pump.py), the channel once more
    before the server closes."""

    def __init__(self, server: Any, timeout: float, action: str, world: int,
                 logger: Any = None, reports: Optional[List[Any]] = None) -> None:
        self.server, self.logger = server, logger
        self.diagnoses: List[_hang.Diagnosis] = reports if reports is not None else []
        server.watch(timeout, action, world, tempfile.gettempdir())
        self._taking = threading.Lock()  # held while events are taken and performed

    def poll(self) -> None:
        """Performs the events the watchdog queued, in order."""
        with self._taking:
            while self._perform(self.server.hang_event(0)):
                pass

    def _perform(self, ev: Any) -> bool:
        if ev is None:
            return False
        _LogPump.write("".join(line + "\n" for line in ev["say"]))
        if ev.get("diagnosis") is None:
            return True
        diag = _hang.from_reply(ev["diagnosis"])
        diag.after_s, diag.stacks_file = ev["after_s"], ev["stacks_file"]
        self.diagnoses.append(diag)
        if self.logger is not None:  # DEBUG: the stacks are on stderr already, and in the file
            self.logger.debug("\n".join(ev["say"]))
        return True
