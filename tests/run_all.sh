#!/usr/bin/env bash
# The test command: sets the machine up (tests/setup.sh), builds everything, and runs
# every test: bash -n and shellcheck on every shell script, the Check unit tests (plain,
# under ASan+UBSan and under TSan), the fuzz targets for a bounded time, the device check
# (tests/gpu: one line where there is no GPU), and the end-to-end pytest suites on real
# Spark and real torch.
# Every run writes what each step and each test cost to build/test-times/ (steps.tsv,
# pytest.xml, summary.md; docs/testing.md).
#
# Usage: tests/run_all.sh [--quick] [PYTEST_ARGS...]
#   --quick: the iteration tier (docs/testing.md): the plain unit tests (ctest), the pure
#   Python unit and contract tests, and one end-to-end smoke run on real Spark and torch,
#   in a few minutes. CI runs the whole suite (no --quick).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
bash tests/setup.sh
jobs=$(nproc)
# pytest runs its modules on this many workers (pytest-xdist, --dist loadscope: a module, or a
# group of modules sharing a cluster, runs whole on one worker; tests/conftest.py); 0: in this
# process. Arguments given to this script come after it, so `-n 0` there wins too.
workers=${TSP_PYTEST_WORKERS:-2}
xdist=(-n "$workers" --dist loadscope)
times=build/test-times
rm -rf "$times"
mkdir -p "$times"
printf 'step\tseconds\n' > "$times/steps.tsv"
step_name=""
step_start=0
step_end() {
  [ -n "$step_name" ] && printf '%s\t%s\n' "$step_name" $((SECONDS - step_start)) >> "$times/steps.tsv"
  step_name=""
}
step() {
  step_end
  step_name=$1
  step_start=$SECONDS
  printf '\n===== %s =====\n' "$*"
}
# shellcheck disable=SC2317  # called by the EXIT trap
summarize() {
  step_end
  .venv/bin/python tests/suite_times.py "$times" || true
}
trap summarize EXIT

# The checks that time nothing and only need CPU (static analysis, the fuzz targets: 60 s of
# wall time each, whatever CPU they get) run beside the end-to-end tests, at the lowest
# priority (nice 19): they take the cycles that pytest leaves while it waits on Spark's
# scheduling, replacement executors and timeouts, instead of 2.5 minutes of their own.
# shellcheck disable=SC2317  # called through beside
static_analysis() {
  local status=0 layer_includes=() tidy tidy_dir
  for d in native/src/*/; do layer_includes+=(-I "$d"); done
  cppcheck --enable=warning,performance,portability --std=c11 --quiet --error-exitcode=1 \
    -I native/include "${layer_includes[@]}" native/src native/tools || status=1
  # Its findings are the lines that name a file or an error, whatever its exit status. One
  # clang-tidy per file, $jobs at a time (one process over all files took 2.5 CPU minutes),
  # each file's output kept whole.
  # In a subshell: its waits see its own jobs only, not the other background jobs.
  tidy_dir=$(mktemp -d)
  (
    for f in native/src/*/*.c native/tools/*.c; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
      clang-tidy -p build --quiet --extra-arg=-Wno-unknown-warning-option "$f" \
        > "$tidy_dir/${f//\//_}.log" 2>&1 &
    done
    wait || true
  ) || true
  tidy=$(cat "$tidy_dir"/*.log)
  rm -rf "$tidy_dir"
  if grep -E '^/|error:' <<< "$tidy"; then
    status=1
  fi
  echo "static analysis done"
  return "$status"
}
# shellcheck disable=SC2317  # called through beside
fuzz_targets() {
  if [ -d tests/fuzz ] && ls tests/fuzz/*.c > /dev/null 2>&1; then
    bash tests/fuzz/run.sh
  fi
}
# beside NAME...: runs each check function in turn, in the background at nice 19, its output
# in $times/NAME.log, its seconds in $times/beside.tsv, a failure's name in $times/beside.failed.
beside() {
  (
    renice -n 19 -p "$BASHPID" > /dev/null
    for name in "$@"; do
      t0=$SECONDS
      "$name" > "$times/$name.log" 2>&1 || echo "$name" >> "$times/beside.failed"
      printf '(beside pytest) %s\t%s\n' "$name" $((SECONDS - t0)) >> "$times/beside.tsv"
    done
  ) &
  beside_pid=$!
}

if [ "$quick" = 1 ]; then
  status=0
  step "unit tests (ctest, plain build)"
  ctest --test-dir build --output-on-failure -j"$jobs" || status=1
  step "quick pytest tier (pure unit and contract tests, one end-to-end smoke run)"
  mapfile -t quick_tests < <(grep -vE '^[[:space:]]*(#|$)' tests/quick.txt)
  .venv/bin/python -m pytest -ra "${xdist[@]}" --junitxml="$times/pytest.xml" "${quick_tests[@]}" "$@" \
    || status=1
  exit $status
fi
# The version matrix's oldest torch (tests/setup_torch.sh: 2.8 GB, once per machine, under a
# lock the matrix test waits on) downloads while the native steps below use the CPUs.
matrix_torch=${TORCHSPARK_MATRIX_TORCH-2.4.1}
if [ -n "$matrix_torch" ]; then
  bash tests/setup_torch.sh "$matrix_torch" > build/setup_torch.log 2>&1 &
  matrix_torch_pid=$!
fi
status=0

# The sanitizer trees build in the background (nice 19) while the plain unit tests (which
# wait on timeouts and on the JVM) and the linters run; their tests run after those, below.
sanitizer_build() {
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=Debug "$2" > /dev/null && cmake --build "$1" -j"$jobs"
}
(
  renice -n 19 -p "$BASHPID" > /dev/null
  sanitizer_build build-asan -DTSP_SANITIZE=ON && sanitizer_build build-tsan -DTSP_SANITIZE_THREAD=ON
) > "$times/sanitizers-build.log" 2>&1 &
sanitizers_pid=$!

step "shell scripts (bash -n and shellcheck on every one: a parse error never hides behind a skip)"
# Every tracked *.sh and every tracked file whose first line is a sh or bash shebang (.ci/run).
sh_files=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  case $f in
    *.sh) sh_files+=("$f") ;;
    *) if head -c 128 "$f" | head -n 1 | grep -qE '^#!.*[/ ](ba)?sh( |$)'; then sh_files+=("$f"); fi ;;
  esac
done < <(git ls-files -z)
for f in "${sh_files[@]}"; do
  bash -n "$f" || { echo "bash -n: $f does not parse"; status=1; }
done
shellcheck "${sh_files[@]}" || status=1
echo "checked ${#sh_files[@]} shell scripts: ${sh_files[*]}"

step "unit tests (ctest)"
ctest --test-dir build --output-on-failure -j"$jobs" || status=1

step "format, lint and types (clang-format on native/ and jni/, ruff on spark-glue/, tests/, bench/, mypy on spark-glue/python)"
mapfile -t c_files < <(git ls-files 'native/*.c' 'native/*.h' 'jni/*.c' 'jni/*.h')
clang-format --dry-run -Werror "${c_files[@]}" || status=1
.venv/bin/python -m ruff check --no-cache spark-glue tests bench || status=1
.venv/bin/python -m mypy --config-file spark-glue/python/pyproject.toml spark-glue/python/torchspark \
  || status=1

step "unit tests under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer (the log server, output receiver and agent threads), the two at once"
wait "$sanitizers_pid" || { cat "$times/sanitizers-build.log"; exit 1; }
# The two trees' tests wait on timeouts and sockets more than they compute: at once, they
# take little more than one tree alone. Not test_logserver under TSan: it computes (17-21 s
# under each sanitizer) and misses its handshake deadlines beside the other tree's; it runs
# alone after. check_deps, check_deps_rules and abi_headers are the same in every tree (no
# instrumented code): the plain tree's ctest ran them.
plain_only='^(check_deps|check_deps_rules|abi_headers)$'
tsan() {
  # atexit_sleep_ms=0: TSan otherwise sleeps 1 s in every instrumented process that calls
  # exit() (to catch races at exit), which the NCCL check's deadline tests measure as +1 s.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:atexit_sleep_ms=0 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" "$@"
}
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -E "$plain_only" > "$times/ctest-asan.log" 2>&1 &
asan_pid=$!
tsan -E "$plain_only|^test_logserver\$" > "$times/ctest-tsan.log" 2>&1 || status=1
wait "$asan_pid" || status=1
cat "$times/ctest-asan.log" "$times/ctest-tsan.log"
tsan -R '^test_logserver$' || status=1

step "GPU checks (tests/gpu: skipped with one line without an NVIDIA GPU)"
# Its Python helpers compile here even where the checks skip (ruff lints them above).
.venv/bin/python -m py_compile tests/gpu/*.py || status=1
bash tests/gpu/run.sh || status=1

step "end-to-end tests (pytest on real torch and Spark; beside it: static analysis, then the fuzz targets, 60 s each, all at once)"
beside static_analysis fuzz_targets
suites=()
for d in tests/unit_py tests/e2e tests/cluster; do [ -d "$d" ] && suites+=("$d"); done
set +e
# --durations: the 30 slowest tests, so that the run's cost is visible where it grows; every
# test's time is kept in build/test-times/pytest.xml (and summary.md, written at exit).
.venv/bin/python -m pytest -ra --durations=30 "${xdist[@]}" --junitxml="$times/pytest.xml" "${suites[@]}" "$@"
rc=$?
set -e
[ $rc -eq 0 ] || status=1
step "static analysis (cppcheck, clang-tidy) and fuzz targets: what ran beside pytest"
wait "$beside_pid" || true
cat "$times/static_analysis.log" "$times/fuzz_targets.log" || status=1
cat "$times/beside.tsv" >> "$times/steps.tsv" || status=1
if [ -s "$times/beside.failed" ]; then
  echo "failed beside pytest: $(tr '\n' ' ' < "$times/beside.failed")"
  status=1
fi
# The matrix test waited on its lock; a failure there shows in that test, and here why.
if [ -n "${matrix_torch_pid:-}" ] && ! wait "$matrix_torch_pid"; then
  tail -20 build/setup_torch.log
  status=1
fi
exit $status
