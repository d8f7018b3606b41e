"""The warm worker pool (docs/protocol.md §6): function-mode training processes forked from
a process that has torch imported already.

Where the time of a small run() goes (docs/benchmarks.md, "run(): launch to return, against stock
and the floor"): 1.5 s of 2 s is the training
process starting Python and importing torch. A pool process per executor (per driver in
local mode) imports torch, torch.distributed and pyspark's cloudpickle once, then forks one
training process per request that the agent's shim (``torchspark-run --warm-exec``,
native/src/agent/warm.c) sends it. The agent supervises the shim as it would the worker: the
shim hands the pool its standard streams, forwards the agent's signals and exits with the
worker's status; killing the shim kills the worker. Anything that stops the pool from
serving a request before the fork (no pool, another environment, a refusal) makes the shim
run the command itself, exactly as without a pool.

Lifetime: the pool ends when its anchor (the executor JVM, or the driver's Python in local
mode) ends, when it has had no worker and no request for the idle timeout
(spark.torchspark.warmWorkers.idleTimeout, default 300 s), or on SIGTERM/SIGINT/SIGHUP,
SIGKILLing its workers' process groups; each worker also has a parent-death SIGKILL.

Two sides: :func:`ensure` runs in the task (or the driver) and starts a pool when none
lives for this key; :func:`serve` is the pool process itself.
"""
from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

MAGIC = b"TSPW"
VERSION = 1
MAX_PAYLOAD = 8 << 20
HEADER = struct.Struct(">4sIII")
REPLY = struct.Struct(">ci")
FN_RUNNER = "torchspark.worker._fn_runner"
DEFAULT_IDLE_S = 300.0
READY_TIMEOUT_S = 10.0
SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, NUL excluded)
REQUEST_TIMEOUT_S = 2.0  # for a whole request: a shim sends it in one go on connecting
SO_PEERPIDFD = 77  # Linux 6.5: a pidfd of the process that connected (no pid reuse race)

# The variables that differ between runs or ranks of one pool's life (docs/protocol.md §6):
# the agent sets them per worker (CUDA_*: with --gpus), the glue per job, a shell in front
# of the agent (a site's wrapper script: TORCHSPARK_RUN) its own bookkeeping (PWD, OLDPWD,
# SHLVL, _; the request carries the working directory itself); nothing reads them at
# `import torch` (CUDA reads its own at its initialization, in the worker).
PER_RUN = frozenset((
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
    "NCCL_COMM_ID", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PWD", "OLDPWD", "SHLVL", "_",
    # train_on_dataframe's partition, per task (stock's names, torchspark.task._partition)
    "SPARK_PARTITION_ARROW_DATA_FILE", "SPARK_DATAFRAME_SCHEMA_FILE",
))
PER_RUN_PREFIXES = ("TORCHELASTIC_", "TORCHSPARK_")


def per_run(name: str) -> bool:
    return name in PER_RUN or name.startswith(PER_RUN_PREFIXES)


def stable_env(env: Dict[str, str]) -> Dict[str, str]:
    """env without the per-run variables: what a pool's interpreter state depends on."""
    return {k: v for k, v in env.items() if not per_run(k)}


def pool_dir() -> Optional[str]:
    """${TMPDIR:-/tmp}/torchspark-warm-UID (/tmp when TMPDIR is too long for a socket's
    path), created 0700; None when it exists but is not a directory of ours that only we can
    use (then there is no pool, and runs exec)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(base, f"torchspark-warm-{os.geteuid()}")
    if len(os.fsencode(path)) + len("/0123456789abcdef0123456789abcdef.sock") > SUN_PATH_MAX:
        path = f"/tmp/torchspark-warm-{os.geteuid()}"  # a socket's path has 107 bytes
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return path


def _proc_stat(pid: int) -> Optional[Tuple[int, str]]:
    """(parent pid, start time in clock ticks) of pid from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[1]), fields[19].decode()


def executor_anchor() -> int:
    """The executor JVM this task's Python worker runs under (the nearest `java` ancestor),
    else the worker's parent (PySpark's daemon, which ends with the JVM)."""
    pid = os.getppid()
    while pid > 1:
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            exe = ""
        if exe == "java":
            return pid
        st = _proc_stat(pid)
        if st is None:
            break
        pid = st[0]
    return os.getppid()


def pool_key(python: str, anchor: int, env: Dict[str, str]) -> str:
    """What a pool's state depends on, hashed (docs/protocol.md §6)."""
    st = _proc_stat(anchor)
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = "?"
    h = hashlib.sha256()
    for part in (os.path.realpath(python), str(anchor), st[1] if st else "?", netns):
        h.update(part.encode() + b"\0")
    for k, v in sorted(stable_env(env).items()):
        h.update(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()[:32]


def worker_env(env: Dict[str, str], nproc_per_node: int) -> Dict[str, str]:
    """env with what the agent adds to every worker and a pool cannot take per request
    (native/src/agent/topo.c: OMP_NUM_THREADS=1 with more than one process per node, unset)."""
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
        return {**env, "OMP_NUM_THREADS": "1"}
    return env


_started: List[Any] = []  # the pools this process started (Popen objects, never waited)


def ensure(env: Dict[str, str], nproc_per_node: int, anchor: int,
           idle_s: float = DEFAULT_IDLE_S, clients: Optional[int] = None) -> Optional[str]:
    """The socket of the pool for env (the agent's environment), starting one when none
    lives; None when no pool can be used here (the agent then starts workers as usual).
    A pool being started by someone else meanwhile is returned too: its shim waits.
    clients: the process whose descendants the pool serves (default: the anchor, whose
    descendants the executor's agents are; a test's own process for a pool alone)."""
    import subprocess

    _started[:] = [p for p in _started if p.poll() is None]  # reap the pools that ended
    d = pool_dir()
    if d is None:
        return None
    wenv = worker_env(env, nproc_per_node)
    key = pool_key(sys.executable, anchor, wenv)
    sock = os.path.join(d, key + ".sock")
    fd, locked = _take_lock(os.path.join(d, key + ".lock"), sock)
    r = w = -1
    try:
        if not locked:  # a pool serves there (False), or none did in time (None)
            return sock if locked is False else None
        try:
            os.unlink(sock)  # a dead pool's
        except FileNotFoundError:
            pass
        r, w = os.pipe()
        with open(os.path.join(d, key + ".log"), "wb") as log:
            p = subprocess.Popen(
                [sys.executable, "-u", "-c", "from torchspark.worker._warm import main; main()",
                 sock, str(fd), str(w), str(anchor), repr(float(idle_s)),
                 str(anchor if clients is None else clients)],
                env=stable_env(wenv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=log, pass_fds=(fd, w), start_new_session=True, cwd="/")
        _started.append(p)
        os.close(w)
        w = -1
        import select

        ready, _, _ = select.select([r], [], [], READY_TIMEOUT_S)
        if not ready or os.read(r, 1) != b"1":
            p.kill()
            return None
        return sock
    finally:
        for x in (fd, r, w):
            if x >= 0:
                os.close(x)


def ensure_quietly(env: Dict[str, str], nproc: int, anchor: int, idle_s: float) -> Optional[str]:
    """The socket of this executor's warm worker pool (ensure), started when
    none lives; None (workers start as usual) when no pool can be had, said on stderr."""
    try:
        return ensure(env, nproc, anchor, idle_s)
    except Exception as e:  # never a reason to fail a run
        sys.stderr.write(f"torchspark: no warm worker pool on this executor ({e}); the "
                         "training processes start a fresh Python\n")
        return None


def _take_lock(lock: str, sock: str) -> Tuple[int, Optional[bool]]:
    """KEY.lock opened and flocked: (fd, True) when taken (no pool lives); (fd, False) when
    a pool holds it and serves on sock; (fd, None) when none did in READY_TIMEOUT_S. The
    caller closes fd."""
    import fcntl

    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # A pool holds the lock: it serves once its socket exists (a starting pool
            # binds first; an ending one unlinks it, then exits).
            if os.path.exists(sock):
                return fd, False
            if time.monotonic() > deadline:
                return fd, None
            time.sleep(0.01)
            continue
        if _same_file(fd, lock):
            return fd, True
        os.close(fd)  # the pool that held it ended and removed the file (_forget): anew
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


# ---- the pool process ------------------------------------------------------------------


def _until(conn: socket.socket, deadline: Optional[float]) -> None:
    """The socket's timeout: what is left of deadline (socket.timeout once it passed)."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"no whole request within {REQUEST_TIMEOUT_S:g} s")
        conn.settimeout(left)


def _recv_exact(conn: socket.socket, n: int, deadline: Optional[float] = None) -> bytes:
    buf = b""
    while len(buf) < n:
        _until(conn, deadline)
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the shim closed the connection mid-request")
        buf += chunk
    return buf


def read_request(conn: socket.socket, deadline: Optional[float] = None
                 ) -> Tuple[str, List[str], Dict[str, str], List[int]]:
    """(cwd, argv, env, [fd0, fd1, fd2]); ValueError for a malformed request (its
    descriptors closed). deadline (time.monotonic()): for the whole request, so that a peer
    that drips bytes holds the single-threaded pool that long at most."""
    _until(conn, deadline)
    data, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    try:
        if len(data) < HEADER.size:
            data += _recv_exact(conn, HEADER.size - len(data), deadline)
        magic, version, length, nfds = HEADER.unpack(data)
        if magic != MAGIC or version != VERSION or nfds != 3 or len(fds) != 3:
            raise ValueError(f"bad header {data!r} with {len(fds)} descriptors")
        if length > MAX_PAYLOAD:
            raise ValueError(f"payload of {length} bytes")
        parts = _recv_exact(conn, length, deadline).split(b"\0")
        if parts[-1] != b"" or len(parts) < 3:
            raise ValueError("payload not NUL-terminated")
        parts.pop()
        strs = [p.decode("utf-8", "surrogateescape") for p in parts]
        cwd, argc = strs[0], int(strs[1])
        if argc < 1 or 2 + argc > len(strs):
            raise ValueError(f"argc {argc}")
        argv = strs[2:2 + argc]
        env: Dict[str, str] = {}
        for kv in strs[2 + argc:]:
            k, sep, v = kv.partition("=")
            if not sep:
                raise ValueError(f"environment entry without '=': {kv!r}")
            env.setdefault(k, v)
        return cwd, argv, env, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


_boot_cache: Dict[Tuple[int, int, int], bytes] = {}


def _agent_boot(exe: str, boot: str) -> bool:
    """Whether boot is one of the bootstraps compiled into exe (the shim's executable,
    torchspark-run: native/src/agent/pyboot.c), as a whole C string."""
    try:
        with open(exe, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_mtime_ns)
            if key not in _boot_cache:
                _boot_cache.clear()
                _boot_cache[key] = f.read(64 << 20)
    except OSError:
        return False
    needle = b"\0" + boot.encode("utf-8", "surrogateescape") + b"\0"
    return len(needle) > 64 and needle in _boot_cache[key]


def refusal(argv: List[str], env: Dict[str, str], base_env: Dict[str, str],
            agent_exe: Optional[str] = None) -> Optional[str]:
    """Why this pool cannot run the request (docs/protocol.md §6), or None. agent_exe: the
    peer's executable (/proc/PID/exe), which must hold BOOT; None: not checked."""
    try:
        same_python = os.path.samefile(argv[0], sys.executable)
    except OSError:
        same_python = False
    if not same_python:
        return f"another Python ({argv[0]}; the pool runs {sys.executable})"
    if len(argv) < 6 or argv[1] != "-u" or argv[2] != "-c" or argv[4:6] != ["-m", FN_RUNNER]:
        return "not a function-mode worker (python -u -c BOOT -m torchspark.worker._fn_runner ...)"
    if agent_exe is not None and not _agent_boot(agent_exe, argv[3]):
        return "BOOT is not the bootstrap of the agent's own executable"
    want, got = stable_env(base_env), stable_env(env)
    for k in sorted(set(want) | set(got)):
        if want.get(k) != got.get(k):
            return f"the environment differs in {k}"
    return None


class _Worker:
    __slots__ = ("pid", "conn", "status")

    def __init__(self, pid: int, conn: Optional[socket.socket]) -> None:
        self.pid = pid
        self.conn = conn
        self.status: Optional[int] = None


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _peer_pidfd(conn: socket.socket) -> int:
    """A pidfd of the process that connected: SO_PEERPIDFD (Linux 6.5+) names exactly that
    process; older kernels: pidfd_open of SO_PEERCRED's pid, which a peer that exited at
    once could leave to a new process (the residual race, docs/protocol.md §6)."""
    try:
        return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return os.pidfd_open(struct.unpack("3i", creds)[0])


def _pidfd_pid(fd: int) -> int:
    """The pid a pidfd refers to; -1 once that process has exited."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for ln in f:
            if ln.startswith("Pid:"):
                return int(ln.split()[1])
    return -1


def _descends(pid: int, root: int, root_start: Optional[str]) -> bool:
    """Whether pid is root or below it (parents from /proc/PID/stat; root by its start
    time, so that a reused pid is not it)."""
    for _ in range(4096):
        st = _proc_stat(pid)
        if st is None:
            return False
        if pid == root:
            return st[1] == root_start
        if pid <= 1:
            return False
        pid = st[0]
    return False


def peer_refusal(conn: socket.socket, root: int, root_start: Optional[str]
                 ) -> Tuple[Optional[str], Optional[str]]:
    """(why the peer may not use this pool or None, its executable): it must run as our
    user and descend from root (the pool's clients: the executor's agents). The peer is
    held by a pidfd across the check: still alive after it, the /proc entries read were its
    own."""
    if _peer_uid(conn) != os.geteuid():
        return "another user", None
    fd = _peer_pidfd(conn)
    try:
        pid = _pidfd_pid(fd)
        ok = pid > 0 and _descends(pid, root, root_start)
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = None
        if _pidfd_pid(fd) != pid:
            return "a peer that exited during the check", None
        if not ok:
            return f"pid {pid} does not descend from the pool's clients (pid {root})", None
        return None, exe
    finally:
        os.close(fd)


POOL_COMM = "tsp-warm-pool"  # the pool's /proc/PID/comm; its workers get a fresh one's


def _prctl(option: int, arg: Any) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def _set_comm(name: str) -> None:
    PR_SET_NAME = 15
    _prctl(PR_SET_NAME, name.encode()[:15])


def _become_worker(cwd: str, argv: List[str], env: Dict[str, str], fds: List[int],
                   close: List[int], pool_pid: int) -> None:
    """In the forked child: become `python -u -c BOOT -m torchspark.worker._fn_runner ...` as a
    fresh interpreter would be, then run BOOT (which never returns)."""
    import builtins
    import io
    import signal
    import types

    code = 1
    try:
        os.setsid()
        PR_SET_PDEATHSIG = 1
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != pool_pid:
            os._exit(128 + signal.SIGKILL)
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _set_comm(os.path.basename(argv[0]))  # as the exec of argv[0] would name it
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        # The standard streams as `python -u` makes them: binary layers unbuffered.
        # (typeshed: sys.__std*__ are Final and may be None; a pool has all three.)
        enc_out, err_out = sys.__stdout__.encoding, sys.__stdout__.errors  # type: ignore[union-attr]
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(  # type: ignore[misc]
            io.BufferedReader(io.FileIO(0, "r", closefd=False)),
            encoding=sys.__stdin__.encoding, errors=sys.__stdin__.errors)  # type: ignore[union-attr]
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(  # type: ignore[misc]
            io.FileIO(1, "w", closefd=False), encoding=enc_out, errors=err_out,
            write_through=True)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
            io.FileIO(2, "w", closefd=False), encoding=enc_out, errors="backslashreplace",
            write_through=True)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed()  # fresh entropy, as a new interpreter's global generator has
        main_mod = types.ModuleType("__main__")
        main_mod.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main_mod
        sys.argv = ["-c", *argv[4:]]
        sys.orig_argv = list(argv)
        boot = compile(argv[3], "<string>", "exec")
        exec(boot, main_mod.__dict__)  # BOOT ends the process itself
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


def serve(sock_path: str, lock_fd: int, ready_fd: int, anchor: int, idle_s: float,
          clients: Optional[int] = None) -> None:
    """The pool process: bind, say ready, import, then fork workers on request (to peers
    that descend from clients, by default the anchor)."""
    import selectors
    import signal

    base_env = dict(os.environ)
    _set_comm(POOL_COMM)
    PR_SET_CHILD_SUBREAPER = 36  # a worker's orphans come back here, not to init
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop = []
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(1))
    root = anchor if clients is None else clients
    root_stat = _proc_stat(root)
    client_root = (root, root_stat[1] if root_stat else None)
    try:
        anchor_fd = os.pidfd_open(anchor)
    except OSError:
        os.write(ready_fd, b"0")
        return
    old = os.umask(0o077)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    os.umask(old)
    listener.listen(64)
    sock_ino = os.stat(sock_path).st_ino
    os.write(ready_fd, b"1")
    os.close(ready_fd)

    # What a training process would import first; nothing here may start a Python thread
    # (the pool forks) or initialize CUDA (workers initialize their own). The one native
    # thread these imports start is numpy's OpenBLAS server, which stops its threads
    # before a fork and starts them again in the child (its pthread_atfork handlers), as
    # every forking DataLoader relies on.
    t0 = time.monotonic()
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    try:
        # The first optimizer a training process makes imports torch._dynamo (through
        # torch._disable_dynamo): measured 1-8 s by itself on the 2-core test machine,
        # as long as `import torch` again; a restarted attempt pays it at every restart.
        import torch._dynamo  # noqa: F401
    except Exception:  # an older or trimmed torch: the worker imports what it needs
        pass
    from torchspark.worker import _cloudpickle

    _cloudpickle.load()
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    # torch 2.4 names the thread that imports it pt_main_thread (pytorch#121170, undone in
    # 2.5), which on the main thread is the process's comm: the pool's name again.
    _set_comm(POOL_COMM)
    import threading

    if threading.active_count() != 1:
        sys.stderr.write(f"torchspark warm pool: {threading.active_count()} threads after "
                         "the imports; a pool must not fork with threads, ending\n")
        _shutdown(listener, sock_path, sock_ino, {})
        return
    # What the imports put in the environment: a fresh worker's imports would too.
    added = {k: v for k, v in os.environ.items() if base_env.get(k) != v}
    import gc

    gc.freeze()  # fewer copy-on-write pages in the workers
    sys.stderr.write(f"torchspark warm pool {os.getpid()}: serving {sock_path} for "
                     f"{sys.executable}, anchor {anchor}, idle timeout {idle_s:g} s; the "
                     f"imports took {time.monotonic() - t0:.2f} s\n")

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(anchor_fd, selectors.EVENT_READ, "anchor")
    workers: Dict[int, _Worker] = {}
    last_busy = time.monotonic()
    pool_pid = os.getpid()
    while not stop:
        timeout = None if workers else max(0.0, last_busy + idle_s - time.monotonic())
        if not workers and timeout == 0:
            break
        events = sel.select(timeout)
        for sk, _ in events:
            what = sk.data
            if what == "wake":
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                _reap(workers, sel)
            elif what == "anchor":
                stop.append(1)
            elif what == "accept":
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                conn.set_inheritable(False)
                close = [listener.fileno(), wake_r, wake_w, anchor_fd, lock_fd, conn.fileno(),
                         sel.fileno()]
                close += [w.conn.fileno() for w in workers.values() if w.conn is not None]
                w = _serve_request(conn, base_env, added, close, pool_pid, client_root)
                if w is not None:
                    workers[w.pid] = w
                    sel.register(conn, selectors.EVENT_READ, w)
                else:
                    conn.close()
            else:  # a shim's message: K + signal, or its end
                w = what
                try:
                    msg = w.conn.recv(REPLY.size)
                except OSError:
                    msg = b""
                if 0 < len(msg) < REPLY.size:
                    try:
                        msg += _recv_exact(w.conn, REPLY.size - len(msg))
                    except OSError:
                        msg = b""
                if len(msg) == REPLY.size and msg[:1] == b"K":
                    sig = REPLY.unpack(msg)[1]
                    if w.status is None and _can_take(w.pid, sig):
                        try:
                            os.killpg(w.pid, sig)
                        except OSError:
                            pass
                    continue
                sel.unregister(w.conn)
                w.conn.close()
                w.conn = None
                if w.status is None:
                    try:
                        os.killpg(w.pid, signal.SIGKILL)
                    except OSError:
                        pass
        if workers:
            last_busy = time.monotonic()
        _reap(workers, sel)
    _shutdown(listener, sock_path, sock_ino, workers)
    _forget(sock_path, lock_fd)


def _forget(sock_path: str, lock_fd: int) -> None:
    """A pool that ended as it should leaves nothing in the pool directory (the anchor's pid
    is part of its key: nobody reuses it after the executor): its lock file, removed while
    the pool still holds the lock (a starter that opened it before locks anew, ensure's
    _same_file), and its log. A pool ended on an error keeps its log."""
    base = sock_path[:-len(".sock")]
    try:
        if _same_file(lock_fd, base + ".lock"):
            os.unlink(base + ".lock")
            os.unlink(base + ".log")
    except OSError:
        pass


def _can_take(pid: int, sig: int) -> bool:
    """False for the flight-recorder signal (SIGRTMIN+9, docs/protocol.md 1.9) to a worker
    that does not block it yet (its bootstrap has not run): its default action would end
    it. Every other signal: True."""
    import signal
    if sig != signal.SIGRTMIN + 9:
        return True
    try:
        with open(f"/proc/{pid}/status") as f:
            blk = next(ln for ln in f if ln.startswith("SigBlk:"))
        return bool(int(blk.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, StopIteration, ValueError):
        return False


def _refuse(conn: socket.socket, why: str) -> None:
    sys.stderr.write(f"torchspark warm pool: refused a request: {why}\n")
    msg = why.encode()
    try:
        conn.sendall(REPLY.pack(b"R", len(msg)) + msg)
    except OSError:
        pass


def _serve_request(conn: socket.socket, base_env: Dict[str, str], added: Dict[str, str],
                   close: List[int], pool_pid: int, clients: Tuple[int, Optional[str]]
                   ) -> Optional[_Worker]:
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    try:
        why, exe = peer_refusal(conn, *clients)
        if why is not None:  # before reading a byte of what it sends
            _refuse(conn, why)
            return None
        cwd, argv, env, fds = read_request(conn, deadline)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"torchspark warm pool: a bad request ({e})\n")
        return None
    try:
        why = refusal(argv, env, base_env, exe or "")
        if why is not None:
            _refuse(conn, why)
            return None
        pid = os.fork()
        if pid == 0:
            _become_worker(cwd, argv, {**env, **added}, fds, close, pool_pid)
    except OSError as e:
        sys.stderr.write(f"torchspark warm pool: {e}\n")
        return None
    finally:
        for fd in fds:
            os.close(fd)
    try:
        conn.sendall(REPLY.pack(b"P", pid))
        conn.settimeout(None)
        return _Worker(pid, conn)
    except OSError:  # the shim is gone (it died by a signal before P): so is its worker
        import signal

        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return None  # reaped with the others


def _reap(workers: Dict[int, _Worker], sel: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        w = workers.pop(pid, None)
        try:  # what the worker left in its process group ends with it, as under the agent
            os.killpg(pid, 9)
        except OSError:
            pass
        if w is None or w.conn is None:
            continue
        w.status = status
        try:
            w.conn.sendall(REPLY.pack(b"X", status))
        except OSError:
            pass
        sel.unregister(w.conn)
        w.conn.close()


def _shutdown(listener: socket.socket, sock_path: str, sock_ino: int,
              workers: Dict[int, _Worker]) -> None:
    import signal

    for w in workers.values():
        try:
            os.killpg(w.pid, signal.SIGKILL)
        except OSError:
            pass
    me = os.getpid()
    for name in os.listdir("/proc"):  # and what was left to us as the subreaper
        st = _proc_stat(int(name)) if name.isdigit() else None
        if st is not None and st[0] == me:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    try:
        if os.stat(sock_path).st_ino == sock_ino:
            os.unlink(sock_path)
    except OSError:
        pass
    listener.close()


def main() -> None:
    sock_path, lock_fd, ready_fd, anchor, idle_s = sys.argv[1:6]
    clients = int(sys.argv[6]) if len(sys.argv) > 6 else None
    serve(sock_path, int(lock_fd), int(ready_fd), int(anchor), float(idle_s), clients)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no finalization (torch's, as in _fn_runner); the lock goes with us
