"""ctypes binding of libtorchspark's driver-side log server (docs/protocol.md, part 1).

The driver starts a :class:`LogServer`, hands ``server.endpoint`` and ``server.secret_hex``
to the agents (``torchspark-run --log-endpoint HOST:PORT`` with the secret on a pipe that
``TORCHSPARK_LOG_SECRET_FD`` names, or by hand in ``TORCHSPARK_LOG_SECRET``, which the agent
overwrites in place; never on a command line: docs/protocol.md 1.1), and a thread
pulls batches of lines and writes them where the user looks (``sys.stderr`` in a
notebook)::

    srv = LogServer(host=driver_ip)  # the agents' --log-endpoint: endpoint_text(host, port)
    ...
    while running:
        sys.stderr.write(srv.read_text())  # formatted natively, one batch
    srv.close()                            # drains connected agents
    sys.stderr.write(srv.read_text(timeout_ms=0))

Lines reach users with one prefix, formatted by the library (``tsp_lines_prefix`` in
native/src/shared/lines.c, the same code as the agent's local fallback): ``[rank N] text``, and
``[rank N] [stderr] text`` for stderr lines where both streams go to one place; the log
server's own messages read ``[torchspark] text``. The library is found and loaded by
:mod:`torchspark.native._lib`.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from torchspark.native._lib import LogLine as _LogLine
from torchspark.native._lib import checked, json_call, load_library

__all__ = ["Line", "LogServer", "load_library", "STDOUT", "STDERR", "EVENT", "REPORT",
           "CONTINUED", "NO_EOL"]

# Line.stream and Line.flags: common.h defines them (tests/unit_py/test_constants.py compares).
STDOUT, STDERR, EVENT = 1, 2, 3  # Line.stream (EVENT: the server's own messages, rank -1)
REPORT = 4  # Line.stream of pull_reports(): torchspark.report() records (protocol 1.8)
CONTINUED, NO_EOL = 1, 2  # Line.flags: a piece of a longer line / no final newline


class Line(NamedTuple):
    """One line a worker printed: its global rank, stream (STDOUT/STDERR), flags, bytes."""

    rank: int
    stream: int
    flags: int
    data: bytes


def endpoint_text(host: str, port: int) -> str:
    """``HOST:PORT`` as ``torchspark-run --log-endpoint`` reads it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def fd_check(nodes: int) -> None:
    """Raises the driver's descriptor limit to the hard one; OSError, naming the limit and
    the node count, when even that cannot hold a job of ``nodes`` nodes (the C core's
    tsp_logserver_fd_check; docs/architecture.md, "Limits and settings for large jobs")."""
    checked("tsp_logserver_fd_check", int(nodes), error=OSError, prefix="torchspark: ")


def _enc(text: Optional[str]) -> Optional[bytes]:
    return None if text is None else text.encode()


# Room for one batch of formatted text: a 1 MiB line plus its prefix always fits.
_TEXT_BUF = 4 << 20


class LogServer:
    """The driver's end of the log channel: one native epoll thread for all agents.

    ``host`` is the address the executors use to reach the driver (not 0.0.0.0 unless
    you ask for it); ``port=0`` lets the kernel pick one (see ``.port``). ``secret`` is 32
    bytes (a fresh random one when None). The last ``tail_lines`` lines of each rank are
    kept for error reports (:meth:`tail`).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: Optional[bytes] = None,
                 tail_lines: int = 100):
        self._lib = load_library()
        hexs = secret.hex().encode() if secret is not None else None  # C refuses a bad one
        self._h = checked("tsp_logserver_new", host.encode(), int(port), hexs,
                              int(tail_lines), error=OSError, ok=bool,
                              prefix="cannot start the torchspark log server: ")
        self._closed = False
        self._pull_lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._arrs: Dict[str, "ctypes.Array[_LogLine]"] = {}  # each pull's records, by queue
        self._text: Optional[ctypes.Array] = None
        info = self._call("info")
        self.host: str = info["host"]
        self.port: int = info["port"]
        self.secret: bytes = bytes.fromhex(info["secret"])
        self.output_path: Optional[str] = None

    def _call(self, op: str, error: Callable[[str], Exception] = ValueError, **keys: Any) -> Any:
        """The reply of one op of the server's JSON call (tsp_logserver_call,
        docs/protocol.md 1.14), keys its request's other members."""
        return json_call("tsp_logserver_call", {"op": op, **keys}, error, handle=self._h)

    @property
    def secret_hex(self) -> str:
        """The secret as 64 hex digits: the value of ``TORCHSPARK_LOG_SECRET``."""
        return self.secret.hex()

    def pull_reports(self, max_reports: int = 4096, timeout_ms: int = 200) -> List[Line]:
        """Up to ``max_reports`` of the workers' ``torchspark.report()`` records (stream
        REPORT, data: the JSON record as sent; docs/protocol.md 1.8), in order per rank,
        each once; [] on timeout. Their queue is separate from the lines' (one puller
        each) and bounded: a run whose reports are not pulled slows down."""
        with self._report_lock:
            return self._pull("tsp_logserver_pull_reports", max_reports, timeout_ms)

    def _pull(self, name: str, most: int, timeout_ms: int) -> List[Line]:
        """One pull of the C function name into its queue's records (kept between pulls)."""
        arr = self._arrs.get(name)
        if arr is None or len(arr) < most:
            arr = self._arrs[name] = (_LogLine * most)()
        n = getattr(self._lib, name)(self._h, arr, most, timeout_ms)
        recs = arr[:max(n, 0)]  # n <= 0: none (a timeout, or the end)
        size = sum(r.len for r in recs)  # the records' bytes lie back to back: one copy
        blob = ctypes.string_at(recs[0].data, size) if size else b""
        out, off = [], 0
        for r in recs:
            out.append(Line(r.rank, r.stream, r.flags, blob[off:off + r.len]))
            off += r.len
        return out

    def read_text(self, max_lines: int = 4096, timeout_ms: int = 200,
                  fmt: Optional[str] = None, stderr_marker: Optional[str] = None) -> str:
        """Up to ``max_lines`` lines formatted as :func:`format_line` does, each followed by
        a newline (none after a CONTINUED piece), as one string ("" on timeout).

        The batch is formatted natively and decoded once, so the cost per line stays in C.
        """
        return self._read_text(max_lines, timeout_ms, fmt, stderr_marker)[0]

    def _read_text(self, max_lines: int, timeout_ms: int, fmt: Optional[str],
                   stderr_marker: Optional[str]) -> Tuple[str, int]:
        with self._pull_lock:
            if self._text is None:
                self._text = ctypes.create_string_buffer(_TEXT_BUF)
            count = ctypes.c_int(0)
            n = self._lib.tsp_logserver_pull_text(
                self._h, ctypes.addressof(self._text), _TEXT_BUF, max_lines, timeout_ms,
                _enc(fmt), _enc(stderr_marker), ctypes.byref(count))
            if n <= 0:
                return "", 0
            return ctypes.string_at(self._text, n).decode("utf-8", "replace"), count.value

    def tail(self, rank: int, n: Optional[int] = None) -> List[bytes]:
        """The last ``n`` lines (default: all kept) of ``rank``, oldest first, as they came
        (bytes: the op ``tail`` of the JSON call gives text)."""
        n = 1 << 30 if n is None else int(n)
        need = self._lib.tsp_logserver_tail(self._h, rank, n, None, 0)
        buf = ctypes.create_string_buffer(max(need, 1))
        self._lib.tsp_logserver_tail(self._h, rank, n, buf, need)
        return buf.raw[:need].split(b"\n")[:-1] if need else []

    def report_budget(self, per_s: float) -> None:
        """Records a second, job-wide, that :meth:`pull_reports` hands on as they are
        (default 20,000; <= 0: all); beyond it each rank's reports come folded into one
        record per interval with a ``summary`` (docs/distributor.md, "Reports at scale").
        Before the first pull."""
        self._call("report_budget", per_s=float(per_s))

    def stats(self) -> Dict[str, int]:
        """Counters: accepted, authenticated, rejected, lines, bytes, duplicates, ..."""
        return dict(self._call("stats"))

    def expect_output(self, path: Optional[str] = None) -> None:
        """Accept rank 0's output, written to ``path`` (0600) or kept in memory (None)."""
        self._call("expect_output", RuntimeError, path=path or None)
        self.output_path = path

    def encryption(self, on: bool) -> None:
        """spark.torchspark.encryption: False keeps the authenticated handshake and MACs
        every frame, in clear (docs/protocol.md 1.10.1); for connections made from now on."""
        self._call("encryption", on=bool(on))

    def output_limit(self, max_result_size: Optional[str]) -> None:
        """The largest output kept in memory, written as ``spark.driver.maxResultSize``
        ("1g", "512m", bytes; None: Spark's 1g default; "0": no limit). A bigger one is
        refused before the driver takes any memory for it."""
        self._call("output_limit", max_result_size=max_result_size)

    @property
    def output_error(self) -> str:
        """Why the last output transfer failed ("" when none did)."""
        return str(self._call("output", timeout_ms=0)["error"])

    def output_view(self) -> Optional[memoryview]:
        """The received output without a copy: a memoryview over the server's own buffer
        (memory mode), or the file's bytes (file mode); None if it has not arrived. The
        view keeps this server, and so the buffer, alive for as long as it is referenced,
        also after close(); a 1 GiB result is not copied a second time to be unpickled."""
        if not self._call("output", timeout_ms=0)["received"]:
            return None
        if self.output_path is not None:
            return memoryview(Path(self.output_path).read_bytes())
        data, size = ctypes.c_void_p(), ctypes.c_uint64()
        self._lib.tsp_logserver_output_data(self._h, ctypes.byref(data), ctypes.byref(size))
        if not size.value or not data.value:
            return memoryview(b"")
        buf = (ctypes.c_char * size.value).from_address(data.value)
        buf.owner = self  # type: ignore[attr-defined]  # freed with the server: not before the view
        return memoryview(buf).cast("B")

    def failure(self, timeout: Optional[float] = 0) -> Optional[Dict]:
        """The run's root cause (docs/protocol.md 1.7), waiting up to ``timeout`` s for it
        (None: until there is one or the server stopped); None when there is none.

        A dict: ``kind`` ("failure": an agent reported its workers' failure; "lost": an
        agent vanished without saying goodbye), ``node_rank``, ``host``, ``peer``
        ("address:port"), ``message`` (one sentence) and ``report`` (the agent's error-file
        JSON as a dict, or None). When it happened, every other agent was told to stop.
        """
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        doc = self._call("failure", timeout_ms=ms)
        if doc is None:
            return None
        if not isinstance(doc.get("report"), dict):  # embedded as an object, or null
            doc["report"] = None
        return doc

    def lost_pending(self) -> int:
        """Agents gone without goodbye whose grace (1 s) is still running."""
        return int(self._call("lost")["pending"])

    def nodes_lost(self) -> List[int]:
        """The nodes lost (docs/protocol.md 1.7): node ranks whose agent saw its executor
        JVM die, or whose channel ended without goodbye before the run was stopped and did
        not come back, in order."""
        return list(self._call("lost")["nodes"])

    def stop_all(self, text: str = "the driver ended the run") -> bool:
        """Tells every connected agent (and any that connects later) to stop its workers
        now. False when the server has already shut down."""
        return bool(self._call("stop_all", text=text)["sent"])

    def watch(self, timeout: float, action: str, world: int, tmpdir: str) -> None:
        """The hang doctor's watchdog, an option of the server (docs/protocol.md 1.12):
        ``timeout`` s of silence from the workers' start, ``action`` report or cancel."""
        self._call("watch", timeout_ms=int(timeout * 1000), action=action, world=world,
                   tmpdir=tmpdir)

    def hang_event(self, timeout: float = 0) -> Optional[Dict]:
        """The watchdog's next event (docs/protocol.md 1.12), waiting up to ``timeout`` s;
        None when none came."""
        return self._call("hang_event", timeout_ms=int(timeout * 1000))

    def hang_summary(self) -> Dict[str, Any]:
        """The watchdog's events so far, summed up by C: ``lines`` (each diagnosis's line) and
        ``cancel`` (the event that cancelled the run, or None; docs/protocol.md 1.14)."""
        return dict(self._call("hang_summary"))

    def checkpoint_all(self, why: int = 1) -> bool:
        """Asks every connected agent to have its workers checkpoint now and then stop
        (CHECKPOINT, docs/protocol.md 1.13; why 1: the run grows back). False when the
        server has already shut down."""
        return bool(self._call("checkpoint_all", why=why)["sent"])

    def close(self, drain_timeout: float = 5.0) -> None:
        """Stops accepting, drains connected agents (up to ``drain_timeout`` s), closes.

        Lines stay pullable afterwards. Keep pulling from another thread while this runs,
        or lines beyond the queue bound wait until the timeout.
        """
        if not self._closed:
            self._closed = True
            self._call("shutdown", drain_ms=int(drain_timeout * 1000))

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            self._lib.tsp_logserver_free(h)
