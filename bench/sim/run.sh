#!/usr/bin/env bash
# Reproduces seed 003 §5–§6 with switchyard's cluster simulator and checks it against real nodes.
#
#   bench/sim/run.sh                # full size: 1,000,000 requests, 31,000 targets, 1.015 GB
#   OUT=/tmp/sim bench/sim/run.sh --nodes 1,2,4,8   # extra flags go to `sim paper`
#
# Writes to $OUT (default bench/sim/out): results.json, findings.md, <preset>-runs.csv,
# <preset>-nodes.csv, <preset>-throughput.svg (Figs. 7/8), <preset>-crossover.svg/.csv
# (Figs. 5/6), realcheck-*.json (simulated vs real hit rates) and speed.txt.
# `switchyard sim paper --out DIR` runs the same reproduction from the switchyard binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/sim/out}
TARGET=${CARGO_TARGET_DIR:-target}
mkdir -p "$OUT"

cargo build --release -p switchyard-sim --example sim --example realcheck
BIN="$TARGET/release/examples"

echo "== seed 003 Figs. 5–8 (sim paper)"
"$BIN/sim" paper --out "$OUT" "$@" | tee "$OUT/paper.txt"

echo "== simulated vs real hit rates (nodes on loopback)"
"$BIN/realcheck" --nodes 4 --scale 0.05 --requests 100000 --clients 8 --policy lard --http 1.0 \
    | tee "$OUT/realcheck-lard-http10.json"
"$BIN/realcheck" --nodes 4 --scale 0.05 --requests 100000 --clients 8 --policy wrr --http 1.1 \
    | tee "$OUT/realcheck-wrr-http11.json"
"$BIN/realcheck" --nodes 8 --scale 0.05 --requests 100000 --clients 16 --policy lard --http 1.1 \
    | tee "$OUT/realcheck-lard-http11.json"

echo "== speed"
bench/sim/speed.sh | tee "$OUT/speed.txt"
