#!/usr/bin/env bash
# Speed of the simulator: a 1,000,000-request trace on 8 nodes (target: at most 5 s).
# Prints the simulation time (the engine run, as reported in `wall_secs`) and the whole
# process time (which adds generating the synthetic trace and grouping it into connections).
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p switchyard-sim --example sim
BIN="$TARGET/release/examples/sim"
printf '%-34s %10s %10s %12s\n' "1,000,000 requests, 8 nodes" "sim s" "process s" "req/s (sim)"
for run in "lard single 1.0" "wrr single 1.0" "lard single 1.1" "ext-lard forward 1.1" \
           "ext-lard handoff 1.1" "ext-lard ideal 1.1" "ext-lard relay 1.1"; do
    set -- $run
    start=$(date +%s.%N)
    json=$("$BIN" run --requests 1000000 --nodes 8 --policy "$1" --mechanism "$2" --http "$3" --json)
    end=$(date +%s.%N)
    wall=$(printf '%s' "$json" | grep -o '"wall_secs":[0-9.e-]*' | cut -d: -f2)
    total=$(echo "$end - $start" | bc -l)
    printf '%-34s %10.2f %10.2f %12.0f\n' "$1 / $2 / HTTP $3" "$wall" "$total" "$(echo "1000000 / $wall" | bc -l)"
done
