#!/usr/bin/env bash
# A second environment for the version matrix (tests/e2e/test_pyspark_matrix.py): the
# checkout's torchspark beside another pyspark (3.5.9 by default), as a user of that Spark
# would have it. Idempotent and fast when all is there:
#  1. that pyspark (with its py4j and its Spark jars) installed once per machine under
#     ~/.cache/torchspark/pyspark-<version>-<key>, keyed like tests/setup.sh's dependency
#     venv (the Python version; here the pyspark pin);
#  2. .venv-pyspark-<version> in the checkout, which sees that pyspark first and then the
#     dependency venv of tests/setup.sh (torch, numpy, pyarrow, pytest...) through one .pth
#     file: torch is not downloaded again;
#  3. with a torch version too, .venv-pyspark-<version>-torch-<torch> instead, which sees
#     that torch (tests/setup_torch.sh: once per machine, with its CUDA wheels) between the
#     two: the oldest pyspark beside the oldest torch that torchspark states.
# torchspark itself is installed into it by the matrix test, with the user's command
# (pip install ./spark-glue/python), which must keep this pyspark.
# Usage: tests/setup_pyspark.sh [VERSION [TORCH_VERSION]]; prints the venv's python. Run
# tests/setup.sh first.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log() { printf '[setup_pyspark] %s\n' "$*" >&2; }
ver=${1:-3.5.9}
torch_ver=${2:-}
[[ $ver =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "'$ver' is not a pyspark version such as 3.5.9"; exit 2; }
torch_dir=
[ -z "$torch_ver" ] || torch_dir=$(bash tests/setup_torch.sh "$torch_ver")
[ -x .venv/bin/python ] || { log ".venv is missing: run bash tests/setup.sh first"; exit 1; }

py=${PYTHON:-python3}
deps_site=$(sed -n 1p "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_torchspark_deps.pth")
# pip from tests/setup.sh's dependency venv (a Debian python3 may have none of its own).
deps_py=$(cd "$deps_site/../../.." && pwd)/bin/python
key=$( (echo "pyspark==$ver"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/torchspark
dir=$cache/pyspark-$ver-$key
if [ ! -f "$dir/.complete" ]; then
  mkdir -p "$cache"
  exec 9> "$dir.lock"
  flock 9
  if [ ! -f "$dir/.complete" ]; then
    log "installing pyspark $ver (with its Spark jars, about 320 MB) into $dir, once per machine"
    rm -rf "$dir"
    # Only pyspark and py4j: everything else comes from the dependency venv.
    "$deps_py" -m pip install -q --disable-pip-version-check --no-compile --target "$dir" \
      "pyspark==$ver"
    touch "$dir/.complete"
  fi
  flock -u 9
fi

venv=.venv-pyspark-$ver${torch_ver:+-torch-$torch_ver}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# This pyspark (and torch) before the dependency venv (which holds the newest of both).
printf '%s\n' "$dir" ${torch_dir:+"$torch_dir"} "$deps_site" > "$site/_torchspark_deps.pth"
got=$("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)')
[ "$got" = "$ver" ] || { log "$venv imports pyspark $got, not $ver"; exit 1; }
if [ -n "$torch_ver" ]; then
  # Its version without the local part: 2.4.1 for 2.4.1+cu121.
  got=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
  [ "${got%%+*}" = "$torch_ver" ] || { log "$venv has torch $got, not $torch_ver"; exit 1; }
fi
echo "$root/$venv/bin/python"
