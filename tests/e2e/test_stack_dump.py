"""The hang doctor's first piece: every Python worker that torchspark-run starts through its
bootstrap (native/src/agent/pyboot.c) prints every thread's Python stack on its stderr when it gets
SIGRTMIN+8, and goes on; user code sees no handler (signal.getsignal, faulthandler). On
SIGRTMIN+9 the bootstrap's thread writes torch's flight recorder's collectives (or why
there are none) and the worker goes on."""
import os
import re
import signal
import textwrap
import time

from tests.helpers.agentutil import PY, base_env, finish, new_marker, start, survivors, tsr_cmd

WORKER = textwrap.dedent("""
    import ctypes, errno, faulthandler, os, signal, sys, threading, time
    print("handler", signal.getsignal(signal.SIGRTMIN + 8) is signal.SIG_DFL,
          faulthandler.is_enabled(), flush=True)
    lock = threading.Lock()
    lock.acquire()

    def helper_waits_on_the_lock():
        lock.acquire()

    threading.Thread(target=helper_waits_on_the_lock, daemon=True).start()

    libc = ctypes.CDLL(None, use_errno=True)

    def stuck_in_a_sleep(path):
        # poll(2), which no signal handler restarts, as torch's own waits (torch 2.4's
        # TCPStore gives up on its EINTR): a dump must not interrupt it
        open(path, "w").close()
        deadline, eintr = time.monotonic() + 6, 0
        while time.monotonic() < deadline:
            eintr += libc.poll(None, 0, 50) < 0 and ctypes.get_errno() == errno.EINTR
        return eintr

    eintr = stuck_in_a_sleep(os.path.join(sys.argv[1], f"pid{os.environ['RANK']}_{os.getpid()}"))
    print("went on", os.environ["RANK"], "interrupted", eintr, flush=True)
""")


def test_sigrtmin8_dumps_all_threads_and_the_worker_goes_on(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    marker = new_marker()
    p = start(tsr_cmd("--standalone", "--nproc-per-node=2", "--python", PY, str(script),
                      str(tmp_path)), base_env(marker))
    deadline = time.monotonic() + 60
    pids = []
    while len(pids) < 2 and time.monotonic() < deadline:
        pids = [int(f.name.split("_")[1]) for f in tmp_path.glob("pid*_*")]
        time.sleep(0.05)
    assert len(pids) == 2, "the workers did not start"
    time.sleep(0.3)  # both threads are in their waits
    for pid in pids:
        os.kill(pid, signal.SIGRTMIN + 8)
    # the flight-recorder signal: blocked, and answered by the bootstrap's thread (this
    # worker has no torch.distributed: it says so); the worker goes on
    with open(f"/proc/{pids[0]}/status") as f:
        blk = int(next(ln for ln in f if ln.startswith("SigBlk:")).split()[1], 16)
    assert blk >> (signal.SIGRTMIN + 8) & 1, hex(blk)
    os.kill(pids[0], signal.SIGRTMIN + 9)
    r = finish(p, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert out.count("handler True False") == 2, out[-3000:]  # invisible to user code
    assert out.count("went on") == 2, out[-3000:]  # the dump did not stop the worker
    # nor interrupt its main thread: the bootstrap's thread alone takes SIGRTMIN+8 (a
    # DUMP in init_process_group killed rank 1 of a JVM hang-doctor test under torch 2.4.1:
    # "DistNetworkError: Interrupted system call")
    assert len(re.findall(r"went on \d interrupted 0\b", out)) == 2, out[-3000:]
    # Each worker: its main thread in stuck_in_a_sleep, the helper in the lock, all threads.
    assert len(re.findall(r'File ".*w\.py", line \d+ in stuck_in_a_sleep', out)) == 2, out
    assert len(re.findall(r'File ".*w\.py", line \d+ in helper_waits_on_the_lock', out)) == 2, out
    assert len(re.findall(r"Current thread 0x[0-9a-f]+ \(most recent call first\)", out)) == 2
    assert out.count("torchspark: flight recorder: not available (torch.distributed is not "
                     "initialized)") == 1, out[-3000:]
    assert survivors(marker) == []
