#!/usr/bin/env bash
# The project's device check (docs/gpu.md, "Running the device check on a GPU machine"):
# H1-H10 of docs/gpu.md (tests/gpu/checks.py), function-mode DDP with NCCL through the warm
# pool by the PySpark glue's own path without Spark, and a DataFrame partition loaded onto
# the GPU (tests/gpu/warm_ddp.py), and the hang doctor on an NCCL hang with torch's flight
# recorder (tests/gpu/nccl_hang.py). At most 6 minutes on one GPU (TSP_GPU_BUDGET, 340 s,
# plus at most 10 s of kill grace); each check runs in its own process under its own
# timeout, and anything it leaves running is a failure. The run ends with the figures (a table
# for docs/benchmarks.md, "GPUs and the NCCL preflight"), one line
# per check (PASS/FAIL/SKIP, name, seconds) and "N passed, N failed, N skipped"; exit 1
# when a check failed. Where there is no NVIDIA GPU it says so in one line and exits 0.
#
# Usage: bash tests/gpu/run.sh [CHECK...]   (default: all, in order; e.g. `h5 warm`)
# Environment: PYTHON (default .venv/bin/python when it has torch, else python3),
# TSP_GPU_BUDGET (340), TSP_GPU_LOG_DIR (keep each check's log there), NCCL_TESTS_BIN (H10).
#
# Everything runs from main, called on the last line: bash parses the whole file before
# the first command, so a syntax error anywhere fails the run, even where it would skip.
set -uo pipefail

# name, timeout (s), command (relative to tests/gpu)
CHECKS=(
  "env 120 checks.py env"
  "h1 60 checks.py h1"
  "h2 120 checks.py h2"
  "h3 60 checks.py h3"
  "h4 45 checks.py h4"
  "h5 150 checks.py h5"
  "h6 60 checks.py h6"
  "h7 60 checks.py h7"
  "h8 60 checks.py h8"
  "h9 150 checks.py h9"
  "h10 60 checks.py h10"
  "warm 150 warm_ddp.py"
  "dataframe 90 warm_ddp.py --dataframe"
  "nccl-hang 90 nccl_hang.py"
)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The processes still alive whose environment carries this run's mark (never this shell's
# own: the mark is given to each check's command only).
marked() {
  local f pid
  for f in /proc/[0-9]*/environ; do
    if grep -qzx "TSP_GPU_MARK=$MARK" "$f" 2> /dev/null; then
      pid=${f#/proc/}
      echo "${pid%/environ}"
    fi
  done
}

# Waits up to 5 s for the check's processes to end; prints and kills what is left.
leftovers() {
  local pids pid i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(marked)
    [ -z "$pids" ] && return 0
    [ "$i" -lt 10 ] && sleep 0.5
  done
  echo "left running after the check:"
  for pid in $pids; do
    echo "  $pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | cut -c1-160)"
    kill -KILL "$pid" 2> /dev/null
  done
  return 1
}

run_check() {
  local name=$1 limit=$2 script=$3 t0 rc status log
  shift 3
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 15 ]; then
    RESULTS+=("SKIP $name 0.0 (no time left of the ${BUDGET} s budget)")
    SKIPPED=$((SKIPPED + 1))
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log=$LOGS/$name.log
  printf '\n== %s (timeout %s s): %s %s\n' "$name" "$limit" "$script" "$*"
  t0=$(now)
  TSP_GPU_MARK=$MARK timeout -k 5 "$limit" "$PY" "$HERE/$script" "$@" < /dev/null 2>&1 |
    tee "$log"
  rc=${PIPESTATUS[0]}
  local secs
  secs=$(since "$t0")
  case $rc in
    0) status=PASS ;;
    77) status=SKIP ;;
    124 | 137) status=FAIL; echo "timed out after $limit s" ;;
    *) status=FAIL ;;
  esac
  leftovers || status=FAIL
  grep '^FIGURE | ' "$log" | sed 's/^FIGURE //' >> "$FIGURES"
  case $status in
    PASS) PASSED=$((PASSED + 1)) ;;
    SKIP) SKIPPED=$((SKIPPED + 1)) ;;
    FAIL) FAILED=$((FAILED + 1)) ;;
  esac
  RESULTS+=("$status $name $secs")
}

pick_python() {
  if [ -n "${PYTHON:-}" ]; then
    echo "$PYTHON"
  elif [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c 'import torch' 2> /dev/null; then
    echo "$ROOT/.venv/bin/python"
  else
    command -v python3
  fi
}

main() {
  if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "tests/gpu: skipped: no NVIDIA GPU on this host (nvidia-smi is missing or fails)"
    return 0
  fi
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  ROOT=$(cd "$HERE/../.." && pwd)
  cd "$ROOT" || return 1
  PY=$(pick_python)
  BUDGET=${TSP_GPU_BUDGET:-340}
  MARK=tsp-gpu-$$-$RANDOM$RANDOM
  LOGS=${TSP_GPU_LOG_DIR:-$(mktemp -d)}
  mkdir -p "$LOGS"
  FIGURES=$LOGS/figures.txt
  : > "$FIGURES"
  # The glue from this checkout, and pyspark's Python package where tests/gpu/carry.sh
  # put it (build/gpu-site: it travels with build/).
  export PYTHONPATH="$ROOT/spark-glue/python:$ROOT/build/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
  RESULTS=()
  PASSED=0 FAILED=0 SKIPPED=0
  SECONDS=0
  local want=("$@") entry name limit cmd
  echo "tests/gpu: $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?'), python $PY," \
    "budget $BUDGET s, logs $LOGS"
  for entry in "${CHECKS[@]}"; do
    read -r name limit cmd <<< "$entry"
    if [ ${#want[@]} -gt 0 ] && [[ " ${want[*]} " != *" $name "* ]]; then
      continue
    fi
    # shellcheck disable=SC2086  # cmd is the script and its options, split on purpose
    run_check "$name" "$limit" $cmd
  done
  local apps
  apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2> /dev/null)
  [ -n "$apps" ] && printf '\nstill on the GPU after the checks:\n%s\n' "$apps"

  printf '\n== figures (docs/benchmarks.md, "GPUs and the NCCL preflight": paste with this command, the date and the GPU)\n'
  echo "| id | figure | value | runs |"
  echo "|---|---|---|---|"
  cat "$FIGURES"
  printf '\n== summary (%s s)\n' "$SECONDS"
  printf '%s\n' "${RESULTS[@]}"
  echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
  [ "$FAILED" -eq 0 ]
}

main "$@"
