#!/usr/bin/env bash
# Sets up a machine for torchspark, idempotently, and fast when all is already there:
#  1. Debian packages (compiler, Check, OpenSSL, clang's libFuzzer, JDK, JUnit, iproute2,
#     ShellCheck and docker-compose 1.29 to lint docker/ without an engine; podman, runc,
#     netavark, mmdebstrap and iptables to run docker/compose.yaml in tests/cluster/test_compose.py
#     with an image built from Debian packages; podman-compose comes from tests/requirements.txt);
#  2. a dependency venv with torch, pyspark & co, installed once per machine under
#     ~/.cache/torchspark (torch is large; every checkout reuses it);
#  3. the checkout's own .venv, which sees those packages through a .pth file;
#  4. the native build (build/) and the torchspark Python package installed into .venv.
# Usage: tests/setup.sh [--no-build]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log() { printf '[setup] %s\n' "$*" >&2; }

apt_pkgs=(build-essential cmake pkg-config check libssl-dev clang-14 libfuzzer-14-dev
          libclang-rt-14-dev openjdk-17-jdk-headless junit4 iproute2 procps python3-venv
          cppcheck clang-tidy shellcheck docker-compose util-linux
          podman runc netavark aardvark-dns mmdebstrap iptables)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

py=${PYTHON:-python3}
req="$root/tests/requirements.txt"
# The dependency venv is keyed by the Python version and the torch pin only (torch is the
# large part, installed once per machine); the rest of requirements.txt is installed into
# it incrementally whenever that file changes, so adding a small package costs seconds.
torch_pin=$(grep -E '^torch==' "$req")
key=$( (echo "$torch_pin"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)
deps=${TORCHSPARK_DEPS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/torchspark/deps-$key}
req_key=$(sha256sum < "$req" | cut -c1-16)
if [ "$(cat "$deps/.complete" 2>/dev/null)" != "$req_key" ]; then
  mkdir -p "$(dirname "$deps")"
  # One installer at a time per machine (several checkouts may set up at once).
  exec 9> "$deps.lock"
  flock 9
  if [ "$(cat "$deps/.complete" 2>/dev/null)" != "$req_key" ]; then
    log "installing Python packages into $deps (torch once per machine; the rest when requirements.txt changes)"
    [ -x "$deps/bin/python" ] || "$py" -m venv "$deps"
    "$deps/bin/pip" install -q --upgrade pip
    "$deps/bin/pip" install -q -r "$req"
    echo "$req_key" > "$deps/.complete"
  fi
  flock -u 9
fi
deps_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$py" -m venv .venv
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps_site" > "$site/_torchspark_deps.pth"

[ "${1:-}" = "--no-build" ] && exit 0

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > build.log.tmp 2>&1 || { cat build.log.tmp; rm -f build.log.tmp; exit 1; }
rm -f build.log.tmp
cmake --build build -j"$(nproc)"
[ -x build/bin/torchspark-run ] || { log "native build failed"; exit 1; }

# The torchspark Python package (with libtorchspark.so and torchspark-run inside) goes
# into .venv; reinstalled only when the package sources or the native build changed.
pkg_key=$( (find spark-glue/python -name '*.py' -o -name '*.toml' | LC_ALL=C sort | xargs cat;
            cat build/lib/libtorchspark.so build/bin/torchspark-run; cat build/java/torchspark.jar 2>/dev/null) | sha256sum | cut -c1-16)
if [ "$(cat .venv/.torchspark-pkg 2>/dev/null)" != "$pkg_key" ] || \
   ! .venv/bin/python -c 'import torchspark' 2>/dev/null; then
  log "installing the torchspark package into .venv"
  rm -f .venv/bin/torchspark-run
  .venv/bin/pip install -q --no-deps --no-build-isolation --force-reinstall ./spark-glue/python
  echo "$pkg_key" > .venv/.torchspark-pkg
fi
# pip installs the torchspark-run command itself (the wheel's scripts), beside .venv's
# python, its default interpreter.
if [ ! -x .venv/bin/torchspark-run ] || [ -L .venv/bin/torchspark-run ]; then
  log "the torchspark package did not install .venv/bin/torchspark-run"
  exit 1
fi
log "ready: .venv/bin/torchspark-run $(.venv/bin/torchspark-run --version 2>/dev/null || echo '?')"
