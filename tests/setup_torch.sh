#!/usr/bin/env bash
# Another torch for the version matrix (tests/e2e/test_pyspark_matrix.py): the oldest torch
# that torchspark states (2.4.1 by default), installed once per machine under
# ~/.cache/torchspark/torch-<version>-<key>, keyed like tests/setup.sh's dependency venv (the
# Python version; here the torch pin). Idempotent, fast when there (one file test), one
# installer at a time per machine (a lock), and pip's own download cache is used, so a
# reinstall downloads nothing.
# The folder holds torch with its own dependencies (its nvidia-* CUDA 12 wheels and triton:
# on PyPI, Linux x86_64 torch is a CUDA build, which runs on a machine without a GPU), side
# by side as pip --target lays them, so that torch's libraries find the CUDA libraries by
# their RPATH. tests/setup_pyspark.sh puts it on a matrix venv's path before the dependency
# venv (which holds the newest torch).
# Usage: tests/setup_torch.sh [VERSION]; prints the folder. Run tests/setup.sh first.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log() { printf '[setup_torch] %s\n' "$*" >&2; }
ver=${1:-2.4.1}
[[ $ver =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "'$ver' is not a torch version such as 2.4.1"; exit 2; }
[ -x .venv/bin/python ] || { log ".venv is missing: run bash tests/setup.sh first"; exit 1; }

py=${PYTHON:-python3}
deps_site=$(sed -n 1p "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_torchspark_deps.pth")
# pip from tests/setup.sh's dependency venv (a Debian python3 may have none of its own).
deps_py=$(cd "$deps_site/../../.." && pwd)/bin/python
key=$( (echo "torch==$ver"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/torchspark
dir=$cache/torch-$ver-$key
if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache"
  exec 9> "$dir.lock"
  flock 9
  if [ ! -f "$dir/.complete" ]; then
    log "installing torch $ver (a CUDA build with its nvidia-* wheels, about 2.5 GB) into $dir, once per machine"
    rm -rf "$dir"
    start=$SECONDS
    "$deps_py" -m pip install -q --disable-pip-version-check --no-compile --target "$dir" \
      "torch==$ver"
    log "torch $ver installed in $((SECONDS - start)) s"
    touch "$dir/.complete"
  fi
  flock -u 9
fi
echo "$dir"
