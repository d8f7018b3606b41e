"""Hands rank 0's election record to the other barrier tasks through the driver, instead of
BarrierTaskContext.allGather().

Why: Spark's barrier calls wait in whole seconds (BarrierTaskContext.runBarrier polls its
RPC future with Thread.sleep(1000)), so one allGather() costs at least a second of every
distributed run() (measured: 1.07 s in each run, docs/benchmarks.md). Here rank 0 PUTs the
record to a small server on the driver as soon as it has it, and every other task GETs it
the moment it is there.

On by default for classic sessions, whose executors reach the driver's host anyway;
``TORCHSPARK_RENDEZVOUS=0`` turns it off, ``=1`` turns it on for Spark Connect too (see
:func:`enabled`). The driver decides for the whole job: the spec carries an endpoint (every
task uses it) or none (every task calls allGather). A task that cannot reach the endpoint
fails before any training starts with an error marked UNREACHABLE; the driver then runs the
job again with allGather, says so once, and keeps to allGather in that process. Requests
are authenticated by a random token in the spec, as the log channel is by its secret; one
record per run, at most RECORD_MAX bytes.

Wire (one request per connection, lines of UTF-8): ``TOKEN_HEX PUT RECORD\\n`` -> ``OK\\n``;
``TOKEN_HEX GET\\n`` -> ``RECORD\\n`` once rank 0 put it (``ERR reason\\n`` on a bad token).
"""
from __future__ import annotations

import hmac
import os
import socket
import threading
from typing import Any, Optional

from torchspark._spec import RendezvousSpec

ENV = "TORCHSPARK_RENDEZVOUS"
RECORD_MAX = 4096
GET_TIMEOUT_S = 600.0  # as long as a barrier stage may reasonably wait for rank 0
CONNECT_TIMEOUT_S = 10.0


# Marks a task's error when it could not reach the driver's rendezvous (see the module doc).
UNREACHABLE = "TORCHSPARK_RENDEZVOUS_UNREACHABLE"


def enabled(remote: bool) -> bool:
    """TORCHSPARK_RENDEZVOUS=0 / =1 on the driver, else on for classic sessions only: a
    Spark Connect client is often not reachable from the executors (a laptop), and each
    such session would pay a failed first attempt.

    (It was opt-in while an e2e test lost Spark's cause of a failed run with it on; the
    cause was found not to be the rendezvous: Spark's first task failure in a fresh
    session takes it seconds once, with either path: docs/benchmarks.md.)"""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    return not remote


class Server:
    """The driver's end: one listening socket and a thread per request (a handful)."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self.token = os.urandom(32).hex()
        self._record: Optional[str] = None
        self._cv = threading.Condition()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="torchspark-rendezvous").start()

    def spec(self, advertised_host: str) -> RendezvousSpec:
        host = advertised_host or self.host
        return {"host": host, "port": self.port, "token": self.token}

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="torchspark-rendezvous-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(CONNECT_TIMEOUT_S)
            try:
                try:
                    req = _read_line(conn)
                except ValueError as e:  # over the line limit, or not UTF-8
                    conn.sendall(f"ERR {e}\n".encode())
                    return
                token, _, rest = req.partition(" ")
                if not hmac.compare_digest(token.encode(), self.token.encode()):
                    conn.sendall(b"ERR authentication failed\n")
                    return
                verb, _, record = rest.partition(" ")
                if verb == "PUT" and record:
                    with self._cv:
                        self._record = record
                        self._cv.notify_all()
                    conn.sendall(b"OK\n")
                elif rest == "GET":
                    conn.settimeout(None)
                    with self._cv:
                        self._cv.wait_for(lambda: self._record is not None or self._closed,
                                          timeout=GET_TIMEOUT_S)
                        got = self._record
                    conn.sendall(b"ERR the run ended\n" if got is None
                                 else got.encode() + b"\n")
                else:
                    conn.sendall(b"ERR unknown request\n")
            except (OSError, ValueError):
                return

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        try:
            self._sock.close()
        except OSError:
            pass


def _read_line(conn: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(RECORD_MAX + 256)
        if not chunk:
            break
        buf += chunk
        if len(buf) > RECORD_MAX + 256:
            raise ValueError("request too long")
    return buf.decode("utf-8").rstrip("\n")


def _request(spec: RendezvousSpec, line: str) -> str:
    host, port = spec["host"], int(spec["port"])
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as conn:
            conn.settimeout(None if line.endswith(" GET") else CONNECT_TIMEOUT_S)
            conn.sendall(line.encode() + b"\n")
            reply = _read_line(conn)
    except OSError as e:
        raise RuntimeError(
            f"{UNREACHABLE}: this barrier task on host {socket.gethostname()} cannot reach "
            f"the driver's rendezvous at {host}:{port} ({e}); the driver runs the job again "
            "through BarrierTaskContext.allGather") from None
    if reply.startswith("ERR "):
        raise RuntimeError(f"torchspark: the driver refused the rendezvous: {reply[4:]}")
    return reply


def exchange(spec: Optional[RendezvousSpec], ctx: Any, node_rank: int, packed: str) -> str:
    """Rank 0's packed record, on every task: through the driver when the spec has an
    endpoint, else through allGather()."""
    if not spec:
        return ctx.allGather(packed)[0]
    if len(packed) > RECORD_MAX or "\n" in packed:
        raise RuntimeError("torchspark: the election record is too long or not one line")
    if node_rank == 0:
        _request(spec, f"{spec['token']} PUT {packed}")
        return packed
    return _request(spec, f"{spec['token']} GET")
