#!/usr/bin/env bash
# The GPU checks of docs/gpu.md that only a machine with an NVIDIA GPU can run: the NVML
# inventory against nvidia-smi, the NCCL preflight at world size 1 with torch's libnccl,
# and one DDP step with backend nccl under torchspark-run beside torchrun. Skips with one
# line where there is no GPU. Prints timings (docs/benchmarks.md says how to record them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "tests/gpu: skipped: no NVIDIA GPU on this host (nvidia-smi is missing or fails)"
  exit 0
fi
py=${PYTHON:-$root/.venv/bin/python}
run=${TORCHSPARK_RUN:-$root/build/bin/torchspark-run}
export TORCHSPARK_LIB=${TORCHSPARK_LIB:-$root/build/lib/libtorchspark.so}
fail=0
step() { printf '\n== %s\n' "$*"; }

step "H1: the NVML inventory against nvidia-smi"
"$py" tests/gpu/inventory.py || fail=1

step "H2: the NCCL preflight at world size 1 with torch's libnccl"
lib=$("$py" -c 'from torchspark._launch import find_libnccl; print(find_libnccl() or "")' \
      2>/dev/null || true)
echo "libnccl: ${lib:-(the loader's libnccl.so.2)}"
for i in 1 2 3 4 5; do
  start=$(date +%s.%N)
  out=$("$run" --standalone --nproc-per-node gpu --gpus 0 --nccl-check=60 \
        ${lib:+--nccl-lib "$lib"} --no-python true 2>&1) || { echo "$out"; fail=1; break; }
  end=$(date +%s.%N)
  echo "$out" | grep 'NCCL check passed' || { echo "$out"; fail=1; break; }
  echo "agent wall with the check: $(echo "$end - $start" | bc) s"
done
for i in 1 2 3; do
  start=$(date +%s.%N)
  "$run" --standalone --nproc-per-node gpu --gpus 0 --no-python true > /dev/null 2>&1 || fail=1
  end=$(date +%s.%N)
  echo "agent wall without the check: $(echo "$end - $start" | bc) s"
done

step "H9: one DDP step with backend nccl, torchspark-run beside torchrun"
for launcher in torchspark-run torchrun; do
  start=$(date +%s.%N)
  if [ "$launcher" = torchrun ]; then
    "$py" -m torch.distributed.run --standalone --nproc-per-node 1 tests/gpu/ddp_nccl.py || fail=1
  else
    "$run" --standalone --nproc-per-node gpu --gpus 0 --python "$py" tests/gpu/ddp_nccl.py || fail=1
  fi
  end=$(date +%s.%N)
  echo "$launcher: $(echo "$end - $start" | bc) s"
done

[ $fail -eq 0 ] && echo "tests/gpu: all passed" || echo "tests/gpu: FAILED"
exit $fail
