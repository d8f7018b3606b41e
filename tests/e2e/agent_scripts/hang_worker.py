"""A gloo job where one rank hangs (the hang doctor's tests and bench/hang_bench.py).

    hang_worker.py KIND VICTIM [PIDDIR]

Every rank joins a gloo group and does one all_reduce that works; then rank VICTIM hangs
(KIND: sleep before the collective, sigstop itself, deadlock on a Python lock, spin in an
endless loop) while the others enter the next all_reduce and wait for it. With PIDDIR each
rank writes its pid there (TSP_HANG_BEAT=S or beat=S: a line every S s until the first one: _beat).
Also imported: train(kind, victim, piddir, hold), in function mode (hold: the sleep, 1 h).
"""
import os
import sys
import threading
import time


def sleeps_before_the_collective(hold):
    time.sleep(hold)  # HANG-SLEEP


def deadlocks_on_a_lock(hold):
    lock = threading.Lock()
    lock.acquire()
    threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
    lock.acquire()  # HANG-LOCK


def spins_forever(hold):
    x = 0
    while x >= 0:  # HANG-LOOP
        x = (x + 1) % 1000


def stops_itself(hold):
    import signal

    os.kill(os.getpid(), signal.SIGSTOP)  # HANG-SIGSTOP


KINDS = {"sleep": sleeps_before_the_collective, "lock": deadlocks_on_a_lock,
         "loop": spins_forever, "sigstop": stops_itself}


def _beat(every):
    """Prints a line every `every` s until the returned event is set (TSP_HANG_BEAT): each
    restarts the hang doctor's clock, so that the planned hang is the only silence. A start
    under load (python, import torch, init_process_group's TCPStore connect and its retry
    delays) can be silent for longer than a short hangTimeout, and the doctor rightly names
    that first: "every rank waits in the same collective (ranks 0-1 wait in
    init_process_group)" in a fresh-clone run of test_jvm_runner (hangTimeout 3s)."""
    done = threading.Event()

    def run():
        while not done.wait(every):
            print(f"rank {os.environ.get('RANK')} is starting", flush=True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return done, t


def train(kind, victim, piddir=None, hold=3600, beat=None):
    beat = beat or os.environ.get("TSP_HANG_BEAT")
    beating = _beat(float(beat)) if beat else None
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if piddir:
        with open(os.path.join(piddir, f"rank{rank}"), "w") as f:
            f.write(str(os.getpid()))
    t = torch.ones(4)
    dist.all_reduce(t)  # a collective that works: every rank is in
    print(f"rank {rank} passed the first all_reduce", flush=True)
    if beating:
        beating[0].set()
        beating[1].join()
    if rank == victim:
        KINDS[kind](hold)
    dist.all_reduce(t)  # HANG-WAIT
    dist.destroy_process_group()
    return rank


def train_silent(victim, hold=3600):
    """Hangs before anything is printed: rank VICTIM sleeps before the first collective
    while the others wait in it (the most common hang: the job's first collective)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == victim:
        sleeps_before_the_collective(hold)
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()
    return rank


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
