#!/bin/sh
# One Spark standalone daemon in the foreground: the single place that knows how a master or a
# worker of our test and demo clusters is started. The network-namespace cluster
# (tests/helpers/netns_cluster.py) and the docker/compose.yaml services both run this script,
# so what the tests exercise is what users start.
#
# Usage:
#   spark-node.sh master HOST PORT WEBUI_PORT
#   spark-node.sh worker HOST MASTER_URL CORES MEMORY WORK_DIR WEBUI_PORT [GPUS]
# Environment:
#   SPARK_HOME           Spark's home; default: the directory of the `pyspark` package of $PYTHON
#   PYTHON               interpreter used to find pyspark (default python3)
#   SPARK_DAEMON_MEMORY  daemon heap (default 512m: the daemons only schedule)
#   SPARK_WORKER_OPTS    extra -D options for a worker (GPU options are appended here)
set -eu

die() { echo "spark-node.sh: $*" >&2; exit 2; }

if [ -z "${SPARK_HOME:-}" ]; then
  SPARK_HOME=$("${PYTHON:-python3}" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') \
    || die "SPARK_HOME is unset and ${PYTHON:-python3} cannot import pyspark; set SPARK_HOME"
fi
export SPARK_HOME
export SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}"
[ -x "$SPARK_HOME/bin/spark-class" ] || die "$SPARK_HOME/bin/spark-class not found: is SPARK_HOME right?"

role=${1:-}
[ $# -gt 0 ] && shift
case "$role" in
  master)
    [ $# -eq 3 ] || die "usage: spark-node.sh master HOST PORT WEBUI_PORT"
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
      --host "$1" --port "$2" --webui-port "$3"
    ;;
  worker)
    if [ $# -lt 6 ] || [ $# -gt 7 ]; then
      die "usage: spark-node.sh worker HOST MASTER_URL CORES MEMORY WORK_DIR WEBUI_PORT [GPUS]"
    fi
    host=$1 master=$2 cores=$3 memory=$4 work_dir=$5 webui=$6 gpus=${7:-0}
    mkdir -p "$work_dir"
    if [ "$gpus" -gt 0 ]; then
      # A fake GPU discovery script: Spark only needs the JSON resource description, so tests
      # and demos can schedule GPU tasks on CPU-only machines.
      addrs=$(seq 0 $((gpus - 1)) | sed 's/.*/"&"/' | paste -sd, -)
      script="$work_dir/gpu-discovery.sh"
      printf '#!/bin/sh\necho '"'"'{"name": "gpu", "addresses": [%s]}'"'"'\n' "$addrs" > "$script"
      chmod +x "$script"
      SPARK_WORKER_OPTS="${SPARK_WORKER_OPTS:-} -Dspark.worker.resource.gpu.amount=$gpus"
      SPARK_WORKER_OPTS="$SPARK_WORKER_OPTS -Dspark.worker.resource.gpu.discoveryScript=$script"
      export SPARK_WORKER_OPTS
    fi
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host "$host" --cores "$cores" --memory "$memory" --work-dir "$work_dir" \
      --webui-port "$webui" "$master"
    ;;
  *) die "unknown role '${role}': expected master or worker" ;;
esac
