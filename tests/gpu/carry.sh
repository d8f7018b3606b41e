#!/usr/bin/env bash
# Prepares what tests/gpu/run.sh needs on a GPU machine that has no Java, no pyspark and no
# network (docs/gpu.md, "Running the device check on a GPU machine"): pyspark's Python
# package without its jars (about 17 MiB instead of 490) goes to build/gpu-site, so that it
# travels with build/; run.sh puts build/gpu-site and spark-glue/python on PYTHONPATH.
# The source is the pinned pyspark of this checkout's Python (PYTHON, default .venv/bin/python).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
src=$("$py" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("pyspark").origin))')
dst=$root/build/gpu-site
rm -rf "$dst/pyspark"
mkdir -p "$dst"
tar -C "$(dirname "$src")" --exclude=pyspark/jars --exclude=__pycache__ -cf - pyspark | tar -C "$dst" -xf -
[ -x "$root/build/bin/torchspark-run" ] || echo "carry.sh: build/bin/torchspark-run is missing: build first (tests/setup.sh)" >&2
echo "carry.sh: pyspark from $src in $dst ($(du -sh "$dst" | cut -f1)); carry build/ ($(du -sh "$root/build" | cut -f1) in all)"
