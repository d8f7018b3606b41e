"""The driver's log server as the tests and benchmarks drive it: the glue's binding
(torchspark.native._native.LogServer) with the calls only they make (the raw pull, a
formatted batch onto a stream, the drop counts, a blocking wait for rank 0's output, the
agent's environment), and :func:`format_line`. The glue itself pulls formatted text
(_pump.py) and reports (_progress.py), and its hang doctor is the server's watchdog
(_doctor.py)."""
from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, TextIO

from torchspark.native import _native
from torchspark.native._lib import LogLine, load_library
from torchspark.native._native import STDOUT, Line, endpoint_text

__all__ = ["LogServer", "format_line", "line_prefix", "load_library", "SECRET_ENV"]

SECRET_ENV = "TORCHSPARK_LOG_SECRET"


def _declare() -> None:
    """The C signatures of the calls only the tests and benchmarks make: this class's, the
    rendezvous' golden cases and counts, the agent's output sender run in-process (the
    glue's table, _lib.py, has those the glue makes)."""
    vp, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    sz, P = ctypes.c_size_t, ctypes.POINTER
    lib = load_library()
    for name, res, args in (("tsp_logserver_format_prefix", sz,
                             [c, sz, c, c, ctypes.c_int32, ctypes.c_uint]),
                            ("tsp_logserver_pull", i, [vp, P(LogLine), i, i]),
                            ("tsp_logserver_dropped", i,
                             [vp, P(ctypes.c_int32), P(ctypes.c_uint64), i]),
                            ("tsp_rdv_counts", None, [vp, P(i), P(i)]),
                            ("tsp_rdv_request", i, [c, i, c, c, c, sz, c, sz]),
                            ("tsp_rdv_record_mac", i, [c, c, c, sz]),
                            ("tsp_output_opts_init", None, [vp]),
                            ("tsp_output_send", i, [vp, c, c, sz])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_declare()


def line_prefix(rank: int, stream: int = STDOUT, fmt: Optional[str] = None,
                stderr_marker: Optional[str] = None) -> str:
    """The prefix of a line of ``rank``: ``fmt`` with ``{rank}`` expanded (the only field;
    None: ``"[rank {rank}] "``), then ``stderr_marker`` for a stderr line (None:
    ``"[stderr] "``); ``"[torchspark] "`` for the server's events. Formatted by the
    library, like every prefix users see."""
    lib = load_library()
    args = (_native._enc(fmt), _native._enc(stderr_marker), rank, stream)
    buf = ctypes.create_string_buffer(256)
    n = lib.tsp_logserver_format_prefix(buf, len(buf), *args)
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        lib.tsp_logserver_format_prefix(buf, len(buf), *args)
    return buf.value.decode("utf-8", "replace")


def format_line(line: Line, fmt: Optional[str] = None,
                stderr_marker: Optional[str] = None, errors: str = "replace") -> str:
    """``"[rank N] text"`` (stdout), ``"[rank N] [stderr] text"`` (stderr), no newline.

    ``fmt`` is a template where ``{rank}`` expands; invalid UTF-8 is shown with ``errors``
    (default: replacement characters). A ``\\r`` stays, so progress bars render.
    """
    return (line_prefix(line.rank, line.stream, fmt, stderr_marker)
            + line.data.decode("utf-8", errors))


class LogServer(_native.LogServer):
    """The glue's LogServer with the calls only tests and benchmarks make."""

    def __enter__(self) -> "LogServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` for ``torchspark-run --log-endpoint`` (IPv6 in brackets)."""
        return endpoint_text(self.host, self.port)

    def agent_env(self) -> Dict[str, str]:
        """The environment an agent needs besides ``--log-endpoint``."""
        return {SECRET_ENV: self.secret_hex}

    def pull(self, max_lines: int = 4096, timeout_ms: int = 200) -> List[Line]:
        """Up to ``max_lines`` lines, waiting up to ``timeout_ms`` for the first (-1: forever).

        Per agent the lines come in order, each exactly once. [] on timeout and, after
        :meth:`close`, once everything was pulled. One puller at a time.
        """
        with self._pull_lock:
            return self._pull("tsp_logserver_pull", max_lines, timeout_ms)

    def write_to(self, stream: TextIO, max_lines: int = 4096, timeout_ms: int = 200,
                 fmt: Optional[str] = None, stderr_marker: Optional[str] = None) -> int:
        """Pulls one batch and writes it formatted (one write, then flush). Returns the
        number of lines (and CONTINUED pieces) taken."""
        text, count = self._read_text(max_lines, timeout_ms, fmt, stderr_marker)
        if text:
            stream.write(text)
            stream.flush()
        return count

    def dropped(self) -> Dict[int, int]:
        """Lines dropped per rank by agents in drop mode (``--log-drop``)."""
        k = self._lib.tsp_logserver_dropped(self._h, None, None, 0)
        ranks, counts = (ctypes.c_int32 * max(k, 1))(), (ctypes.c_uint64 * max(k, 1))()
        k = min(k, self._lib.tsp_logserver_dropped(self._h, ranks, counts, k))
        return {ranks[i]: counts[i] for i in range(k)}

    def wait_output(self, timeout: Optional[float] = None) -> bool:
        """True once the output arrived with the right length and SHA-256."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        return bool(self._call("output", timeout_ms=ms)["received"])

    def output_bytes(self) -> Optional[bytes]:
        """The received output (memory mode), or None if it has not arrived."""
        view = self.output_view()
        return None if view is None else bytes(view)
