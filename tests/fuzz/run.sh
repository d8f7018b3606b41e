#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-14 (ASan + UBSan + leak checks) and runs each for
# a bounded time (TSP_FUZZ_SECONDS, default 60 s in all, shared by the targets), from small
# seed corpora of valid inputs. Prints the executions run; fails on any crash, leak or sanitizer report.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
secs=${TSP_FUZZ_SECONDS:-60}
cc=${CLANG:-clang-14}
command -v "$cc" > /dev/null || { echo "fuzz: $cc not found (apt: clang-14 libclang-rt-14-dev)"; exit 1; }
CC=$cc cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DTSP_BUILD_FUZZ=ON \
  -DTSP_BUILD_TESTS=OFF > build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
cmake --build build-fuzz -j2 --target fuzz_logwire fuzz_records fuzz_json fuzz_rendezvous fuzz_logserver >> build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
rm -f build-fuzz.log
corpus=build-fuzz/corpus_logwire
mkdir -p "$corpus"
# Seeds: a HELLO frame, and a LINE frame after a (fuzzer-accepted) AUTH.
python3 - "$corpus" <<'PY'
import os, struct, sys
d = sys.argv[1]
def fr(t, p, rank=-1, st=0): return struct.pack(">BBBBiI", t, 0, st, 0, rank, len(p)) + p
hello = b"TSPL" + struct.pack(">HBB", 1, 1, 0) + bytes(16) + bytes(8) + bytes(32) + bytes(4) + bytes(8) + b"\x02hx"
open(os.path.join(d, "hello"), "wb").write(fr(1, hello, 0))
open(os.path.join(d, "line"), "wb").write(fr(1, hello, 0) + fr(3, bytes(32)) + fr(0x10, bytes(8) + b"hi", 0, 1) + b"\x5a")
open(os.path.join(d, "chal"), "wb").write(fr(2, b"\x00\x01" + bytes(32)))
PY
third=$((secs / 5 > 1 ? secs / 5 : 1))
corpus2=build-fuzz/corpus_records
mkdir -p "$corpus2"
printf '%s' '{"message": {"message": "ValueError: x\u00e9", "extraInfo": {"py_callstack": "Traceback\n", "timestamp": "1700000000"}}}' > "$corpus2/error_file"
printf '%s' '{"message": "old style", "timestamp": 1700000000}' > "$corpus2/old_error_file"
printf '%s' '{"version":1,"master_port":40123,"master_addr":"10.0.0.5","run_id":"9f0c","host":"h","ifname":"eth0"}' > "$corpus2/record"
run_target() { # name corpus seconds
  local out execs
  out=$(ASAN_OPTIONS=detect_leaks=1 "./build-fuzz/tests/fuzz/$1" -max_total_time="$3" \
        -max_len=4096 -print_final_stats=1 "$2" 2>&1) || { echo "$out" | tail -40; return 1; }
  execs=$(echo "$out" | sed -n 's/^stat::number_of_executed_units: *//p')
  echo "$1: ${execs:-?} executions in ${3}s, no crash, no leak"
  echo "$out" | grep "^$1: " || true # what a target says it reached (fuzz_logserver)
}
corpus3=build-fuzz/corpus_json
mkdir -p "$corpus3"
cp "$corpus2"/* "$corpus3"/
printf '%s' '[1, -0.5e+3, "a\u00e9\ud83d\ude00\ud800", true, false, null, {"k": []}]' > "$corpus3/mixed"
run_target fuzz_logwire "$corpus" "$third"
run_target fuzz_records "$corpus2" "$third"
run_target fuzz_json "$corpus3" "$third"
# The rendezvous: a leading T stands for the server's token (fuzz_rendezvous.c).
corpus4=build-fuzz/corpus_rendezvous
mkdir -p "$corpus4"
printf 'T PUT %s {"master_port": 40123}\n' "$(printf 'ab%.0s' $(seq 32))" > "$corpus4/put"
printf 'T PUT a\n' > "$corpus4/put_no_mac"
printf 'T GET\n' > "$corpus4/get"
printf '00ff GET\n' > "$corpus4/bad_token"
run_target fuzz_rendezvous "$corpus4" "$third"
# The log server, inside TLS with the run's key: a leading L or O has the target do the
# handshake first, a leading P sends the rest in plaintext (fuzz_logserver.c).
corpus5=build-fuzz/corpus_logserver
mkdir -p "$corpus5"
python3 - "$corpus5" <<'PY'
import os, struct, sys
d = sys.argv[1]
def fr(t, p, rank=-1, st=0): return struct.pack(">BBBBiI", t, 0, st, 0, rank, len(p)) + p
def hello(v): return b"TSPL" + struct.pack(">HBB", v, 1, 0) + bytes(16) + bytes(8) + bytes(32) + bytes(4) + bytes(8) + b"\x02hx"
seeds = {"line": b"L" + fr(0x10, struct.pack(">Q", 1) + b"hello", 0, 1),
         "far_rank": b"L" + fr(0x10, struct.pack(">Q", 2) + b"x", (1 << 24) - 1, 1)
         + fr(0x11, struct.pack(">Q", 5), 3),
         "error_text": b"L" + fr(0x31, b"\x1b[31m\n[rank 0] x"),
         "output": b"O" + fr(0x20, struct.pack(">Q", 3)) + fr(0x21, b"abc") + fr(0x22, bytes(32)),
         "output_too_big": b"O" + fr(0x20, struct.pack(">Q", 1 << 40)),
         "stranger_error": fr(0x31, b"stranger"),
         "stranger_hello": fr(1, hello(3), 0) + fr(3, bytes(32)),
         "plain_hello_v2": b"P" + fr(1, hello(2), 0),
         "plain_garbage": b"PGET / HTTP/1.0\r\n\r\n",
         "plain_client_hello": b"P\x16\x03\x01\x00\x05\x01\x00\x00\x01\x03"}
for name, data in seeds.items():
    open(os.path.join(d, name), "wb").write(data)
PY
run_target fuzz_logserver "$corpus5" "$third"
