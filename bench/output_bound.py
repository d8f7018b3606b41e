"""What bounds rank 0's output through run() on this machine: the CPU seconds each step of
the path costs per GiB, measured here one step at a time, and the GB/s that all cores could
give if they did nothing else.

    .venv/bin/python -m bench.output_bound [--runs 3] [--out-mib 512]

One core, in this process: memcpy into pages already touched and into fresh ones (the
kernel zeroes each first), SHA-256 (hashlib: OpenSSL's, as the C core's), AES-128-GCM
(`openssl speed -evp aes-128-gcm`, 16 KiB blocks: a TLS record), the worker's
cloudpickle.dump of the bytes to a file (the first dump into pages new to the machine, and
again into the pages just freed) and the driver's cloudpickle.loads from a
memoryview (bench/encryption_bench.py's big_output is what run() returns). The channel:
tsp_output_send to a LogServer in this process (both ends here, encryption on and off),
its CPU seconds per GiB (bench/logchannel_bench.ship_native). The bound: the CPU seconds
of worker + channel + driver per GiB, spread over every core of the machine with nothing
else running; the real path also waits (the worker's exit, the Spark job's end)."""
import ctypes
import mmap
import os
import re
import subprocess
import tempfile
import time

from bench import harness
from bench import logchannel_bench as lcb

GIB = 1 << 30


def cpu_s(fn) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def memcpy_warm(n: int) -> float:
    src, dst = bytearray(os.urandom(1 << 20) * (n >> 20)), bytearray(n)
    ctypes.memmove((ctypes.c_char * n).from_buffer(dst), (ctypes.c_char * n).from_buffer(src), n)
    t = cpu_s(lambda: ctypes.memmove((ctypes.c_char * n).from_buffer(dst),
                                     (ctypes.c_char * n).from_buffer(src), n))
    return t * GIB / n


def memcpy_fresh(n: int) -> float:
    src = bytearray(os.urandom(1 << 20) * (n >> 20))
    m = mmap.mmap(-1, n)  # untouched: every page faults and is zeroed on its first write
    t = cpu_s(lambda: ctypes.memmove((ctypes.c_char * n).from_buffer(m),
                                     (ctypes.c_char * n).from_buffer(src), n))
    m.close()
    return t * GIB / n


def sha256(n: int) -> float:
    import hashlib
    data = os.urandom(1 << 20) * (n >> 20)
    return cpu_s(lambda: hashlib.sha256(data).digest()) * GIB / n


def aes_gcm() -> float:
    """CPU s per GiB of AES-128-GCM on 16 KiB blocks (openssl speed, user time)."""
    out = subprocess.run(["openssl", "speed", "-elapsed", "-seconds", "2", "-bytes", "16384",
                          "-evp", "aes-128-gcm"], capture_output=True, text=True).stdout
    m = re.search(r"^aes-128-gcm\s+([\d.]+)k", out, re.M | re.I)
    return GIB / (float(m.group(1)) * 1000) if m else float("nan")


def pickle_steps(n: int, tmp: str):
    import cloudpickle
    data = (time.time(), os.urandom(1 << 20) * (n >> 20))
    path = os.path.join(tmp, "out.pkl")

    def dump():
        with open(path, "wb") as f:
            cloudpickle.dump(data, f)
    first_s = cpu_s(dump)  # pages new to this VM: the kernel (and the host) back each first
    os.unlink(path)
    dump_s = cpu_s(dump)  # steady state: the page cache reuses the pages just freed
    with open(path, "rb") as f:
        buf = f.read()
    os.unlink(path)
    view = memoryview(buf)
    load_s = cpu_s(lambda: cloudpickle.loads(view))
    return first_s * GIB / n, dump_s * GIB / n, load_s * GIB / n


def main() -> None:
    ap = harness.cli(__doc__, runs=3, quick={"out_mib": 64})
    ap.add_argument("--out-mib", type=int, default=512, help="output size in MiB (512)")
    a = harness.parse(ap)
    run = harness.Run("output_bound", a)
    n = a.out_mib << 20
    s: dict = {k: [] for k in ("memcpy warm", "memcpy fresh", "SHA-256", "AES-128-GCM",
                               "worker pickle.dump to file, first",
                               "worker pickle.dump to file", "driver pickle.loads",
                               "channel on", "channel off", "channel on GB/s",
                               "channel off GB/s", "load")}
    src = lcb.make_source(n)
    tmp = tempfile.mkdtemp()
    try:
        for _ in range(a.runs):
            s["memcpy warm"].append(memcpy_warm(n))
            s["memcpy fresh"].append(memcpy_fresh(n))
            s["SHA-256"].append(sha256(n))
            s["AES-128-GCM"].append(aes_gcm())
            first, d, ld = pickle_steps(n, tmp)
            s["worker pickle.dump to file, first"].append(first)
            s["worker pickle.dump to file"].append(d)
            s["driver pickle.loads"].append(ld)
            for name, on in (("on", True), ("off", False)):
                s[f"channel {name} GB/s"].append(lcb.ship_native(src, False, encrypt=on))
                s[f"channel {name}"].append(lcb.SHIP_CPU[-1])
            s["load"].append(os.getloadavg()[0])
            print({k: round(v[-1], 3) for k, v in s.items()}, flush=True)
    finally:
        src.unlink()
        src.parent.rmdir()
        os.rmdir(tmp)
    med = {k: harness.stats(v, 3)["median"] for k, v in s.items()}
    cores = os.cpu_count() or 1
    for mode in ("on", "off"):
        total = med["worker pickle.dump to file"] + med[f"channel {mode}"] + \
            med["driver pickle.loads"]
        s[f"path CPU s/GiB, {mode}"] = [total]
        s[f"bound GB/s on {cores} cores, {mode}"] = [cores / total * GIB / 1e9]
    for key, v in s.items():
        unit = "GB/s" if "GB/s" in key else "load" if key == "load" else "CPU s/GiB"
        run.figure(key, v, unit, 3)
    run.results = s
    run.finish()


if __name__ == "__main__":
    main()
