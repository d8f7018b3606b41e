"""torchspark.checkpoint: checkpoints a restarted run can rely on (docs/distributor.md).

    from torchspark import checkpoint

    ckpt = checkpoint.load_latest()          # None on a fresh start
    start = 0 if ckpt is None else ckpt.step + 1
    if ckpt is not None:
        model.load_state_dict(ckpt.state["model"])
        opt.load_state_dict(ckpt.state["opt"])
    for step in range(start, steps):
        ...
        if step % 100 == 0:
            checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)

Layout under the directory (``dir=`` or the environment variable
``TORCHSPARK_CHECKPOINT_DIR``; any path every executor shares: a local or NFS path, or an
fsspec URL such as ``s3://`` or ``hdfs://`` where fsspec is installed)::

    step-000000000120/state.pt           rank 0's state (sharded=False)
    step-000000000120/rank-00003.pt      each rank's own state (sharded=True)
    step-000000000120/COMPLETE           written last: {"step", "world_size", "sharded"}

Every file is written under a temporary name and renamed into place, and ``COMPLETE`` is
written only after every file of the checkpoint is in place (sharded: after a barrier of
the default process group), so a run killed in the middle of a save leaves an incomplete
directory that :func:`load_latest` skips. ``keep`` (default 2) complete checkpoints are kept;
older ones are removed by rank 0 after a save completes.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import posixpath
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, List, Optional

__all__ = ["Checkpoint", "save", "load_latest", "latest_step", "DIR_ENV"]

DIR_ENV = "TORCHSPARK_CHECKPOINT_DIR"
COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"step-(\d{12})$")


@dataclass
class Checkpoint:
    step: int
    state: Any  # rank 0's state, or this rank's own for a sharded checkpoint
    path: str  # the checkpoint's directory


def _dir(directory: Optional[str]) -> str:
    d = directory or os.environ.get(DIR_ENV)
    if not d:
        raise ValueError(
            "torchspark.checkpoint: no checkpoint directory: pass dir=... or set the "
            f"environment variable {DIR_ENV} to a path every executor shares")
    return d


class _Fs:
    """The few file operations needed, on a local path or an fsspec URL."""

    def __init__(self, root: str) -> None:
        self.remote = "://" in root and not root.startswith("file://")
        if self.remote:
            try:
                import fsspec
            except ImportError:
                raise ValueError(
                    f"torchspark.checkpoint: {root!r} is a URL, which needs fsspec (and its "
                    "filesystem's package, e.g. s3fs): pip install fsspec") from None
            self.fs, self.root = fsspec.core.url_to_fs(root)
            self.join = posixpath.join
        else:
            self.fs = None
            self.root = root[len("file://"):] if root.startswith("file://") else root
            self.join = os.path.join

    def makedirs(self, path: str) -> None:
        if self.fs is not None:
            self.fs.makedirs(path, exist_ok=True)
        else:
            os.makedirs(path, exist_ok=True)

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        if self.fs is not None:
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, path)
            return
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def read(self, path: str) -> bytes:
        if self.fs is not None:
            with self.fs.open(path, "rb") as f:
                return f.read()
        with open(path, "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return self.fs.exists(path) if self.fs is not None else os.path.exists(path)

    def listdir(self, path: str) -> List[str]:
        if self.fs is not None:
            if not self.fs.exists(path):
                return []
            return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False)]
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def rmtree(self, path: str) -> None:
        if self.fs is not None:
            self.fs.rm(path, recursive=True)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _dist() -> "tuple[int, int, Any]":
    """(rank, world size, torch.distributed or None when no process group is up)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), dist
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), None


def _dumps(state: Any) -> bytes:
    try:
        import torch
    except ImportError:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _loads(data: bytes, map_location: Any) -> Any:
    try:
        import torch
    except ImportError:
        return pickle.loads(data)
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)


def _step_name(step: int) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"torchspark.checkpoint: step must be an int >= 0, not {step!r}")
    return f"step-{step:012d}"


def save(state: Any, step: int, *, dir: Optional[str] = None, sharded: bool = False,
         keep: int = 2) -> Optional[str]:
    """Saves state as the checkpoint of step; returns its directory (None on the ranks
    that write nothing).

    sharded=False: rank 0 writes state, the other ranks return at once (call it on every
    rank or on rank 0 only). sharded=True: every rank writes its own state and must call
    it (a barrier of the default process group orders the COMPLETE marker after every
    rank's file). keep: how many complete checkpoints to keep (>= 1)."""
    if keep < 1:
        raise ValueError(f"torchspark.checkpoint: keep must be >= 1, not {keep}")
    fs = _Fs(_dir(dir))
    path = fs.join(fs.root, _step_name(step))
    rank, world, dist = _dist()
    if not sharded and rank != 0:
        return None
    fs.makedirs(path)
    name = f"rank-{rank:05d}.pt" if sharded else "state.pt"
    fs.write_atomic(fs.join(path, name), _dumps(state))
    if sharded and dist is not None:
        dist.barrier()
    if rank == 0:
        meta = {"step": step, "world_size": world if sharded else 1, "sharded": sharded}
        fs.write_atomic(fs.join(path, COMPLETE), json.dumps(meta).encode())
        _prune(fs, keep)
    if sharded and dist is not None:
        dist.barrier()  # nobody loads or saves again before COMPLETE is there
    return path


def _complete_steps(fs: _Fs) -> List[int]:
    steps = []
    for name in fs.listdir(fs.root):
        m = _STEP_DIR.match(name)
        if m and fs.exists(fs.join(fs.root, name, COMPLETE)):
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def _prune(fs: _Fs, keep: int) -> None:
    steps = _complete_steps(fs)
    newest = steps[0] if steps else -1
    for name in fs.listdir(fs.root):
        m = _STEP_DIR.match(name)
        if not m:
            continue
        s = int(m.group(1))
        # Older than the kept ones: complete or not (a save that was killed).
        if s < newest and s not in steps[:keep]:
            fs.rmtree(fs.join(fs.root, name))


def latest_step(dir: Optional[str] = None) -> Optional[int]:
    """The step of the newest complete checkpoint, or None."""
    steps = _complete_steps(_Fs(_dir(dir)))
    return steps[0] if steps else None


def load_latest(dir: Optional[str] = None, *, map_location: Any = "cpu") -> Optional[Checkpoint]:
    """The newest complete checkpoint (rank 0's state; sharded: this rank's own), or None
    when there is none. Checkpoints without their COMPLETE marker (a save that was
    killed) are skipped."""
    fs = _Fs(_dir(dir))
    rank, world, _ = _dist()
    for step in _complete_steps(fs):
        path = fs.join(fs.root, _step_name(step))
        meta = json.loads(fs.read(fs.join(path, COMPLETE)))
        if meta.get("sharded"):
            if meta.get("world_size") != world:
                raise ValueError(
                    f"torchspark.checkpoint: {path} was saved sharded by "
                    f"{meta.get('world_size')} ranks, but this run has {world}: load it with "
                    "the same number of processes")
            name = f"rank-{rank:05d}.pt"
        else:
            name = "state.pt"
        return Checkpoint(step, _loads(fs.read(fs.join(path, name)), map_location), path)
    return None
