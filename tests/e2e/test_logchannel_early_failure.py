"""A worker that fails at once, before its agent's log client has finished the handshake
with the driver, must still reach the driver as the run's root cause (docs/protocol.md
1.7: the FAILURE event), with its rank and exit code or signal.

The race is made deterministic: the agents reach the driver's log server through a
listening socket that accepts each connection only `LATE_ACCEPT` seconds after it is
pending (the agent's TCP connect has completed in the kernel's backlog, its HELLO waits
for an answer), so every worker below has failed, and its agent has reported the failure
and begun to close its client, before any handshake is done. Before the fix in
logclient.c the event was refused (-ENOTCONN) and silently lost every time; it is now
kept until the handshake and sent after it, and the agent's close waits for it.

Each scenario runs EARLY_FAILURE_REPS times (default 5; 50 for the count in the
report: EARLY_FAILURE_REPS=50) and requires every run to reach the driver."""
from __future__ import annotations

import os
import select
import socket
import subprocess
import threading
import time

import pytest

from tests.helpers.agentutil import base_env, free_port, new_marker, survivors
from tests.helpers.logchannel_harness import RUN_BIN
from tests.helpers.logserver import LogServer

REPS = int(os.environ.get("EARLY_FAILURE_REPS", "5"))
LATE_ACCEPT = 0.4  # seconds each connection waits in the backlog

# Rank 1 fails at once; rank 0 would sleep (and is stopped by its agent). The agent
# substitutes worker arguments as torchrun does ("$$" becomes "$"): "$$$$" is the shell's $$.
SCENARIOS = {
    "exit3": ("exit 3", 3, 0),
    "sigkill": ("kill -KILL $$$$", 137, 9),
    "line_then_exit": ("echo 'last words'; exit 3", 3, 0),
}


class LateAcceptProxy:
    """A listening socket in front of the real server that accepts each connection only
    `delay` seconds after it became pending, then relays bytes both ways."""

    def __init__(self, upstream_port: int, delay: float):
        self.upstream_port = upstream_port
        self.delay = delay
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    def _accept_loop(self) -> None:
        while not self.closed.is_set():
            r, _, _ = select.select([self.lsock], [], [], 0.05)
            if not r:
                continue
            time.sleep(self.delay)  # pending in the backlog, HELLO unanswered
            try:
                down, _ = self.lsock.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.socks += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.closed.set()
        self.thread.join(5)  # before the socket closes under its select()
        self.lsock.close()
        for s in self.socks:
            s.close()


def _one_run(script: str, marker: str) -> tuple[int, dict | None, list[bytes], str]:
    """One agent (2 workers, rank 1 runs `script` at once) through a late-accepting
    listener; returns the agent's status, the driver's root cause, rank 1's tail, stderr."""
    srv = LogServer()
    proxy = LateAcceptProxy(srv.port, LATE_ACCEPT)
    try:
        env = base_env(marker, **srv.agent_env())
        cmd = [str(RUN_BIN), "--nproc-per-node", "2", "--master-port", str(free_port()),
               "--shutdown-timeout", "2", "--log-endpoint", f"127.0.0.1:{proxy.port}",
               "--no-python", "/bin/sh", "-c",
               f'if [ "$RANK" = 1 ]; then {script}; fi; exec sleep 30']
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
        root = srv.failure(2.0)
        tail = srv.tail(1, 5)
        return p.returncode, root, tail, p.stderr.decode(errors="replace")
    finally:
        proxy.close()
        srv.close(0.5)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_immediate_failure_reaches_a_late_accepting_driver(name):
    if not RUN_BIN.exists():
        pytest.fail(f"{RUN_BIN} is missing: build first (bash tests/setup.sh)")
    script, code, sig = SCENARIOS[name]
    marker = new_marker()
    lost = []
    try:
        for i in range(REPS):
            rc, root, tail, err = _one_run(script, marker)
            assert rc == code, err
            ts = ((root or {}).get("report") or {}).get("torchspark", {})
            if not (root and root["kind"] == "failure" and ts.get("rank") == 1
                    and ts.get("exitcode") == code and ts.get("signal") == sig):
                lost.append((i, root, err[-1500:]))
                continue
            if name == "line_then_exit":
                assert tail == [b"last words"], tail
    finally:
        assert survivors(marker) == []
    print(f"{name}: {len(lost)} of {REPS} failures lost")
    assert not lost, f"{len(lost)} of {REPS} immediate failures never reached the driver: " \
        f"first: {lost[0]}"


def test_immediate_failure_without_a_driver_ends_in_bounded_time():
    """No driver at all (nothing listens on the endpoint): the agent holds its failure
    event for at most the client's event flush time (5 s), says once that it could not be
    sent, and ends with its root cause's code: no hang when the driver is gone."""
    if not RUN_BIN.exists():
        pytest.fail(f"{RUN_BIN} is missing: build first (bash tests/setup.sh)")
    marker = new_marker()
    env = base_env(marker, TORCHSPARK_LOG_SECRET="ab" * 32)
    cmd = [str(RUN_BIN), "--nproc-per-node", "2", "--master-port", str(free_port()),
           "--shutdown-timeout", "2", "--log-endpoint", f"127.0.0.1:{free_port()}",
           "--no-python", "/bin/sh", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30']
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    finally:
        assert survivors(marker) == []
    took = time.monotonic() - t0
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 3, err
    assert "1 failure report(s) could not be sent to the driver's log server" in err, err
    assert took < 20, f"the agent took {took:.1f} s to end without a driver"
