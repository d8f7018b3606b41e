"""Starting one torchspark-run agent, draining its output, and reading its verdict.

Shared by local mode (the agent runs on the driver) and distributed mode (one agent per
barrier task). The agent puts its workers in their own sessions, is their subreaper and
has a parent-death signal, so killing the process that called :func:`run_agent` (a
Spark Python worker SIGKILLed by Spark) takes the whole tree down; here we only add the
orderly path: TERM, the agent's own grace period, then KILL.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import IO, Callable, Deque, Dict, List, Optional


TAIL_LINES = 100
SHUTDOWN_TIMEOUT_S = 5


def find_libnccl() -> Optional[str]:
    """libnccl.so.2 of the nvidia-nccl-cu* wheel that torch uses, found without importing
    torch (or anything from the wheel)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(d, "lib", "libnccl.so.2")
        if os.path.isfile(path):
            return path
    return None


@dataclass
class AgentResult:
    returncode: int
    tail: List[str] = field(default_factory=list)


def _stop(p: "subprocess.Popen[bytes]") -> None:
    """TERM, the agent's grace period plus a second, then KILL (no-op once exited)."""
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=SHUTDOWN_TIMEOUT_S + 1)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except OSError:
        pass


def run_agent(cmd: List[str], env: Dict[str, str],
              echo: Optional[Callable[[str], None]] = None,
              on_stderr: Optional[Callable[[str], None]] = None,
              secret: Optional[str] = None) -> AgentResult:
    """Starts one agent, waits for it (stopping it if the wait is interrupted, e.g. by
    KeyboardInterrupt) and returns its exit status and output tail. echo(line) receives
    every line it prints (stdout and stderr), on_stderr(line) those of its stderr only
    (after echo). secret: the driver channel's secret (64 hex digits), handed over on the
    agent's standard input, never in its environment (docs/protocol.md 1.1)."""
    # Lets the agent notice a parent that died before it could ask for a
    # parent-death signal.
    env = dict(env, TORCHSPARK_PARENT_PID=str(os.getpid()))
    # The secret on a pipe: /proc/<pid>/environ would show it to every process of this
    # user for the agent's whole life (the agent reads it first thing, then stdin is
    # /dev/null again).
    env.pop("TORCHSPARK_LOG_SECRET", None)
    if secret:
        env["TORCHSPARK_LOG_SECRET_FD"] = "0"
    tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
    tail_lock = threading.Lock()

    def drain(stream: IO[bytes], hook: Optional[Callable[[str], None]]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with tail_lock:
                tail.append(line)
            for fn in (echo, hook):
                if fn is not None:
                    try:
                        fn(line)
                    except Exception:
                        pass
        stream.close()

    # Not a new session: a SIGHUP/SIGINT sent to the caller's process group (Spark's
    # daemon shutting down, Ctrl-C on the driver) must reach the agent too.
    proc = subprocess.Popen(cmd, env=env,
                            stdin=subprocess.PIPE if secret else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
    if secret:
        assert proc.stdin is not None
        try:  # 65 bytes: within any pipe's buffer, so this never waits on the agent
            proc.stdin.write(secret.encode() + b"\n")
            proc.stdin.close()
        except OSError:
            pass  # the agent died at once: its status says why
    readers = [threading.Thread(target=drain, args=(stream, hook), daemon=True,
                                name="torchspark-agent-output")
               for stream, hook in ((proc.stdout, None), (proc.stderr, on_stderr))]
    for t in readers:
        t.start()
    try:
        proc.wait()
    finally:
        _stop(proc)
    for t in readers:
        t.join(timeout=5)
    with tail_lock:
        return AgentResult(proc.returncode, list(tail))
