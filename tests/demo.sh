#!/usr/bin/env bash
# The demo (README's first command): sets the machine up, then runs a real DDP training.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash tests/setup.sh
echo "== DDP training (gloo, CPU, 2 processes) under torchspark-run =="
exec .venv/bin/torchspark-run --standalone --nproc-per-node 2 --tee 3 \
  spark-glue/python/examples/ddp_train.py --steps 30
