#!/usr/bin/env bash
# Seed 000 Figs. 11-13 (throughput, efficiency, time to first byte of RR, CF-LRU, CF-LFU, CF-REP,
# SC and Cyclone on 1, 2, 4 and 8 nodes) from switchyard's simulator, which runs the nodes' own
# owner map, caches and replication decisions.
#
#   bench/cyclone/figs11-13.sh synthetic   # the seed-000-shaped trace: 74,820 files, 650 MB, 1M requests
#   bench/cyclone/figs11-13.sh real        # the real log in /work/shared/data (or $LOG)
#   bench/cyclone/figs11-13.sh wide        # SC and Cyclone on 64 nodes (synthetic trace; static, 160
#                                          # clients only unless SETTINGS and CLIENTS say otherwise)
#
# Each run is done twice: with the node's defaults (hot from 200 aged references, a copy trusted
# for the 1 s revalidation interval) and tuned for a static site (hot from 20, copies trusted for
# 60 s); and with the paper's 38 clients and with 160 (enough to fill balanced links, see
# README.md). Writes results/<trace>-<setting>-c<clients>.{txt,csv} and a per-node CSV beside.
# Extra flags go to `sim cyclone`.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/cyclone/results}
TARGET=${CARGO_TARGET_DIR:-target}
LOG=${LOG:-/work/shared/data/apache_combined_2015.log}
what=${1:-synthetic}
shift || true
mkdir -p "$OUT"
cargo build --release -p switchyard-sim --example sim
SIM="$TARGET/release/examples/sim"

settings="defaults static" populations="38 160"
case "$what" in
synthetic) trace=(--scale 1 --requests 1000000 --seed 1) nodes=1,2,4,8 systems=all ;;
real) trace=(--trace "$LOG") nodes=1,2,4,8 systems=all ;;
wide)
    trace=(--scale 1 --requests 1000000 --seed 1) nodes=64 systems=SC,Cyclone
    settings=static populations=160
    ;;
*) echo "usage: $0 synthetic|real|wide [sim cyclone flags]" >&2; exit 2 ;;
esac

for setting in ${SETTINGS:-$settings}; do
    case "$setting" in
    defaults) rep=() ;;
    static) rep=(--hot-threshold 20 --replica-fresh-ms 60000) ;;
    esac
    for clients in ${CLIENTS:-$populations}; do
        name="$what-$setting-c$clients"
        echo "== $name"
        "$SIM" cyclone "${trace[@]}" --nodes "$nodes" --systems "$systems" --clients "$clients" \
            "${rep[@]}" --threads 2 --csv "$OUT/$name.csv" --node-csv "$OUT/$name-nodes.csv" "$@" \
            | tee "$OUT/$name.txt"
    done
done
