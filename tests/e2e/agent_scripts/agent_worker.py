"""A worker program for the torchspark-run end-to-end tests: `agent_worker.py MODE OUTDIR ...`.

It stays free of `import torch` (except in the `record` mode) so that workers start in tens of
milliseconds. Each mode writes what it saw into OUTDIR, named by rank, for the test to read:
  env       dump os.environ, argv and the interpreter as JSON (env.<RANK>.json)
  fail      local rank FAILRANK exits with CODE once every worker is up (FLAGS "now": at
            once); the others sleep (FLAGS "stubborn": ignoring SIGTERM)
  selfkill  local rank 1 kills itself with SIGNAL (default SIGKILL) once every worker is up;
            the others sleep
  orphans   every worker leaves two SIGTERM-ignoring descendants (one in its process group,
            one double-forked into its own session); local rank FAILRANK then exits 1
            (-1: none does), the others sleep
  signals   record SIGUSR1/USR2/TERM/INT/HUP/QUIT; exit 0 after SIGUSR1, die by the
            default action on the terminating ones
  restart   append TORCHELASTIC_RESTART_COUNT; local rank 0 exits 1 while it is < N (once
            the others appended theirs: the failure stops the whole group); in
            attempt 0 it leaves a SIGTERM-ignoring daemon, later attempts note it if alive
  record    under torch's @record, local rank 1 raises ValueError(MESSAGE); the others sleep
  sleep     sleep SECONDS
"""
import json
import os
import signal
import sys
import time

mode, out = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]
rank = os.environ.get("RANK", "x")
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
nlocal = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def put(name: str, text: str = "") -> None:
    """Writes OUTDIR/name atomically so a polling reader never sees a partial file."""
    tmp = os.path.join(out, f".{name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


def _lines(name: str) -> list:
    """OUTDIR/name's lines, newline kept ([] while it does not exist)."""
    try:
        with open(os.path.join(out, name)) as f:
            return f.readlines()
    except FileNotFoundError:
        return []


def ready() -> None:
    put(f"ready.{local_rank}", str(os.getpid()))


def wait_all_ready(timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(out, f"ready.{i}")) for i in range(nlocal)):
            return
        time.sleep(0.01)


def sleep_forever(seconds: float = 60.0) -> None:
    time.sleep(seconds)
    sys.exit(0)


def ignore_term_child(new_session: bool) -> None:
    """Forks a descendant that ignores SIGTERM and sleeps; with new_session it double-forks
    and calls setsid, escaping the worker's process group (as a daemonizing library does)."""
    pid = os.fork()
    if pid:
        if new_session:
            os.waitpid(pid, 0)  # the intermediate exits at once: the grandchild is reparented
        return
    if new_session:
        os.setsid()
        if os.fork():
            os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tag = "session" if new_session else "group"
    put(f"desc.{tag}.{local_rank}", str(os.getpid()))
    time.sleep(120)
    os._exit(0)


if mode == "env":
    put(f"env.{rank}.json", json.dumps({"env": dict(os.environ), "argv": sys.argv,
                                        "exe": sys.executable, "pid": os.getpid()}))

elif mode == "fail":
    fail_rank, code = int(rest[0]), int(rest[1])
    flags = rest[2:]
    if "stubborn" in flags and local_rank != fail_rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    put(f"pid.{local_rank}", str(os.getpid()))
    ready()
    if local_rank == fail_rank:
        if "now" not in flags:
            wait_all_ready()
        sys.exit(code)
    sleep_forever()

elif mode == "selfkill":
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file for SIGSEGV/SIGABRT
    put(f"pid.{local_rank}", str(os.getpid()))
    ready()
    if local_rank == 1:
        wait_all_ready()
        sig = getattr(signal, rest[0] if rest else "SIGKILL")
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)  # Python handles SIGSEGV/SIGABRT otherwise
        os.kill(os.getpid(), sig)
    sleep_forever()

elif mode == "orphans":
    ignore_term_child(new_session=False)
    ignore_term_child(new_session=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    deadline = time.monotonic() + 30
    while not (os.path.exists(os.path.join(out, f"desc.group.{local_rank}"))
               and os.path.exists(os.path.join(out, f"desc.session.{local_rank}"))):
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.01)
    ready()
    if local_rank == int(rest[0]):
        wait_all_ready()
        sys.exit(1)
    sleep_forever()

elif mode == "signals":
    def on_signal(signum, _frame):
        name = signal.Signals(signum).name
        put(f"sig.{local_rank}.{name}", str(os.getpid()))
        if signum == signal.SIGUSR1:
            sys.exit(0)
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
              signal.SIGQUIT):
        signal.signal(s, on_signal)
    ready()
    for _ in range(600):
        time.sleep(0.1)
    sys.exit(5)

elif mode == "restart":
    n = int(rest[0])
    count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with open(os.path.join(out, f"restarts.{local_rank}"), "a") as f:
        f.write(f"{count}\n")
    if not os.environ["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_{count}/{local_rank}/error.json"):
        put(f"bad-error-file.{count}.{local_rank}", os.environ["TORCHELASTIC_ERROR_FILE"])
    daemon = os.path.join(out, "desc.session.0")
    if local_rank == 0 and count == 0:
        ignore_term_child(new_session=True)  # a stray the restart must not leave behind
        while not os.path.exists(daemon):
            time.sleep(0.01)
    elif local_rank == 0 and os.path.exists(f"/proc/{int(open(daemon).read())}/stat"):
        with open(f"/proc/{int(open(daemon).read())}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                put(f"stray-alive.{count}")
    if local_rank == 0 and count < n:
        # The others' line of this attempt first: the agent stops the whole group at once
        # when this worker fails, and a worker still starting Python under load would lose
        # its line (a 0.2 s sleep raced it: restarts.1 was '1\n2\n' in a fresh-clone run).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                f"{count}\n" in _lines(f"restarts.{i}") for i in range(1, nlocal)):
            time.sleep(0.01)
        sys.exit(1)
    sys.exit(0)

elif mode == "record":
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main() -> None:
        put(f"pid.{local_rank}", str(os.getpid()))
        ready()
        if local_rank == 1:
            wait_all_ready()
            raise ValueError(rest[0])
        sleep_forever()

    main()

elif mode == "sleep":
    ready()
    time.sleep(float(rest[0]))

else:
    sys.exit(f"agent_worker.py: unknown mode {mode!r}")
