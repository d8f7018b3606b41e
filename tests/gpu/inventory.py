"""H1 of docs/gpu.md: tsp_gpu_inventory (NVML through libtorchspark) against nvidia-smi:
the same GPUs in the same order, with the same UUIDs and PCI bus ids."""
import ctypes
import os
import subprocess
import sys

from torchspark._lib import load_library

GPU_MAX, MIG_MAX, UUID_MAX = 64, 8, 96


class Info(ctypes.Structure):  # tsp_gpu_info_t (native/include/torchspark/gpu.h)
    _fields_ = [("index", ctypes.c_int), ("uuid", ctypes.c_char * UUID_MAX),
                ("bus", ctypes.c_char * 32), ("name", ctypes.c_char * 96),
                ("mem_total", ctypes.c_ulonglong), ("mem_used", ctypes.c_ulonglong),
                ("mig_mode", ctypes.c_int), ("nmig", ctypes.c_int),
                ("mig", (ctypes.c_char * UUID_MAX) * MIG_MAX), ("compute_mode", ctypes.c_int),
                ("nprocs", ctypes.c_int), ("procs_mem", ctypes.c_ulonglong)]


class Inventory(ctypes.Structure):
    _fields_ = [("ndev", ctypes.c_int), ("dev", Info * GPU_MAX)]


def normalise(bus: str) -> str:
    bus = bus.strip().lower()
    return bus[4:] if len(bus.split(":")[0]) == 8 and bus.startswith("0000") else bus


def main() -> int:
    lib = load_library()
    inv = Inventory()
    err = ctypes.create_string_buffer(1024)
    rc = lib.tsp_gpu_inventory(ctypes.byref(inv), err, len(err))
    if rc != 0:
        print(f"tsp_gpu_inventory failed: {rc} {err.value.decode()}")
        return 1
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,mig.mode.current,"
                          "compute_mode", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()
    ok = len(smi) == inv.ndev
    for i, line in enumerate(smi):
        idx, uuid, bus, mig, mode = [x.strip() for x in line.split(",")]
        d = inv.dev[i] if i < inv.ndev else None
        ours = (d.index, d.uuid.decode(), normalise(d.bus.decode())) if d else None
        theirs = (int(idx), uuid, normalise(bus))
        same = ours == theirs
        ok &= same
        print(f"{'ok ' if same else 'BAD'} nvidia-smi {theirs} mig={mig} mode={mode}; "
              f"torchspark {ours} name={d.name.decode() if d else '?'} "
              f"mig={d.mig_mode if d else '?'} procs={d.nprocs if d else '?'}")
    print("visible to CUDA:", os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
