"""The agent against other processes of the same user on its host (docs/security.md, "The
executor host"): each attack made by a real process through a real socket or /proc entry.

- The secret given by hand in TORCHSPARK_LOG_SECRET is overwritten in the agent's initial
  environment block (what /proc/<pid>/environ shows); TORCHSPARK_LOG_SECRET_FD (the glues)
  reads it from a descriptor and says what is wrong with a bad one.
- A process that connects to the agent's report socket and stays idle does not keep the
  agent alive once its workers ended (a grace, then one warning line)."""
import os
import socket
import subprocess
import time

from tests.helpers.agentutil import TSR, base_env, free_port, new_marker
from tests.helpers.logserver import LogServer

WAIT_FOR_GO = ('import os, sys, time\n'
               'print("worker-line", flush=True)\n'
               'open(sys.argv[1] + ".sock", "w").write(os.environ["TORCHSPARK_REPORT_SOCKET"])\n'
               'while not os.path.exists(sys.argv[1] + ".go"): time.sleep(0.02)\n')


def _agent(srv, flag, env, stdin=subprocess.DEVNULL):
    cmd = [TSR, "--standalone", "--nproc-per-node", "1", "--master-port", str(free_port()),
           "--log-endpoint", srv.endpoint, "--no-python", "python3", "-c", WAIT_FOR_GO, flag]
    return subprocess.Popen(cmd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _wait_file(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) or not open(path).read():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.02)
    return open(path).read()


def _proc_bytes(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        data = f.read()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return data + f.read()


def test_a_secret_in_the_environment_is_overwritten_in_proc(tmp_path):
    with LogServer() as srv:
        flag = str(tmp_path / "w")
        p = _agent(srv, flag, base_env(new_marker(), **srv.agent_env()))
        try:
            _wait_file(flag + ".sock")
            seen = _proc_bytes(p.pid)
            assert srv.secret_hex.encode() not in seen
            assert b"TORCHSPARK_LOG_SECRET=" + b"\0" * 64 in seen  # scrubbed in place
        finally:
            open(flag + ".go", "w").close()
            assert p.wait(30) == 0, p.stderr.read()


def test_a_secret_on_stdin_works_and_never_reaches_the_environment(tmp_path):
    with LogServer() as srv:
        flag = str(tmp_path / "w")
        p = _agent(srv, flag, base_env(new_marker(), TORCHSPARK_LOG_SECRET_FD="0"),
                   stdin=subprocess.PIPE)
        p.stdin.write(srv.secret_hex.encode() + b"\n")
        p.stdin.close()
        try:
            _wait_file(flag + ".sock")
            assert srv.secret_hex.encode() not in _proc_bytes(p.pid)
        finally:
            open(flag + ".go", "w").close()
            assert p.wait(30) == 0, p.stderr.read()
        # The channel authenticated with it: the worker's line reached the driver.
        lines = []
        deadline = time.monotonic() + 10
        while b"worker-line" not in lines and time.monotonic() < deadline:
            lines += [ln.data for ln in srv.pull(timeout_ms=200)]
        assert b"worker-line" in lines


def test_a_bad_secret_descriptor_is_a_clear_error(tmp_path):
    with LogServer() as srv:
        p = _agent(srv, str(tmp_path / "w"), base_env(new_marker(), TORCHSPARK_LOG_SECRET_FD="x"))
        assert p.wait(30) == 2
        assert b"TORCHSPARK_LOG_SECRET_FD must be a descriptor number, not 'x'" in p.stderr.read()
        p = _agent(srv, str(tmp_path / "w"), base_env(new_marker(), TORCHSPARK_LOG_SECRET_FD="57"))
        assert p.wait(30) == 2
        assert b"TORCHSPARK_LOG_SECRET_FD 57 cannot be read" in p.stderr.read()


def test_an_idle_report_connection_does_not_keep_the_agent_alive(tmp_path):
    with LogServer() as srv:
        flag = str(tmp_path / "w")
        p = _agent(srv, flag, base_env(new_marker(), **srv.agent_env()))
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            idle.connect(_wait_file(flag + ".sock"))  # from outside the job, then silence
            time.sleep(0.2)  # accepted while the worker runs
            open(flag + ".go", "w").close()
            t0 = time.monotonic()
            rc = p.wait(15)
            took = time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()
            idle.close()
        err = p.stderr.read().decode()
        assert rc == 0, err
        # The 2 s grace, and this host's load (an idle connection that kept the agent alive
        # would have failed p.wait(15) above).
        assert took < 2.0 + 6.0, took
        assert err.count("still open 2000 ms after this agent's last worker ended") == 1, err
