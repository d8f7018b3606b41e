"""A driver that stays connected but stops reading must not keep an agent alive.

The reported hang: 8 `yes` workers fill the log channel while the driver pulls slowly,
then the driver stops pulling (its process is busy elsewhere, the server still open) and
the agent is sent SIGTERM. Lossless backpressure alone would keep the agent waiting for
room forever with its workers dead; the client gives such a driver up after
TORCHSPARK_LOG_STALL_TIMEOUT seconds (default 60), spills to the agent's own output, and
the agent ends."""
import contextlib
import os
import signal
import subprocess
import sys
import time

from tests.helpers.logchannel_harness import RUN_BIN
from tests.helpers.logserver import LogServer


@contextlib.contextmanager
def _agent(srv: LogServer, args: list, stdout):
    """torchspark-run with a 1 s stall timeout against srv; killed if still alive after."""
    env = dict(os.environ, **srv.agent_env(), TORCHSPARK_LOG_STALL_TIMEOUT="1")
    p = subprocess.Popen([str(RUN_BIN), "--log-endpoint", srv.endpoint, *args], env=env,
                         stdout=stdout, stderr=subprocess.PIPE)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        srv.close(0.2)


def test_agent_ends_when_the_driver_stops_reading():
    srv = LogServer()
    with _agent(srv, ["--nproc-per-node", "8", "--no-python", "--shutdown-timeout", "3",
                      "/usr/bin/yes", "a fairly long line of log text " * 8],
                subprocess.DEVNULL) as p:
        t0 = time.time()
        while time.time() - t0 < 2:  # a slow consumer first
            srv.pull(256, 50)
            time.sleep(0.01)
        for _ in range(3):  # then no consumer at all, and the agent is told to stop
            p.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        rc = p.wait(timeout=30)
        took = time.time() - t0
    err = p.stderr.read().decode(errors="replace")
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert "has taken no lines for 1 s" in err, err[-2000:]
    # the stall rule holds for the stopping agent's last lines too, also when its workers
    # are gone before it fired: not the 30 s flush deadline
    assert took < 15, took


def test_agent_with_undeliverable_last_lines_ends_after_the_stall_timeout():
    """Workers that print 14 MB and exit at once, to a driver that never pulls: the server's
    queue and the sockets take part, the rest waits in the agent when it stops. That agent
    gives the driver up after the stall timeout (the lines go to its own stdout), not after
    its 30 s flush deadline."""
    srv = LogServer()
    code = "import sys\nline = 'x' * 99 + '\\n'\nsys.stdout.write(line * 140000)\n"
    with _agent(srv, ["--nproc-per-node", "1", "--no-python", sys.executable, "-c", code],
                subprocess.PIPE) as p:
        t0 = time.time()
        out, err = p.communicate(timeout=60)
        took = time.time() - t0
    err = err.decode(errors="replace")
    assert p.returncode == 0, err[-2000:]
    assert "has taken no lines for 1 s" in err, err[-2000:]
    assert took < 15, took
    # nothing lost: what the driver did not take is on the agent's own stdout
    assert out.count(b"x" * 99) + srv.stats()["lines"] >= 140000
