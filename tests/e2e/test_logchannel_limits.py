"""The driver's log server before authentication (issue 30): a flood of idle connections
neither burns the driver's CPU nor keeps a real agent out, and nothing a stranger sends
reaches the driver's log; what an authenticated agent sends is printed made printable.

The driver runs in a process of its own with RLIMIT_NOFILE at 256, as a driver with a low
descriptor limit would; its CPU time is read from /proc. The attacks are real sockets; the
agent is a real torchspark-run with a real worker.
"""
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers import logproto
from tests.helpers.logchannel_harness import ROOT, RUN_BIN
from tests.helpers.logproto import AUTH, CHALLENGE, ERROR, WELCOME, frame, hello, mac, read_frame

# The driver: limits its descriptors (and, for "emfile", spends all but a few of them),
# starts a log server, prints how to reach it, then prints every line it pulls.
_DRIVER = r"""
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from tests.helpers.logserver import LogServer
srv = LogServer(secret=bytes(range(32)))
if sys.argv[1] == "emfile":
    spent = []
    try:
        while True:
            spent.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    for fd in spent[:8]:
        os.close(fd)
print(json.dumps({"endpoint": srv.endpoint, "port": srv.port, "env": srv.agent_env()}),
      flush=True)
while True:
    for ln in srv.pull(4096, 100):
        if ln.rank >= 0:
            print(json.dumps([ln.rank, ln.data.decode(errors="replace")]), flush=True)
"""

_WORKER = "for i in range(5):\n    print('REAL LINE %d' % i, flush=True)\n"

FLOOD = 400
# The bound is 0.5 s; on a loaded machine the old spin got as little as 0.36 s of
# CPU in 3 s (it competes for the cores), so the bound here is tighter. Measured with the
# limits: 0.00-0.01 s.
CPU_BOUND_S = 0.2


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_driver(mode: str):
    # Its stderr goes to a file: a pipe nobody reads would block a chatty driver, not
    # let it spin.
    err = tempfile.TemporaryFile()
    drv = subprocess.Popen([sys.executable, "-c", _DRIVER, mode], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=err, bufsize=0)
    drv.err_file = err
    info = json.loads(drv.stdout.readline())
    return drv, info


def _stop_driver(drv) -> str:
    drv.kill()
    drv.wait(timeout=10)
    drv.err_file.seek(0)
    return drv.err_file.read().decode(errors="replace")


@pytest.mark.parametrize("mode", ["cap", "emfile"])
def test_idle_flood_costs_little_cpu_and_a_real_agent_gets_through(mode, tmp_path):
    drv, info = _start_driver(mode)
    socks = []
    try:
        for _ in range(FLOOD):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", info["port"]))
            socks.append(s)
        time.sleep(0.3)  # the connections reach the listener
        cpu0 = _cpu_s(drv.pid)
        time.sleep(3)
        cpu = _cpu_s(drv.pid) - cpu0
        print(f"driver CPU under the flood ({mode}): {cpu:.2f} s in 3 s")
        assert cpu < CPU_BOUND_S, f"the driver spent {cpu:.2f} s of CPU in 3 s under the flood"

        worker = tmp_path / "w.py"
        worker.write_text(_WORKER)
        agent = subprocess.run(
            [str(RUN_BIN), "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "1",
             "--master-addr", "127.0.0.1", "--master-port", "29531", "--python",
             sys.executable, "--log-endpoint", info["endpoint"], str(worker)],
            env=dict(os.environ, **info["env"]), capture_output=True, text=True, timeout=60)
        assert agent.returncode == 0, agent.stderr
        got, deadline, buf = [], time.time() + 20, b""
        while len(got) < 5 and time.time() < deadline:
            if select.select([drv.stdout], [], [], 0.2)[0]:
                buf += os.read(drv.stdout.fileno(), 65536)
                *whole, buf = buf.split(b"\n")
                got += [json.loads(w) for w in whole]
        assert got == [[0, "REAL LINE %d" % i] for i in range(5)], (got, agent.stderr)
    finally:
        for s in socks:
            s.close()
        err = _stop_driver(drv)
    # One warning per second at most about peers that never authenticated.
    events = [ln for ln in err.splitlines() if "torchspark log server" in ln]
    assert len(events) <= 8, "\n".join(events[:20])


def _handshake(port: int, secret: bytes, host: bytes = b"pytest"):
    sock = logproto.connect("127.0.0.1", port, secret)  # TLS 1.3 with the run's key (1.10)
    h = hello(secret, host=host)
    sock.sendall(frame(logproto.HELLO, h, rank=0))
    f = read_frame(sock)
    assert f is not None and f[0] == CHALLENGE, f
    sock.sendall(frame(AUTH, mac(secret, b"TSPL1 client", h, f[4][2:])))
    f = read_frame(sock)
    assert f is not None and f[0] == WELCOME, f
    return sock


FORGED = b"\x1b[2J\x1b[31m\n[rank 0] FORGED LINE\r\x07"


def test_remote_text_is_printed_only_after_auth_and_made_printable():
    drv, info = _start_driver("plain")
    try:
        secret = bytes(range(32))
        # A stranger without the key: its bytes never get past TLS, nothing is printed.
        s = socket.create_connection(("127.0.0.1", info["port"]), timeout=5)
        s.sendall(frame(ERROR, b"STRANGER" + FORGED))
        f = read_frame(s)
        assert f is None or f[0] == ERROR, f
        s.close()
        time.sleep(1.1)  # past the rate limit of events about strangers
        # A peer inside TLS that has not authenticated (no HELLO, AUTH): its ERROR text is
        # not printed either.
        s = logproto.connect("127.0.0.1", info["port"], secret)
        s.sendall(frame(ERROR, b"STRANGER" + FORGED))
        assert read_frame(s)[0] == ERROR
        s.close()
        time.sleep(1.1)
        # An authenticated agent with a hostile host name, then its ERROR text.
        a = _handshake(info["port"], secret, host=b"evil\x1b[1m\nhost")
        a.sendall(frame(ERROR, b"AGENT" + FORGED))
        assert read_frame(a)[0] == ERROR
        a.close()
        time.sleep(0.5)
    finally:
        err = _stop_driver(drv)
    assert "STRANGER" not in err and "\x1b" not in err and "\x07" not in err, err
    assert not any(ln.startswith("[rank 0]") for ln in err.splitlines()), err
    assert "before it authenticated: it sent an ERROR frame before authenticating" in err, err
    assert "(host evil?[1m?host, node rank 0)" in err, err
    assert "the agent reported: AGENT?[2J?[31m?[rank 0] FORGED LINE??" in err, err


def test_rank_out_of_the_job_costs_nothing_big():
    drv, info = _start_driver("plain")
    try:
        a = _handshake(info["port"], bytes(range(32)))
        rss0 = _rss_kb(drv.pid)
        a.sendall(frame(logproto.LINE, struct.pack(">Q", 1) + b"far", rank=(1 << 24) - 1,
                        stream=1))
        line = drv.stdout.readline().decode()
        assert json.loads(line) == [(1 << 24) - 1, "far"]
        assert _rss_kb(drv.pid) - rss0 < 50 * 1024, "the driver grew by more than 50 MiB"
        a.close()
    finally:
        _stop_driver(drv)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    raise AssertionError("no VmRSS")


# The rendezvous' end on the driver (docs/protocol.md 2.1), in a process limited the same way.
_RDV_DRIVER = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from torchspark.native._rendezvous import Server
srv = Server("127.0.0.1", "ab" * 32)  # TLS keyed by a run secret (protocol 2.1)
print(json.dumps(srv.spec("127.0.0.1")), flush=True)
sys.stdin.read()
"""


def test_rendezvous_out_of_descriptors_does_not_spin():
    drv = subprocess.Popen([sys.executable, "-c", _RDV_DRIVER],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    socks = []
    try:
        spec = json.loads(drv.stdout.readline())
        for _ in range(FLOOD):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", spec["port"]))
            socks.append(s)
        time.sleep(0.3)
        cpu0 = _cpu_s(drv.pid)
        time.sleep(3)
        cpu = _cpu_s(drv.pid) - cpu0
        print(f"rendezvous driver CPU under the flood: {cpu:.2f} s in 3 s")
        assert cpu < CPU_BOUND_S, f"the rendezvous spent {cpu:.2f} s of CPU in 3 s"
    finally:
        for s in socks:
            s.close()
        drv.kill()
        drv.wait(timeout=10)


def test_output_over_max_result_size_is_refused_before_memory_is_taken(tmp_path):
    from tests.e2e.test_output_channel import _ship
    from tests.helpers.logserver import LogServer
    from torchspark.native import _lib

    srv = LogServer()
    try:
        with pytest.raises(ValueError, match=r'"1.5g" is not a size'):
            srv.output_limit("1.5g")
        srv.output_limit("2m")
        srv.expect_output(None)
        p, out = _ship(tmp_path, srv, 3 << 20)
        assert p.returncode == 0, p.stderr
        status = json.loads((tmp_path / "result.bin.status").read_text())
        # A refusal for good (the ERROR frame's OVER_LIMIT flag, docs/protocol.md 1.6): tried
        # once, never retried; and the task glue does not send it through collect() either
        # (before: "failed", 3 attempts, then collect(): an executor's OutOfMemoryError at
        # 1 GiB instead of the driver's sentence).
        assert status["output"] == "refused", status
        assert ("output of 3145728 bytes is over spark.driver.maxResultSize (2097152 bytes)"
                in status["error"]), status
        assert "TorchSparkRunner.outputPath" in status["error"], status
        assert srv.stats()["rejected"] == 1, srv.stats()
        t0 = time.monotonic()
        assert not srv.wait_output(30)  # the driver knows at once: no wait for a retry
        assert time.monotonic() - t0 < 5
        done = _lib.json_call("tsp_task_finish", {"status": 0, "ship": True, "collect": True,
                                                  "files": {"error": f"{out}.error",
                                                            "output": str(out)}})
        assert done["result"] is None and done["log"] == [], done  # nothing through collect()
    finally:
        srv.close()
    # Under the limit, and "0" (no limit), it arrives.
    for limit in ("4M", "0", None):
        srv = LogServer()
        try:
            srv.output_limit(limit)
            srv.expect_output(None)
            p, _ = _ship(tmp_path, srv, 3 << 20)
            assert p.returncode == 0, p.stderr
            assert srv.wait_output(10), (limit, srv.output_error)
        finally:
            srv.close()


def test_output_file_replaces_a_planted_link_not_its_target(tmp_path):
    from tests.e2e.test_output_channel import _expected_sha, _ship
    from tests.helpers.logserver import LogServer

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest_dir = tmp_path / "dest"
    dest_dir.mkdir()
    dest = dest_dir / "out.bin"
    dest.symlink_to(victim)
    srv = LogServer()
    try:
        srv.expect_output(str(dest))
        p, _ = _ship(tmp_path, srv, 12345)
        assert p.returncode == 0, p.stderr
        assert srv.wait_output(10), srv.output_error
    finally:
        srv.close()
    assert victim.read_bytes() == b"precious"
    assert not dest.is_symlink()
    import hashlib
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == _expected_sha(12345)
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
    assert os.listdir(dest_dir) == ["out.bin"], "no temporary file is left"


def test_a_stranger_cannot_hold_the_output_slot(tmp_path):
    from tests.e2e.test_output_channel import _ship
    from tests.helpers.logserver import LogServer

    srv = LogServer()
    try:
        srv.expect_output(None)
        # A peer that stops at AUTH (inside TLS: HELLO is no longer cleartext, 1.10) does
        # not hold the slot: it is claimed after authentication.
        s = logproto.connect(srv.host, srv.port, srv.secret)
        s.sendall(frame(logproto.HELLO, hello(srv.secret, role=2), rank=0))
        assert read_frame(s)[0] == CHALLENGE
        p, _ = _ship(tmp_path, srv, 4096)
        assert p.returncode == 0, p.stderr
        assert srv.wait_output(10), srv.output_error
        s.close()
    finally:
        srv.close()
