"""Shared helpers for the torchspark-run end-to-end tests and benchmarks.

Every process a test starts carries TSP_TEST_MARKER=<uuid> in its environment (the agent
passes its environment on to workers, and workers to their children), so the processes a
test leaves behind are found by scanning /proc/*/environ, whoever their parent is now.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
# The checkout's .venv; in the version matrix's own pytest (tests/e2e/test_pyspark_matrix.py)
# the matrix venv that runs it, with its torch (torchrun) and its torchspark-run.
VENV_BIN = (Path(sys.executable).parent if os.environ.get("TORCHSPARK_MATRIX_INNER") == "1"
            else ROOT / ".venv" / "bin")
PY = str(VENV_BIN / "python")
TSR = os.environ.get("TORCHSPARK_RUN", str(VENV_BIN / "torchspark-run"))
SCRIPTS = ROOT / "tests" / "e2e" / "agent_scripts"
WORKER = str(SCRIPTS / "agent_worker.py")
MARKER_VAR = "TSP_TEST_MARKER"


def torchrun_cmd(*args: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", *args]


def tsr_cmd(*args: str) -> list[str]:
    return [TSR, *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(marker: str, **extra: str) -> dict[str, str]:
    """A small, fixed launcher environment: what both launchers see is exactly this."""
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        MARKER_VAR: marker,
    }
    env.update(extra)
    return env


def new_marker() -> str:
    return uuid.uuid4().hex


def marked_pids(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds the marker, except ourselves."""
    needle = f"{MARKER_VAR}={marker}".encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state in (b"Z", b"X"):
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd.strip()}")
    return out


def survivors(marker: str, wait: float = 3.0) -> list[str]:
    """Processes still alive after a short bounded wait; they are then SIGKILLed so that one
    failing test does not leak into the next. Returns their descriptions (empty = clean)."""
    deadline = time.monotonic() + wait
    pids = marked_pids(marker)
    while pids and time.monotonic() < deadline:
        time.sleep(0.02)
        pids = marked_pids(marker)
    desc = describe(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return desc


def start(cmd: list[str], env: dict[str, str], cwd=None, **kw) -> subprocess.Popen:
    """Starts a launcher in a session of its own. Its output goes to unnamed temporary files,
    not pipes: a leaked descendant holding a pipe open would hang the reader, and the test
    would report a timeout instead of the leaked process."""
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err, text=True,
                         start_new_session=True, **kw)
    p._tsp_files = (out, err)  # type: ignore[attr-defined]
    return p


def finish(p: subprocess.Popen, timeout: float = 60) -> subprocess.CompletedProcess:
    """Waits for a launcher from start(); on timeout it is killed and the test fails."""
    try:
        p.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        timed_out = True
    texts = []
    for f in p._tsp_files:  # type: ignore[attr-defined]
        f.seek(0)
        texts.append(f.read())
        f.close()
    if timed_out:
        raise AssertionError(f"{p.args} did not finish in {timeout}s\n"
                             f"stdout:{texts[0]}\nstderr:{texts[1]}")
    return subprocess.CompletedProcess(p.args, p.returncode, texts[0], texts[1])


def run(cmd: list[str], env: dict[str, str], timeout: float = 60, cwd=None,
        **kw) -> subprocess.CompletedProcess:
    """Runs a launcher to completion; on timeout the launcher is killed and the test fails."""
    return finish(start(cmd, env, cwd=cwd, **kw), timeout)


def wait_for_files(paths: list[Path], timeout: float = 30.0, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"launcher exited ({proc.returncode}) before workers were ready")
        if time.monotonic() > deadline:
            missing = [str(p) for p in paths if not p.exists()]
            raise AssertionError(f"workers not ready in {timeout}s: {missing}")
        time.sleep(0.01)


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def failure_block(stderr: str) -> list[str]:
    """The lines of the ChildFailedError block (from its '=' rule to the closing rule)."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line and set(line) == {"="} and i + 1 < len(lines) and lines[i + 1].endswith(" FAILED"):
            for j in range(i + 2, len(lines)):
                if lines[j] and set(lines[j]) == {"="}:
                    return lines[i:j + 1]
    raise AssertionError(f"no ChildFailedError block on stderr:\n{stderr}")


def root_cause(block: list[str]) -> dict[str, str]:
    """The 'Root Cause' entry's fields (time, host, rank, exitcode, error_file, traceback)."""
    i = block.index("Root Cause (first observed failure):")
    fields: dict[str, str] = {}
    key = None
    for line in block[i + 2:-1]:
        if key == "traceback":  # the traceback is last and may span lines
            fields[key] += "\n" + line
        elif ":" in line:
            k, v = line.split(":", 1)
            key = k.strip()
            fields[key] = v.strip()
    return fields


def gpus_owned(addresses: List[str], visible: Optional[str], task: str = "0",
               host: Optional[str] = None) -> List[str]:
    """Spark GPU addresses + the CUDA_VISIBLE_DEVICES they were given under -> the workers'
    entries, by the native rules R0-R8 (native/src/gpu/gpu.c, docs/gpu.md), which the agent
    applies to its --gpus. ValueError with the rule's message on a refusal (the stock text
    for malformed addresses)."""
    from torchspark.native._lib import json_call
    mask = json_call("tsp_gpu_call", {"addresses": list(addresses), "visible": visible,
                                       "task": task, "host": host or None})["mask"]
    return mask.split(",") if mask else []
