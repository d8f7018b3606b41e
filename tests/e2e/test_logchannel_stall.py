"""A driver that stays connected but stops reading must not keep an agent alive.

The reported hang: 8 `yes` workers fill the log channel while the driver pulls slowly,
then the driver stops pulling (its process is busy elsewhere, the server still open) and
the agent is sent SIGTERM. Lossless backpressure alone would keep the agent waiting for
room forever with its workers dead; the client gives such a driver up after
TORCHSPARK_LOG_STALL_TIMEOUT seconds (default 60), spills to the agent's own output, and
the agent ends."""
import os
import signal
import subprocess
import time

from logchannel_harness import RUN_BIN
from torchspark._native import LogServer


def test_agent_ends_when_the_driver_stops_reading():
    srv = LogServer()
    env = dict(os.environ, **srv.agent_env(), TORCHSPARK_LOG_STALL_TIMEOUT="1")
    p = subprocess.Popen([str(RUN_BIN), "--nproc-per-node", "8", "--no-python",
                          "--shutdown-timeout", "3", "--log-endpoint", srv.endpoint,
                          "/usr/bin/yes", "a fairly long line of log text " * 8],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        t0 = time.time()
        while time.time() - t0 < 2:  # a slow consumer first
            srv.pull(256, 50)
            time.sleep(0.01)
        for _ in range(3):  # then no consumer at all, and the agent is told to stop
            p.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        srv.close(0.2)
    err = p.stderr.read().decode(errors="replace")
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert "has taken no lines for 1 s" in err
