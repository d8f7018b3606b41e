"""The driver's log pump: one thread moving the native log server's lines to sys.stderr.

sys.stderr is looked up at each write, so a notebook's replacement stream gets them.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional

__all__ = ["_LogPump"]


# Lines per pull: the native text buffer (4 MiB) is the real bound for ordinary lines.
MAX_LINES = 1 << 16
# After a batch smaller than SMALL_BATCH characters (the queue was drained), wait LINGER_S
# before the next pull, so that lines accumulate: a pull per line costs the driver a wake-up,
# a ctypes call and a write() on a Python stream per line, and at a million lines per
# second that alone keeps a core busy (it did: ~2 lines per write(), 44k lines/s through
# run(), docs/benchmarks.md, "Worker lines through TorchDistributor.run()"). LINGER_S is the
# most a line waits on the driver beyond its arrival; a lone line is still written as soon as
# it arrives.
LINGER_S = 0.01
SMALL_BATCH = 256 << 10
# How long one pull waits for a first line: stop() is seen within this (the native wait
# cannot be interrupted), and run() calls stop() before it returns.
WAIT_MS = 20


class _LogPump:
    """Moves lines from the native log server to sys.stderr (looked up at each write,
    so a notebook's replacement stream gets them), rank-prefixed, in one thread: each
    batch is formatted natively into one buffer and written with one write() call."""

    _print_lock = threading.Lock()
    # A progress line (torchspark/driver/_progress.py) is drawn on a terminal, without a newline:
    # the next write clears it first. Guarded by _print_lock.
    status_shown = False

    def __init__(self, server: Any, fmt: Optional[str] = None,
                 tick: Optional[Callable[[], None]] = None) -> None:
        self.server = server
        self.fmt = fmt  # the line prefix, "{rank}" expanded (read_text); None: "[rank N] "
        self.tick = tick  # called after each pull (the hang doctor's poll)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="torchspark-log-pump")
        self._thread.start()

    def _drain_once(self, timeout_ms: int) -> int:
        # Formatted natively (one prefix format, lines.c): no Python work per line.
        text = self.server.read_text(MAX_LINES, timeout_ms, self.fmt)
        if text:
            _LogPump.write(text)
        return len(text)

    @staticmethod
    def write(text: str) -> None:
        """text on the driver's stderr in one write(), after clearing a progress line."""
        with _LogPump._print_lock:
            if _LogPump.status_shown:
                sys.stderr.write("\r\x1b[K")
                _LogPump.status_shown = False
            sys.stderr.write(text)
            sys.stderr.flush()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                got = self._drain_once(WAIT_MS)
                if self.tick is not None:
                    self.tick()
                if 0 < got < SMALL_BATCH:
                    self._stop.wait(LINGER_S)
            while self._drain_once(0):
                pass
        except Exception as e:  # never fail training because of logging
            sys.stderr.write(f"torchspark: log channel reader stopped: {e!r}\n")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
