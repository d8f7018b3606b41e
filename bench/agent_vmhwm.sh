#!/usr/bin/env bash
# The agent's peak resident memory (VmHWM, KiB) in each GPU mode, read from /proc while its
# worker runs: the GPU count through NVML, through cuInit (NVML hidden), the assignment of
# --gpus, and no GPU at all. On a machine without a GPU the stub libraries of the build stand
# in (their threads included); on a GPU host set GPU_REAL=1 to use the real driver.
# Usage: bench/agent_vmhwm.sh [TORCHSPARK-RUN] (docs/benchmarks.md, "The agent's memory in each GPU mode")
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${1:-$root/build/bin/torchspark-run}
stubs=$root/build/tests/unit
nvml=$stubs/libnvml_stub.so
if [ "${GPU_REAL:-0}" != 1 ]; then
  u0=GPU-0a1b2c3d-1111-2222-3333-444455556666
  export TORCHSPARK_LIBCUDA=$stubs/libcuda_stub.so STUB_CUDA_DEVICES=0000:01:00.0
  export STUB_CUDA_UUIDS=$u0 STUB_NVML_DEVICES="$u0@00000000:01:00.0@Stub@0@0"
else
  nvml=libnvidia-ml.so.1
fi
hwm() {
  "$bin" "$@" --no-python sh -c 'sleep 0.6' > /dev/null 2>&1 &
  local p=$!
  sleep 0.4
  awk '/^VmHWM/ {print $2}' "/proc/$p/status"
  wait "$p"
}
echo "count through NVML: $(TORCHSPARK_LIBNVML=$nvml hwm --standalone --nproc-per-node gpu) KiB"
echo "count through cuInit: $(TORCHSPARK_LIBNVML=/nonexistent hwm --standalone --nproc-per-node gpu) KiB"
echo "--gpus 0: $(TORCHSPARK_LIBNVML=$nvml hwm --standalone --nproc-per-node gpu --gpus 0) KiB"
echo "no GPU: $(hwm --standalone --nproc-per-node 1) KiB"
