#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 (ASan + UBSan + leak checks) and runs every
# target for TSP_FUZZ_SECONDS (default 60) each, all at once (TSP_FUZZ_JOBS at a time,
# default all six: the wall time is that of one target, the cores are shared), from the
# committed seed corpora in tests/fuzz/corpus/<target>/ (read only: what a run finds goes to
# build-fuzz/corpus_<target>/, kept between runs). Prints each target's executions, coverage
# and features; fails on any crash, leak or sanitizer report (the target's last lines shown).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
secs=${TSP_FUZZ_SECONDS:-60}
targets=(fuzz_logwire fuzz_records fuzz_json fuzz_outcome fuzz_rendezvous fuzz_logserver)
jobs=${TSP_FUZZ_JOBS:-${#targets[@]}}
cc=${CLANG:-clang-14}
command -v "$cc" > /dev/null || { echo "fuzz: $cc not found (apt: clang-14 libclang-rt-14-dev)"; exit 1; }
CC=$cc cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DTSP_BUILD_FUZZ=ON \
  -DTSP_BUILD_TESTS=OFF > build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
cmake --build build-fuzz -j2 --target "${targets[@]}" >> build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
rm -f build-fuzz.log
# Seeds (tests/fuzz/corpus/<target>/): valid inputs of each format. fuzz_rendezvous: a
# leading T sends the rest inside TLS with the run's key, M sends "PUT MAC REST" with the
# MAC of REST, anything else goes in plaintext (fuzz_rendezvous.c). fuzz_logserver: a
# leading L or O does the handshake first inside TLS, P sends the rest in plaintext
# (fuzz_logserver.c).
run_target() { # name seconds -> build-fuzz/<name>.out, exit status of the fuzzer
  local work=build-fuzz/corpus_$1
  mkdir -p "$work"
  ASAN_OPTIONS=detect_leaks=1 "./build-fuzz/tests/fuzz/$1" -max_total_time="$2" \
    -max_len=4096 -print_final_stats=1 "$work" "tests/fuzz/corpus/$1" > "build-fuzz/$1.out" 2>&1
}
report() { # name seconds status
  local out=build-fuzz/$1.out execs cov ft
  if [ "$3" != 0 ]; then tail -40 "$out"; echo "$1: FAILED (exit $3)"; return 1; fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out")
  cov=$(grep -o 'cov: [0-9]*' "$out" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$out" | tail -1 | cut -d' ' -f2)
  echo "$1: ${execs:-?} executions in ${2}s, coverage ${cov:-?} edges, ${ft:-?} features, no crash, no leak"
  grep "^$1: " "$out" || true # what a target says it reached (fuzz_logserver)
}
declare -A pid
status=0
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  run_target "$t" "$secs" & pid[$t]=$!
  running=$((running + 1))
done
for t in "${targets[@]}"; do
  rc=0
  wait "${pid[$t]}" || rc=$?
  report "$t" "$secs" "$rc" || status=1
done
exit $status
