#!/usr/bin/env bash
# One command from a fresh machine to a running local cluster: installs everything (scripts/setup.sh),
# starts ZooKeeper and N brokers under ./cluster (state kept across runs; topics replicated on
# min(3, N) brokers), then a short produce/consume demo and the demo topic's leader, replicas and ISR.
# Stop it with: .venv/bin/kbroker cluster down --dir cluster
#   usage: scripts/cluster.sh [BROKERS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
N=${1:-3}
out=$(.venv/bin/kbroker cluster up --brokers "$N" --dir cluster --port "${KBROKER_PORT:-9092}" --zk-port "${KBROKER_ZK_PORT:-2181}")
echo "$out"
BOOT=$(echo "$out" | tail -n 1 | sed 's/^bootstrap.servers=//')
.venv/bin/python -m kbroker.demo --bootstrap-server "$BOOT"
.venv/bin/kbroker topics --bootstrap-server "$BOOT" --describe --topic kbroker-demo
echo
echo "Cluster running. bootstrap.servers=$BOOT"
echo "Stop it with: .venv/bin/kbroker cluster down --dir cluster"
