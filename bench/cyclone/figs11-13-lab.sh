#!/usr/bin/env bash
# Seed 000 Figs. 11-13 on real nodes (issue 12): one trace replayed in log order by HTTP/1.0
# connections through the lab's layer-4 director (nftables `fwd` per flow; this kernel has no
# IPVS) onto 1, 2, 4 and 8 real nodes whose links are shaped, for RR (the director alone),
# CF-LRU and CF-LFU (fetch from the owner, held, then sent), CF-REP (the same with hot-object
# replication: a fetched hot object is kept as a copy), SC (socket cloning, TCP_REPAIR) and
# Cyclone (SC with hot-object replication). Efficiency is the response bytes per second over
# what plain bulk TCP carries on the same links, measured in the same run. Root.
#
#   bench/cyclone/figs11-13-lab.sh synthetic   # trace synth --preset cyclone at SCALE, REQUESTS
#   bench/cyclone/figs11-13-lab.sh real        # the real log LOG
#
# Settings (environment): NODES="1 2 4 8" SYSTEMS="RR CF-LRU CF-LFU CF-REP SC Cyclone" CLIENTS=38
# LINK_MBIT=10 SCALE=0.1 REQUESTS=30000 SEED=1 DISK_US=50000 SETTING=static|defaults
# BULK_SECS=4 PREFIX=syfig LOG OUT REQUEST_LOG_DIR (the clients' per-request logs of each
# measured pass: issue, first byte, completion) BIN (a switchyard binary; default: the release
# build, made here). README.md ("Figs. 11-13 on real nodes") says why these values.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "bench/cyclone/figs11-13-lab.sh needs root (network namespaces)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
    CARGO_INCREMENTAL=0 cargo build --release --locked -p switchyard --bin switchyard
    export BIN="${CARGO_TARGET_DIR:-target}/release/switchyard"
fi
ulimit -n "$(ulimit -Hn)"
exec python3 bench/cyclone/lab_figs.py "$@"
