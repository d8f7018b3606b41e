#!/bin/sh
# shellcheck disable=SC2016  # the hooks' $1 is for mmdebstrap to expand
# Builds the podman image of docker/compose.yaml from Debian packages only (mmdebstrap, no
# registry), once per machine: the image is tagged torchspark-debian:<key>, <key> being a hash
# of the package list and of this recipe, and its root file system is kept as
# ~/.cache/torchspark/debian-image-<key>.tar (imported again if the image was removed).
# Prints the image name on stdout; progress goes to stderr.
#
# The image holds the JRE, tini, procps and the shared libraries the Python interpreter, torch
# and torchspark load; the Python side comes from the host through read-only bind mounts
# (tests/cluster/compose.podman.yaml): the interpreter, the dependency venv that
# tests/setup.sh installs, and the checkout with its .venv (at /opt/torchspark/venv, first on
# PATH), spark-node.sh and cluster_demo.py. As in docker/Dockerfile: Spark runs as uid 185
# (user spark) with the work dir /opt/spark-work, under tini. /root is world-searchable (0755):
# the host's interpreter and dependency venv are mounted at their host paths, which may lie
# under /root, so that uid 185 reaches them.
#
# Usage: docker/debian-image.sh [--print-key]     (root; needs mmdebstrap and podman)
# Environment: TSP_IMAGE_ENGINE=docker imports into Docker instead of podman.
set -eu

pkgs="openjdk-17-jre-headless procps tini libssl3 libffi8 libsqlite3-0 libexpat1 libbz2-1.0
liblzma5 zlib1g libncursesw6 libreadline8 libtirpc3 libuuid1 libstdc++6 libgomp1"
suite=bookworm
mirror=http://deb.debian.org/debian
env_path=/opt/torchspark/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
recipe="$suite $mirror $pkgs useradd-185 /opt/spark-work /opt/spark-home root-755 $env_path v2"
key=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
image=localhost/torchspark-debian:$key
[ "${1:-}" = "--print-key" ] && { echo "$key"; exit 0; }

engine=${TSP_IMAGE_ENGINE:-podman}
log() { echo "[debian-image] $*" >&2; }
cache=${XDG_CACHE_HOME:-$HOME/.cache}/torchspark
mkdir -p "$cache"
tar=$cache/debian-image-$key.tar
# One builder at a time per machine (several checkouts may set up at once).
exec 9> "$cache/debian-image.lock"
flock 9
if "$engine" image inspect "$image" > /dev/null 2>&1; then
  echo "$image"
  exit 0
fi
if [ ! -s "$tar" ]; then
  log "building $tar from Debian packages (once per machine; about 100 MB of downloads)"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  mmdebstrap --format=tar --variant=minbase --include="$(echo $pkgs | tr ' ' ,)" \
    --customize-hook='chroot "$1" useradd --uid 185 --create-home --home-dir /opt/spark-home spark' \
    --customize-hook='mkdir -p "$1/opt/spark-work" "$1/opt/torchspark/venv" && chown 185 "$1/opt/spark-work"' \
    --customize-hook='chmod 0755 "$1/root"' \
    --customize-hook='rm -rf "$1/var/lib/apt/lists"/* "$1/var/cache/apt"/*' \
    "$suite" "$tar.tmp" "$mirror" < /dev/null >&2
  mv "$tar.tmp" "$tar"
  log "built in $(( $(date +%s) - t0 )) s"
fi
log "importing $tar as $image"
"$engine" import \
  --change "ENV PATH=$env_path" \
  --change 'ENV PYSPARK_PYTHON=python3' \
  --change 'ENV PYSPARK_DRIVER_PYTHON=python3' \
  --change 'ENV SPARK_NO_DAEMONIZE=1' \
  --change 'USER 185' \
  --change 'WORKDIR /opt/spark-home' \
  --change 'ENTRYPOINT ["/usr/bin/tini", "--"]' \
  --change 'CMD ["spark-node.sh"]' \
  "$tar" "$image" >&2
echo "$image"
