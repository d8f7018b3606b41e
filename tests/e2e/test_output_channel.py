"""Rank 0's output over the driver channel with the real agent: `torchspark-run
--output-file` ships a file its worker wrote to the driver's LogServer, SHA-256 checked;
the file is removed once the driver confirmed it. Sizes over 2 GiB arrive whole (Spark's
2 GiB frame limit is what stock's collect() path hits), the driver's zero-copy view is
byte-identical and keeps its buffer alive after the server object is dropped, and a file
that is missing when the worker is done is reported by the agent with its path.

The outcome is explicit: the agent writes `PATH.status` ({"output": "delivered"|"failed",
"bytes", "sha256", "error"}, docs/cli.md), and the task side (tsp_task_finish, docs/protocol.md 12) decides
from it alone whether rank 0's result goes back through collect()."""
import gc
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers.logchannel_harness import RUN_BIN
from torchspark.native import _lib
from tests.helpers.logserver import LogServer

WRITER = textwrap.dedent("""
    import os, sys
    path, size = sys.argv[1], int(sys.argv[2])
    block = bytes((i * 7 + 3) & 0xff for i in range(1 << 20))
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
""")


@pytest.fixture(autouse=True)
def _need_agent():
    if not RUN_BIN.exists():
        pytest.fail(f"{RUN_BIN} is missing: build first (bash tests/setup.sh)")


def _expected_sha(size: int) -> str:
    block = bytes((i * 7 + 3) & 0xff for i in range(1 << 20))
    h = hashlib.sha256()
    left = size
    while left:
        n = min(left, len(block))
        h.update(block[:n])
        left -= n
    return h.hexdigest()


def _ship(tmp_path, srv: LogServer, size: int, write: bool = True):
    out = tmp_path / "result.bin"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    args = [str(out), str(size)] if write else ["/dev/null", "0"]
    cmd = [str(RUN_BIN), "--nproc-per-node", "1", "--python", sys.executable,
           "--log-endpoint", srv.endpoint, "--output-file", str(out), str(script), *args]
    p = subprocess.run(cmd, env=dict(os.environ, **srv.agent_env()), capture_output=True,
                       text=True, timeout=600)
    return p, out


def result_file(out: object) -> object:
    """What rank 0's task returns through collect() once its agent succeeded with out shipped
    (tsp_task_finish), its sentences written to stderr as the glue writes them."""
    done = _lib.json_call("tsp_task_finish", {"status": 0, "ship": True, "collect": True, "files": {
        "error": f"{out}.error", "output": str(out)}})
    for line in done["log"]:
        sys.stderr.write(line + "\n")
    return done["result"]


@pytest.mark.parametrize("size", [0, 1, 3 * (1 << 20) + 12345])
def test_output_arrives_whole_and_the_file_is_removed(tmp_path, size):
    srv = LogServer()
    try:
        srv.expect_output(None)
        p, out = _ship(tmp_path, srv, size)
        assert p.returncode == 0, p.stderr
        assert srv.wait_output(10), srv.output_error
        view = srv.output_view()
        assert len(view) == size
        assert hashlib.sha256(view).hexdigest() == _expected_sha(size)
        assert srv.output_bytes() == bytes(view)
        assert not out.exists(), "the agent keeps the file only when the transfer failed"
        status = json.loads((tmp_path / "result.bin.status").read_text())
        assert status == {"output": "delivered", "bytes": size, "sha256": _expected_sha(size),
                          "error": None}
        # delivered: the task sends nothing through collect()
        assert result_file(out) is None
    finally:
        srv.close()


def test_view_outlives_the_server_object(tmp_path):
    srv = LogServer()
    srv.expect_output(None)
    p, _ = _ship(tmp_path, srv, 5 << 20)
    assert p.returncode == 0, p.stderr
    assert srv.wait_output(10)
    view = srv.output_view()
    srv.close()
    del srv
    gc.collect()
    # the buffer belongs to the server, which the view keeps alive: still readable
    assert hashlib.sha256(view).hexdigest() == _expected_sha(5 << 20)


def test_missing_output_file_is_named(tmp_path):
    srv = LogServer()
    try:
        srv.expect_output(None)
        p, out = _ship(tmp_path, srv, 0, write=False)
        # training did succeed: the exit status says so (docs/cli.md); the message names
        # the file, and the driver, which saw no output, reports its own error
        assert p.returncode == 0
        assert "did not reach the driver" in p.stderr and str(out) in p.stderr, p.stderr
        assert not srv.wait_output(0.5)
        status = json.loads((tmp_path / "result.bin.status").read_text())
        assert status["output"] == "failed" and str(out) in status["error"], status
        # not delivered and no file: nothing for collect(); the driver reports its own error
        assert result_file(out) is None
    finally:
        srv.close()


@pytest.mark.skipif(os.environ.get("TSP_SKIP_BIG") == "1", reason="TSP_SKIP_BIG=1")
def test_over_2_gib_to_a_file(tmp_path):
    """2 GiB + 1 MiB + 7 bytes, received to a file on the driver: the length does not fit
    in 31 bits, and the file's digest matches the writer's."""
    size = (2 << 30) + (1 << 20) + 7
    dst = tmp_path / "received.bin"
    srv = LogServer()
    try:
        srv.expect_output(str(dst))
        p, _ = _ship(tmp_path, srv, size)
        assert p.returncode == 0, p.stderr
        assert srv.wait_output(10), srv.output_error
        assert dst.stat().st_size == size
        h = hashlib.sha256()
        with open(dst, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        assert h.hexdigest() == _expected_sha(size)
    finally:
        srv.close()


def test_refused_transfer_is_a_failed_status_and_the_glue_falls_back(tmp_path, capsys):
    """The driver refuses the output (it expects none): training succeeded, the status says
    failed with the driver's reason, the file stays, and the task returns it for collect()."""
    srv = LogServer()
    try:
        p, out = _ship(tmp_path, srv, 12345)
        assert p.returncode == 0, p.stderr
        status = json.loads((tmp_path / "result.bin.status").read_text())
        assert status["output"] == "failed" and status["bytes"] == 12345, status
        assert status["sha256"] is None, "no digest was confirmed"
        assert "does not expect an output" in status["error"], status
        assert out.stat().st_size == 12345
        assert result_file(out) == str(out)
        err = capsys.readouterr().err
        assert "says the transfer failed" in err and "through collect() instead" in err, err
    finally:
        srv.close()


def test_endpoint_closed_after_training_is_a_failed_status(tmp_path):
    """The driver's endpoint goes away between training and the transfer: the status says
    failed, with the connection's error, and the glue falls back through collect()."""
    srv = LogServer()
    srv.expect_output(None)
    out, gate = tmp_path / "result.bin", tmp_path / "gate"
    script = tmp_path / "writer.py"
    script.write_text(WRITER + textwrap.dedent(f"""
        import time
        while not os.path.exists({str(gate)!r}):
            time.sleep(0.05)
    """))
    cmd = [str(RUN_BIN), "--nproc-per-node", "1", "--python", sys.executable,
           "--log-endpoint", srv.endpoint, "--output-file", str(out), str(script), str(out),
           "4096"]
    p = subprocess.Popen(cmd, env=dict(os.environ, **srv.agent_env()), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.stat().st_size == 4096):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        srv.close(drain_timeout=0)
        gate.touch()
        _, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, stderr
    status = json.loads((tmp_path / "result.bin.status").read_text())
    assert status["output"] == "failed" and status["error"], status
    assert "did not reach the driver" in stderr, stderr
    assert result_file(out) == str(out)


@pytest.mark.parametrize("text", [None, "", "{\"output\": ", "[1]", "{\"output\": \"maybe\"}"])
def test_missing_or_unreadable_status_is_not_delivered(tmp_path, capsys, text):
    """No status, or not a status: never a silent success; the sentence names the file."""
    out = tmp_path / "result.bin"
    out.write_bytes(b"x")
    status = tmp_path / "result.bin.status"
    if text is not None:
        status.write_text(text)
    assert result_file(out) == str(out)
    err = capsys.readouterr().err
    assert str(status) in err and "not delivered" in err, err


def test_failed_training_leaves_no_status(tmp_path):
    """Training fails: the agent ships nothing and writes no status, and an earlier run's
    status at the same path is removed, so it cannot stand for this run's."""
    srv = LogServer()
    try:
        srv.expect_output(None)
        out, status = tmp_path / "result.bin", tmp_path / "result.bin.status"
        status.write_text('{"output": "delivered"}')
        script = tmp_path / "fail.py"
        script.write_text("raise SystemExit(3)\n")
        cmd = [str(RUN_BIN), "--nproc-per-node", "1", "--python", sys.executable,
               "--log-endpoint", srv.endpoint, "--output-file", str(out), str(script)]
        p = subprocess.run(cmd, env=dict(os.environ, **srv.agent_env()), capture_output=True,
                           text=True, timeout=600)
        assert p.returncode != 0, p.stderr
        assert not status.exists()
    finally:
        srv.close()
