#!/usr/bin/env bash
# Micro-benchmark of one TCP handoff: switch side (eBPF steering insert +
# TCP_REPAIR dump + close) and node side (TCP_REPAIR restore), median and
# p99 in µs, over N real client connections between network namespaces.
# Needs root; installs clang/bpftool/nftables through scripts/install-lab-deps.
#
#   bench/handoff-micro/run.sh [N]      (default N = 2000)
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/install-lab-deps
exec cargo bench -p switchyard-lab --bench handoff_micro -- "${1:-2000}"
