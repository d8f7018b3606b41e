#!/usr/bin/env bash
# The demo (README's first command): sets the machine up, then runs a real DDP training
# (gloo, CPU, synthetic data) on an embedded local-cluster Spark through
# torchspark.TorchDistributor: rank-prefixed logs, then rank 0's metrics.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash tests/setup.sh
echo "== DDP training on Spark local-cluster[2,1,1024] through torchspark.TorchDistributor =="
exec .venv/bin/python spark-glue/python/examples/ddp_demo.py "$@"
