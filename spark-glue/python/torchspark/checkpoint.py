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

A checkpoint on request (docs/distributor.md, "Decommission"): where Spark decommissions an
executor gracefully (``spark.decommission.enabled`` with ``spark.plugins=org.torchspark.TorchSparkPlugin``),
the plugin asks that node's training processes to checkpoint now. :func:`requested` says so,
on every rank at the same step (it is collective); :func:`save` of a checkpoint taken then
acknowledges it and waits, as the attempt's last step, for the plugin to stop the node: the
driver's restart policy (``max_restarts``) resumes from it without that executor, losing 0
steps. One line in a training loop::

    if step % 100 == 0 or checkpoint.requested():
        checkpoint.save(state, step)

Loops that save through their own code (Lightning, HF Trainer) call
:func:`acknowledge_request` after their save.

Every file is written under a temporary name, fsynced and renamed into place (the directory
fsynced after the rename), and ``COMPLETE`` is written only after every file of the checkpoint
is in place (sharded: after a barrier of the default process group), so a run killed in the
middle of a save leaves an incomplete directory that :func:`load_latest` skips; a save that
fails (an error, a full disk) removes what it wrote. ``keep`` (default 2) complete
checkpoints are kept; older ones are removed by rank 0 after a save completes.

Other users of the hosts (docs/security.md, "The executor host"): a local checkpoint
directory must be owned by the user that runs training and writable by nobody else (it is
created mode 0700; files are 0600): another user who can write there could plant a
checkpoint that the next attempt loads. :func:`load_latest` loads with
``torch.load(weights_only=True)`` (torch's own default), which runs no code from the file;
``weights_only=False`` is an explicit opt-out for states that hold other objects. A newest
checkpoint that cannot be loaded (corrupted, or refused by ``weights_only``) is passed over
with a warning for the previous complete one.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import posixpath
import re
import shutil
import stat
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional

__all__ = ["Checkpoint", "save", "load_latest", "latest_step", "requested", "acknowledge_request",
           "batch_size", "DIR_ENV", "REQUEST_ENV"]

DIR_ENV = "TORCHSPARK_CHECKPOINT_DIR"
REQUEST_ENV = "TORCHSPARK_CHECKPOINT_REQUEST"  # the file TorchSparkPlugin creates (Decommission.java)
ACK_SUFFIX = ".done"
# requested() was called on this node: TorchSparkPlugin's SIGTERM hook (Preemption.java)
# waits for the checkpoint of a node that watches only, never for a loop that cannot answer.
WATCH_SUFFIX = ".watch"
_watching = False
STOP_WAIT_S = 120.0  # how long a checkpoint taken on request waits to be stopped
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
            os.makedirs(path, mode=0o700, exist_ok=True)

    def check_root(self) -> bool:
        """Refuses a local root that another user owns or can write (ValueError with what
        to do); False when it does not exist. A URL's permissions are its store's."""
        if self.fs is not None:
            return True
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"torchspark.checkpoint: {self.root!r} is not a directory")
        uid, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
        who = {0o022: "its group and others", 0o020: "its group", 0o002: "others"}
        problem = (f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
                   if st.st_uid != uid else
                   f"is writable by {who[mode & 0o022]} (mode {mode:04o})" if mode & 0o022
                   else None)
        if problem:
            raise ValueError(
                f"torchspark.checkpoint: refusing the checkpoint directory {self.root!r}: it "
                f"{problem}, so another user could plant a checkpoint there that this run "
                "would load. Use a directory that this user owns and only it can write: "
                f"`chmod go-w {self.root}` if it is yours, or a new one (torchspark creates "
                "a missing directory with mode 0700)")
        return True

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            if self.fs is not None:
                with self.fs.open(tmp, "wb") as f:
                    f.write(data)
                self.fs.mv(tmp, path)
                return
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            self.remove(tmp)  # a failed save leaves no partial file
            raise
        # The rename itself survives a crash only once its directory is on disk.
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove(self, path: str) -> None:
        try:
            if self.fs is not None:
                if self.fs.exists(path):
                    self.fs.rm(path)
            else:
                os.unlink(path)
        except OSError:
            pass

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


class _PlainUnpickler(pickle.Unpickler):
    """weights_only without torch: containers and scalars only, no class is imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"weights_only load refuses {module}.{name} (pass weights_only=False for a "
            "checkpoint you trust)")


def _loads(data: bytes, map_location: Any, weights_only: bool) -> Any:
    try:
        import torch
    except ImportError:
        if weights_only:
            return _PlainUnpickler(io.BytesIO(data)).load()
        return pickle.loads(data)
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)


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
    path = _save(state, step, dir, sharded, keep)
    if _pending:
        acknowledge_request(step)
    return path


def _save(state: Any, step: int, dir: Optional[str], sharded: bool, keep: int) -> Optional[str]:
    fs = _Fs(_dir(dir))
    path = fs.join(fs.root, _step_name(step))
    rank, world, dist = _dist()
    if not sharded and rank != 0:
        return None
    if not fs.check_root():
        fs.makedirs(fs.root)
        fs.check_root()  # an existing parent's ACLs or a umask cannot loosen it unseen
    created = not fs.exists(path)
    fs.makedirs(path)
    name = f"rank-{rank:05d}.pt" if sharded else "state.pt"
    try:
        fs.write_atomic(fs.join(path, name), _dumps(state))
    except BaseException:
        if created and not sharded:
            fs.rmtree(path)  # nothing of this save stays behind
        raise
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
    fs = _Fs(_dir(dir))
    steps = _complete_steps(fs) if fs.check_root() else []
    return steps[0] if steps else None


def _load_step(fs: _Fs, step: int, rank: int, world: int, map_location: Any,
               weights_only: bool) -> Checkpoint:
    path = fs.join(fs.root, _step_name(step))
    meta = json.loads(fs.read(fs.join(path, COMPLETE)))
    if meta.get("sharded"):
        if meta.get("world_size") != world:
            raise _WorldMismatch(
                f"torchspark.checkpoint: {path} was saved sharded by "
                f"{meta.get('world_size')} ranks, but this run has {world}: load it with "
                "the same number of processes")
        name = f"rank-{rank:05d}.pt"
    else:
        name = "state.pt"
    return Checkpoint(step, _loads(fs.read(fs.join(path, name)), map_location, weights_only),
                      path)


class _WorldMismatch(ValueError):
    pass


def load_latest(dir: Optional[str] = None, *, map_location: Any = "cpu",
                weights_only: bool = True) -> Optional[Checkpoint]:
    """The newest complete checkpoint (rank 0's state; sharded: this rank's own), or None
    when there is none. Checkpoints without their COMPLETE marker (a save that was
    killed) are skipped; one that cannot be loaded is passed over for the previous complete
    one with a warning (all ranks agree on the step where a process group is up), and when
    none can be, the newest one's error is raised.

    weights_only=True (the default, as torch.load's): tensors, containers and scalars only,
    no code from the file runs. weights_only=False loads any pickled object, which runs
    whatever code the file holds: only for a directory that nobody else can write."""
    fs = _Fs(_dir(dir))
    rank, world, dist = _dist()
    steps = _complete_steps(fs) if fs.check_root() else []
    first_error: Optional[BaseException] = None
    for step in steps:
        ck: Optional[Checkpoint] = None
        sharded = False  # COMPLETE unreadable: every rank reads the same file alike
        try:
            sharded = _is_sharded(fs, step)
            ck = _load_step(fs, step, rank, world, map_location, weights_only)
        except _WorldMismatch:
            raise
        except Exception as e:  # corrupted, truncated, refused by weights_only
            first_error = first_error or e
            warnings.warn(f"torchspark.checkpoint: cannot load the checkpoint of step {step} "
                          f"({type(e).__name__}: {e}); trying the previous complete one",
                          RuntimeWarning, stacklevel=2)
        # A sharded checkpoint is loaded by every rank together: one rank that cannot load
        # its shard sends them all to the previous step. (Rank 0's state is one file that
        # every rank reads alike, and may be loaded on rank 0 only: no collective then.)
        if sharded and dist is not None and world > 1:
            if _all_reduce(0 if ck is None else 1, dist, dist.ReduceOp.MIN) == 0:
                continue
        if ck is not None:
            return ck
    if first_error is not None:
        hint = (" (weights_only=True refuses objects other than tensors, containers and "
                "scalars: pass weights_only=False only for a checkpoint you trust)"
                if weights_only else "")
        raise RuntimeError(f"torchspark.checkpoint: no complete checkpoint under "
                           f"{fs.root!r} could be loaded{hint}") from first_error
    return None


def _is_sharded(fs: _Fs, step: int) -> bool:
    meta = json.loads(fs.read(fs.join(fs.root, _step_name(step), COMPLETE)))
    return bool(meta.get("sharded"))


def _all_reduce(value: int, dist: Any, op: Any) -> int:
    """value reduced over the default process group (on the backend's device)."""
    import torch

    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=op)
    return int(t.item())




_pending = False  # requested() said True: the next save() acknowledges


def _request_file() -> Optional[str]:
    return os.environ.get(REQUEST_ENV) or None


def requested() -> bool:
    """Whether the node of any rank was asked to checkpoint now (its executor is being
    decommissioned). Collective: call it on every rank at the same step (an all-reduce of one
    number over the default process group, when there is one); it then says the same on
    every rank. False outside a torchspark run or without TorchSparkPlugin."""
    global _pending
    path = _request_file()
    _watch(path)
    local = path is not None and os.path.exists(path)
    rank, world, dist = _dist()
    flag = local
    if dist is not None and world > 1:
        flag = bool(_all_reduce(1 if local else 0, dist, dist.ReduceOp.MAX))
    _pending = _pending or flag
    return flag


def _watch(path: Optional[str]) -> None:
    """Once a process: <request>.watch says that this node's loop asks requested()."""
    global _watching
    if _watching or path is None:
        return
    _watching = True
    try:
        os.close(os.open(path + WATCH_SUFFIX,
                         os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError:
        pass  # the plugin then stops this node without waiting (as without the plugin)


def acknowledge_request(step: int, stop_wait_s: Optional[float] = None) -> None:
    """After the checkpoint of step was saved because requested() said so: tells the plugin
    (every node that was asked writes its acknowledgement), then waits to be stopped, so no
    step runs after it; raises RuntimeError when nothing stopped it within stop_wait_s.
    Collective like requested(). save() calls it itself."""
    global _pending
    _pending = False
    stop_wait_s = STOP_WAIT_S if stop_wait_s is None else stop_wait_s
    rank, world, dist = _dist()
    if dist is not None and world > 1:
        dist.barrier()  # rank 0's COMPLETE is in place on every node's view
    path = _request_file()
    if path is None or not os.path.exists(path):
        if dist is None or world == 1:
            return  # nobody asked (a test, or a run without the plugin)
    else:
        tmp = f"{path}{ACK_SUFFIX}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{step}\n")
        os.replace(tmp, path + ACK_SUFFIX)
    why = "executor decommission"
    try:
        with open(path or "", "rb") as f:  # its first word: who asked (the agent: grow)
            if f.read(5) == b"grow ":
                why = "the run grows back to more nodes"
    except OSError:
        pass
    print(f"torchspark.checkpoint: step {step} checkpointed on request ({why}); "
          "waiting to be stopped", flush=True)
    deadline = time.monotonic() + stop_wait_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError(
        "torchspark.checkpoint: the checkpoint asked for by the decommission notice was taken "
        f"(step {step}), but the node was not stopped within {stop_wait_s:g}s; is "
        "org.torchspark.TorchSparkPlugin in spark.plugins?")


def batch_size(per_rank: int) -> int:
    """This rank's batch now, from ``per_rank``, the per-rank batch at the run's full size
    (docs/distributor.md, "The global batch and the data order across sizes"): itself under
    ``spark.torchspark.elastic.batch=per_rank`` (the default, and outside an elastic run);
    under ``global``, the full size's global batch (``per_rank`` x the full world size)
    divided by ``WORLD_SIZE``, the first ``global % WORLD_SIZE`` ranks taking one more."""
    if per_rank < 1:
        raise ValueError(f"torchspark.checkpoint.batch_size: per_rank must be >= 1, got {per_rank}")
    env = os.environ
    if env.get("TORCHSPARK_ELASTIC_BATCH") != "global":
        return per_rank
    try:
        nodes, local = int(env["TORCHSPARK_MAX_NODES"]), int(env["LOCAL_WORLD_SIZE"])
        world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
    except (KeyError, ValueError):
        return per_rank  # not a torchspark training process
    total = per_rank * nodes * local
    return total // world + (1 if rank < total % world else 0)
