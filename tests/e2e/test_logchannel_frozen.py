"""An agent told to stop never waits for a driver that cannot answer (issue 20).

The driver's log server runs in a process of its own here, as in a real driver, and is
frozen with SIGSTOP while two workers print; then the agent gets SIGTERM, as the
TorchSparkPlugin sends it when Spark kills the task (job cancelled, barrier stage
aborted). Before the fix such an agent waited for the frozen driver to acknowledge its
last lines until the plugin's SIGKILL (1.02-1.04 s measured with the plugin). Now it ends
within 0.2 s; what the driver did not acknowledge is on the agent's own output (the
executor's log) after one warning, and nothing is lost: once the driver thaws, what it got
plus what the agent wrote locally is every line each worker printed.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

from tests.helpers.logchannel_harness import ROOT, RUN_BIN

# The bound: from the stop signal to the agent's exit. The agent waits 100 ms for
# the frozen driver by design, so a loaded 2-core machine that does not schedule it for
# another 100 ms misses the bound without a fault of the agent's: a round is tried up to
# ROUNDS times and the first within the bound counts. The waits the bound guards against
# (the driver's acknowledgement until the plugin's SIGKILL, the 1 s CLOSE wait) miss it in
# every round.
STOP_BOUND_S = 0.2
ROUNDS = 3

# The driver: a log server that pulls lines until its stdin closes, then prints them.
_DRIVER = r"""
import json, sys, threading
from tests.helpers.logserver import LogServer
srv = LogServer()
print(json.dumps({"endpoint": srv.endpoint, "env": srv.agent_env()}), flush=True)
got = []
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    got += [[ln.rank, ln.data.decode()] for ln in srv.pull(4096, 50) if ln.rank >= 0]
got += [[ln.rank, ln.data.decode()] for ln in srv.pull(4096, 200) if ln.rank >= 0]
print(json.dumps(got), flush=True)
srv.close(0.2)
"""

# A worker: a numbered line every 5 ms; on SIGTERM one last line, then exit. QUIET=1:
# 20 lines, then silence (every line acknowledged before the freeze), and a silent exit.
_WORKER = r"""
import os, signal, sys, time
rank = os.environ["RANK"]
quiet = os.environ.get("QUIET") == "1"
def term(*_):
    if not quiet:
        print(f"LAST {rank}", flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, term)
i = 0
while True:
    if not quiet or i < 20:
        print(f"line {rank} {i}", flush=True)
    i += 1
    time.sleep(0.005)
"""


def _round(freeze: bool, quiet: bool = False):
    """Runs driver + agent (2 workers), optionally freezes the driver, stops the agent with
    SIGTERM; returns (seconds from the signal to the agent's exit, its exit status, its
    stdout, its stderr, the lines the driver got)."""
    drv = subprocess.Popen([sys.executable, "-c", _DRIVER], cwd=ROOT,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        hello = json.loads(drv.stdout.readline())
        env = dict(os.environ, **hello["env"], QUIET="1" if quiet else "0")
        agent = subprocess.Popen(
            [str(RUN_BIN), "--log-endpoint", hello["endpoint"], "--nproc-per-node", "2",
             "--shutdown-timeout", "3", "--no-python", sys.executable, "-c", _WORKER],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.5)  # the workers print, the driver acknowledges
        if freeze:
            drv.send_signal(signal.SIGSTOP)
            time.sleep(0.3)  # lines the driver never acknowledges
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        rc = agent.wait(timeout=30)
        took = time.monotonic() - t0
        out, err = agent.communicate(timeout=10)
        if freeze:
            drv.send_signal(signal.SIGCONT)
        drv.stdin.close()
        got = json.loads(drv.stdout.readline())
        drv.wait(timeout=30)
        return took, rc, out.decode(errors="replace"), err.decode(errors="replace"), got
    finally:
        for p in (agent, drv):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


def _round_within_bound(freeze: bool, quiet: bool = False):
    """_round until the agent ended within STOP_BOUND_S (at most ROUNDS times): that round's
    result, and every round's seconds."""
    tooks = []
    for _ in range(ROUNDS):
        took, rc, out, err, got = _round(freeze, quiet)
        tooks.append(took)
        if took < STOP_BOUND_S:
            break
    return (took, rc, out, err, got), tooks


def _every_line_once_or_twice(got, out, last=True):
    """Per rank, the lines the driver got plus those on the agent's stdout are 0..n and
    the last line, none missing (a line may be in both: sent, not acknowledged)."""
    want_last = last
    seen = {0: set(), 1: set()}
    last = {0: False, 1: False}
    texts = [t for _, t in got] + [re.sub(r"^\[rank \d+\] ", "", ln) for ln in out.splitlines()]
    for t in texts:
        m = re.fullmatch(r"line (\d) (\d+)", t)
        if m:
            seen[int(m.group(1))].add(int(m.group(2)))
        m = re.fullmatch(r"LAST (\d)", t)
        if m:
            last[int(m.group(1))] = True
    # On failure, all of it: a line that lost its newline shows where it joined another.
    whole = f"rank {{r}}: agent stdout:\n{out}\ndriver got: {got}"
    for r in (0, 1):
        assert seen[r] and seen[r] == set(range(max(seen[r]) + 1)), whole.format(r=r)
        assert last[r] or not want_last, whole.format(r=r)


def test_stopped_agent_does_not_wait_for_a_frozen_driver():
    (took, rc, out, err, got), tooks = _round_within_bound(freeze=True)
    print(f"frozen driver: the agent ended {took * 1000:.0f} ms after SIGTERM; "
          f"{len(out.splitlines())} line(s) on its own stdout, {len(got)} at the driver")
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert took < STOP_BOUND_S, (tooks, err[-2000:])
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) == 1, err[-3000:]
    assert "did not acknowledge the last lines" in warnings[0], warnings
    assert "[rank 0] LAST 0\n" in out and "[rank 1] LAST 1\n" in out, out
    _every_line_once_or_twice(got, out)


def test_stopped_agent_with_a_live_driver_delivers_everything():
    (took, rc, out, err, got), tooks = _round_within_bound(freeze=False)
    print(f"live driver: the agent ended {took * 1000:.0f} ms after SIGTERM; "
          f"{len(got)} lines at the driver")
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert took < STOP_BOUND_S, (tooks, err[-2000:])
    assert "warning" not in err, err[-2000:]
    assert out == "", out[-2000:]  # every line went to the driver
    _every_line_once_or_twice(got, out)


def test_stopped_agent_does_not_wait_for_a_frozen_drivers_goodbye():
    """Every line was acknowledged before the freeze: the agent says CLOSE and used to wait
    1 s for the driver's answer (the 1.02-1.04 s measured with the plugin); now only
    within the stop's bound, and nothing is written locally."""
    (took, rc, out, err, got), tooks = _round_within_bound(freeze=True, quiet=True)
    print(f"frozen driver, all lines acknowledged: the agent ended {took * 1000:.0f} ms "
          "after SIGTERM")
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert took < STOP_BOUND_S, (tooks, err[-2000:])
    assert "warning" not in err and out == "", (out[-1000:], err[-2000:])
    _every_line_once_or_twice(got, out, last=False)


# A worker that reports each SIGTERM it gets, then exits after a moment.
_COUNTER = r"""
import os, signal, time
def term(*_):
    os.write(1, b"TERM\n")
signal.signal(signal.SIGTERM, term)
os.write(1, b"READY\n")
end = time.time() + 30
while time.time() < end and not os.path.exists(os.environ["DONE"]):
    time.sleep(0.01)
"""


def test_a_stopped_worker_gets_sigterm_once(tmp_path):
    """The agent's stop signals each worker group, then the rest of its process tree; the
    workers were in both until issue 30, so each ran its SIGTERM handler twice, and a
    handler that printed joined its two prints into one line ("LAST 1LAST 1")."""
    done = tmp_path / "done"
    agent = subprocess.Popen(
        [str(RUN_BIN), "--nproc-per-node", "2", "--shutdown-timeout", "3", "--no-python",
         sys.executable, "-c", _COUNTER],
        env=dict(os.environ, DONE=str(done)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 20
        seen = b""
        while seen.count(b"READY") < 2 and time.time() < deadline:
            seen += agent.stdout.read1(4096)
        time.sleep(0.2)
        agent.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # both handlers ran (twice each before the fix)
        done.write_text("")
        out, err = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    out = (seen + out).decode(errors="replace")
    assert out.count("TERM") == 2, out + err.decode(errors="replace")  # one per worker
