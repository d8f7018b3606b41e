"""torchspark.checkpoint: atomic saves, the newest complete checkpoint, sharded state on
every rank of a real gloo process group (real torch, real processes; no Spark)."""
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.logchannel_harness import ROOT, RUN_BIN
from torchspark import checkpoint


def test_nothing_saved_yet_is_none(tmp_path):
    assert checkpoint.load_latest(str(tmp_path / "none")) is None
    assert checkpoint.latest_step(str(tmp_path)) is None


def test_newest_complete_checkpoint_wins(tmp_path):
    d = str(tmp_path)
    for step in (3, 10, 7):
        checkpoint.save({"w": torch.full((2,), float(step)), "step": step}, step, dir=d, keep=5)
    ck = checkpoint.load_latest(d)
    assert ck.step == 10 and ck.state["step"] == 10
    assert torch.equal(ck.state["w"], torch.full((2,), 10.0))
    # A newer save that was killed before its COMPLETE marker: skipped.
    (tmp_path / "step-000000000011").mkdir()
    (tmp_path / "step-000000000011" / "state.pt").write_bytes(b"half a file")
    assert checkpoint.load_latest(d).step == 10
    assert checkpoint.latest_step(d) == 10


def test_keep_prunes_older_checkpoints_and_torn_ones(tmp_path):
    d = str(tmp_path)
    (tmp_path / "step-000000000000").mkdir(parents=True)  # torn, older than all
    for step in range(1, 6):
        checkpoint.save({"s": step}, step, dir=d, keep=2)
    assert sorted(os.listdir(d)) == ["step-000000000004", "step-000000000005"]


def test_environment_names_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(checkpoint.DIR_ENV, str(tmp_path))
    checkpoint.save([1, 2], 0)
    assert checkpoint.load_latest().state == [1, 2]


def test_bad_input_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(checkpoint.DIR_ENV, raising=False)
    with pytest.raises(ValueError, match="TORCHSPARK_CHECKPOINT_DIR"):
        checkpoint.save({}, 1)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        checkpoint.save({}, -1, dir=str(tmp_path))
    with pytest.raises(ValueError, match="keep must be >= 1"):
        checkpoint.save({}, 1, dir=str(tmp_path), keep=0)


def test_non_zero_ranks_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert checkpoint.save({"x": 1}, 4, dir=str(tmp_path)) is None
    assert os.listdir(tmp_path) == []


_SLOW_SAVE = r"""
import sys, torch
from torchspark import checkpoint
checkpoint.save({"w": torch.zeros(4)}, 1, dir=sys.argv[1])
print("saved 1", flush=True)
checkpoint.save({"w": torch.ones(64 << 20)}, 2, dir=sys.argv[1])  # 256 MiB: killed in it
print("saved 2", flush=True)
"""


def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "saved 1"
    step2 = tmp_path / "step-000000000002"
    deadline = time.monotonic() + 60
    while not step2.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert step2.exists() and not (step2 / "COMPLETE").exists()
    ck = checkpoint.load_latest(str(tmp_path))
    assert ck.step == 1 and torch.equal(ck.state["w"], torch.zeros(4))


_SHARDED = r"""
import os, sys, torch, torch.distributed as dist
from torchspark import checkpoint
dist.init_process_group("gloo")
r = dist.get_rank()
d = sys.argv[1]
assert checkpoint.load_latest(d) is None
for step in (5, 6):
    checkpoint.save({"rank": r, "t": torch.full((3,), float(r * 100 + step))}, step, dir=d,
                    sharded=True)
ck = checkpoint.load_latest(d)
assert ck.step == 6 and ck.state["rank"] == r, ck
assert torch.equal(ck.state["t"], torch.full((3,), float(r * 100 + 6)))
print(f"OK rank {r}", flush=True)
dist.destroy_process_group()
"""


def test_sharded_checkpoint_on_every_rank_of_a_gloo_group(tmp_path):
    ckdir = tmp_path / "ck"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "spark-glue" / "python"))
    script = tmp_path / "sharded.py"
    script.write_text(_SHARDED)
    r = subprocess.run([str(RUN_BIN), "--standalone", "--nproc-per-node", "3", "--python",
                        sys.executable, str(script), str(ckdir)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert sorted(os.listdir(ckdir / "step-000000000006")) == [
        "COMPLETE", "rank-00000.pt", "rank-00001.pt", "rank-00002.pt"]
    assert r.stdout.count("OK rank") == 3, r.stdout
    # Loaded with another world size: named.
    with pytest.raises(ValueError, match="saved sharded by 3 ranks"):
        checkpoint.load_latest(str(ckdir))


def test_fsspec_url(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    url = "memory://tsp-ck-" + Path(tmp_path).name
    checkpoint.save({"a": 1}, 3, dir=url)
    checkpoint.save({"a": 2}, 4, dir=url)
    ck = checkpoint.load_latest(url)
    assert ck.step == 4 and ck.state == {"a": 2}
    fsspec.filesystem("memory").rm(url.split("://")[1], recursive=True)


def test_checkpoint_on_request_acknowledges_and_waits(tmp_path, monkeypatch):
    # The request file TorchSparkPlugin creates on a decommission notice (Decommission.java).
    monkeypatch.delenv("RANK", raising=False)
    req = tmp_path / "checkpoint-request"
    assert not checkpoint.requested()  # outside a torchspark run
    monkeypatch.setenv(checkpoint.REQUEST_ENV, str(req))
    assert not checkpoint.requested()  # nobody asked
    checkpoint.save({"w": 1}, 4, dir=str(tmp_path / "ck"))  # an ordinary save returns
    req.write_text("1\n")
    assert checkpoint.requested()
    t0 = time.monotonic()
    monkeypatch.setattr(checkpoint, "STOP_WAIT_S", 0.3)
    with pytest.raises(RuntimeError, match=r"checkpoint asked for by the decommission notice was "
                       r"taken \(step 7\), but the node was not stopped within 0.3s"):
        checkpoint.save({"w": 2}, 7, dir=str(tmp_path / "ck"), keep=5)
    assert time.monotonic() - t0 >= 0.3
    # The checkpoint was complete before the acknowledgement (its step in it).
    assert checkpoint.latest_step(str(tmp_path / "ck")) == 7
    assert (tmp_path / "checkpoint-request.done").read_text() == "7\n"


@pytest.mark.parametrize("request_text,reason", [
    ("preempted 1764140000000\n", "preempted"), ("decommission 1764140000000\n", "decommission"),
    ("1764140000000\n", "decommission")])
def test_an_agent_stopped_after_a_checkpoint_on_request_says_why(tmp_path, request_text, reason):
    # The plugin asked (the request file: why, then the time), the worker acknowledged step 7,
    # then the plugin SIGTERMs the agent: the node's record carries why and the step as fields
    # (docs/protocol.md section 8); a request that does not say why (an older plugin's) is a
    # decommission.
    req, err = tmp_path / "checkpoint-request", tmp_path / "error.json"
    req.write_text(request_text)
    env = dict(os.environ, TORCHSPARK_CHECKPOINT_REQUEST=str(req))
    p = subprocess.Popen([str(RUN_BIN), "--standalone", "--nproc-per-node", "1", "--no-python",
                          "--error-file", str(err), "sh", "-c",
                          # atomically, as torchspark.checkpoint acknowledges (a file that
                          # exists before its step is written reads as no acknowledgement)
                          'echo 7 > "$TORCHSPARK_CHECKPOINT_REQUEST.t" && '
                          'mv "$TORCHSPARK_CHECKPOINT_REQUEST.t" "$TORCHSPARK_CHECKPOINT_REQUEST.done"; '
                          'exec sleep 30'],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "checkpoint-request.done").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    finally:
        p.kill()
        p.wait()
    doc = json.loads(err.read_text())["torchspark"]
    assert doc["reason"] == reason and doc["checkpoint_step"] == 7, doc
    assert doc["node_rank"] == 0, doc


# ---- other users of the hosts (docs/security.md, "The executor host") ----------------------

class _Planted:
    """What another user would plant: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(ckdir, step, marker):
    d = ckdir / f"step-{step:012d}"
    d.mkdir(mode=0o700)
    torch.save({"model": _Planted(marker)}, d / "state.pt")
    (d / "COMPLETE").write_text(json.dumps({"step": step, "world_size": 1, "sharded": False}))


def test_a_planted_pickle_is_not_executed(tmp_path):
    ckdir, marker = tmp_path / "ck", tmp_path / "pwned"
    checkpoint.save({"w": torch.ones(2)}, 1, dir=str(ckdir))
    _plant(ckdir, 2, marker)
    with pytest.warns(RuntimeWarning, match="cannot load the checkpoint of step 2"):
        ck = checkpoint.load_latest(str(ckdir))
    assert not marker.exists(), "load_latest ran the code of a planted pickle"
    assert ck.step == 1 and torch.equal(ck.state["w"], torch.ones(2))
    # Only the newest, planted: refused, with what to do about a trusted one.
    shutil.rmtree(ckdir / "step-000000000001")
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="weights_only=False"):
        checkpoint.load_latest(str(ckdir))
    assert not marker.exists()
    # The explicit opt-out loads any object (here: runs the command).
    checkpoint.load_latest(str(ckdir), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("mode,who", [(0o777, "its group and others"), (0o775, "its group"),
                                      (0o757, "others")])
def test_a_directory_others_can_write_is_refused(tmp_path, mode, who):
    ckdir = tmp_path / "ck"
    checkpoint.save({"w": 1}, 1, dir=str(ckdir))
    ckdir.chmod(mode)
    msg = (rf"refusing the checkpoint directory '{ckdir}': it is writable by {who} "
           rf"\(mode {mode:04o}\).*chmod go-w {ckdir}")
    with pytest.raises(ValueError, match=msg):
        checkpoint.save({"w": 2}, 2, dir=str(ckdir))
    with pytest.raises(ValueError, match=msg):
        checkpoint.load_latest(str(ckdir))
    with pytest.raises(ValueError, match=msg):
        checkpoint.latest_step(str(ckdir))
    assert sorted(os.listdir(ckdir)) == ["step-000000000001"]


def test_a_directory_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    ckdir = tmp_path / "ck"
    checkpoint.save({"w": 1}, 1, dir=str(ckdir))
    os.chown(ckdir, 65534, 65534)
    with pytest.raises(ValueError, match=r"is owned by uid 65534, not by this user \(uid 0\)"):
        checkpoint.load_latest(str(ckdir))


def test_new_directories_are_0700_and_files_0600(tmp_path):
    ckdir = tmp_path / "new" / "ck"
    checkpoint.save({"w": 1}, 3, dir=str(ckdir))
    for d in (ckdir, ckdir / "step-000000000003"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in ("state.pt", "COMPLETE"):
        assert stat.S_IMODE((ckdir / "step-000000000003" / f).stat().st_mode) == 0o600, f


def test_a_corrupted_newest_falls_back_to_the_previous_complete_one(tmp_path):
    d = str(tmp_path / "ck")
    for step in (1, 2):
        checkpoint.save({"w": torch.full((2,), float(step))}, step, dir=d)
    (tmp_path / "ck" / "step-000000000002" / "state.pt").write_bytes(b"\x80\x04garbage")
    with pytest.warns(RuntimeWarning, match="cannot load the checkpoint of step 2"):
        ck = checkpoint.load_latest(d)
    assert ck.step == 1 and torch.equal(ck.state["w"], torch.ones(2))


_FAILED_SAVE = r"""
import os, resource, signal, sys, torch
from torchspark import checkpoint
checkpoint.save({"w": torch.zeros(4)}, 1, dir=sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk, as write() sees it: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    checkpoint.save({"w": torch.ones(4 << 20)}, 2, dir=sys.argv[1])  # 16 MiB
except OSError as e:
    print("failed", e.errno, flush=True)
"""


def test_a_failed_save_removes_its_partial_files(tmp_path):
    ckdir = tmp_path / "ck"
    r = subprocess.run([sys.executable, "-c", _FAILED_SAVE, str(ckdir)], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.startswith("failed"), (r.stdout, r.stderr[-2000:])
    assert sorted(os.listdir(ckdir)) == ["step-000000000001"]  # no step 2, no temporary file
    with pytest.raises((pickle.PicklingError, AttributeError)):  # a local object: not picklable
        checkpoint.save({"f": lambda: 0}, 3, dir=str(ckdir))
    assert sorted(os.listdir(ckdir)) == ["step-000000000001"]
