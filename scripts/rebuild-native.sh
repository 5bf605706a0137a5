#!/usr/bin/env bash
# Rebuilds the Cython extensions of a checkout that scripts/setup.sh already set up, then swaps each
# new .so into ext/ with an atomic rename: a broker or test process that has the old module mapped
# keeps running (overwriting a mapped .so in place can crash it with SIGBUS).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
.venv/bin/python setup.py -q build_ext --build-lib "$out" >/dev/null
for so in "$out"/kbroker/_native/*.so; do
  name=$(basename "$so")
  cp "$so" "ext/.$name.new"
  mv -f "ext/.$name.new" "ext/$name"
done
echo "rebuilt: $(cd "$out/kbroker/_native" && ls *.so | tr '\n' ' ')"
