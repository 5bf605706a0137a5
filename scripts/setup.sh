#!/usr/bin/env bash
# Installs everything kbroker needs on a fresh Debian 12 machine (idempotent):
#   Debian packages: zookeeper (the coordination service) and libnetty-java (its TLS port), kcat (a
#   librdkafka CLI used by tests/demo), Go and Sarama (the Go client the tests build), strace and iproute2 (tests and benchmarks), and the
#   native build's headers
#   a virtualenv in .venv with the pinned Python dependencies, then the native (Cython) build.
# A failed native build fails this script: there is no slow fallback.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
[ -f /usr/share/java/netty-handler.jar ] || need_apt+=(libnetty-java)   # ZooKeeper's TLS port (zk/local.py)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)   # ext/batch.pyx links zlib (gzip validation)
[ -f /usr/include/lz4.h ] || need_apt+=(liblz4-dev)    # ext/codec.pyx links liblz4 and libzstd (streaming
[ -f /usr/include/zstd.h ] || need_apt+=(libzstd-dev)  # validation of compressed batches)
[ -f /usr/include/openssl/ssl.h ] || need_apt+=(libssl-dev)  # ext/tls.pyx reads TLS records with libssl
command -v strace >/dev/null 2>&1 || need_apt+=(strace)  # tests observe the broker's sendfile and fsync calls
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)    # replication_bench --netns and its tests
command -v go >/dev/null 2>&1 || need_apt+=(golang-go)   # tests/cluster/test_sarama.py builds its client
[ -d /usr/share/gocode/src/github.com/Shopify/sarama ] || need_apt+=(golang-github-shopify-sarama-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "== installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating virtualenv .venv"
  "$PY" -m venv .venv
fi
# Each step below is skipped when what it was last done from is unchanged (a hash kept in .venv): a
# second run of the test command does not reinstall the dependencies or recompile the native code.
# What the native build is made from: ext/ minus the .c files Cython writes from a .pyx, the build files.
native_inputs() {
  for f in ext/*.pyx ext/*.pxd ext/*.pxi ext/*.h ext/*.c setup.py pyproject.toml; do
    case $f in *.c) [ -f "${f%.c}.pyx" ] && continue ;; esac
    echo "$f"
  done
}
stamp_of() { sha256sum "$@" | sha256sum | cut -d' ' -f1; }
PIP_PINS="pip==26.3 setuptools==84.2.1 wheel==0.48.0"
deps_stamp=$( (echo "$PIP_PINS"; cat requirements/dev.txt requirements/spark.txt) | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.kbroker-deps 2>/dev/null)" != "$deps_stamp" ]; then
  echo "== installing pinned Python dependencies"
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q --disable-pip-version-check -U $PIP_PINS
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/dev.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/spark.txt
  echo "$deps_stamp" > .venv/.kbroker-deps
fi
mapfile -t inputs < <(native_inputs)
native_stamp=$(stamp_of "${inputs[@]}")
native_ok() {
  .venv/bin/python -c "import kbroker._native.crc, kbroker._native.batch, kbroker._native.segment, kbroker._native.cleaner, kbroker._native.arrow, kbroker._native.request, kbroker._native.codec" 2>/dev/null
}
if [ "$(cat .venv/.kbroker-native 2>/dev/null)" != "$native_stamp" ] || ! native_ok; then
  echo "== building kbroker (Cython extensions)"
  rm -f .venv/.kbroker-native
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
  native_ok || { echo "native build missing: see the pip output above" >&2; exit 1; }
  echo "$native_stamp" > .venv/.kbroker-native
fi
echo "== setup complete: $ROOT/.venv/bin/kbroker"
