#!/usr/bin/env bash
# locality: what content-aware dispatching buys. 4 switchyard nodes, each with an object cache a
# third of the working set and an emulated disk (every miss waits DISK_US on one FIFO disk per
# node), a Zipf-like request stream over the working set (wrk with a Lua path list), and the
# switch with round robin, LARD, LARD with replication and bounded consistent hashing. For each
# policy the nodes start cold, wrk warms them for WARM seconds, then the measured run: aggregate
# cache hit rate (from the nodes' own counters) and throughput.
#
# Usage: bench/switch-vs-haproxy/locality.sh
#        FILES=3000 SIZE=8192 ALPHA=0.4 DISK_US=1500 WARM=5 DURATION=10 bench/switch-vs-haproxy/locality.sh
# SWITCH_BIN as in run.sh. Traffic goes to 127.0.0.1 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
FILES=${FILES:-3000}
SIZE=${SIZE:-8192}
ALPHA=${ALPHA:-0.4}
DISK_US=${DISK_US:-1500}
WARM=${WARM:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-"rr lard lard-r chash"}
SW=18300; NODE0=18301; ADMIN0=18401
ulimit -n "$(ulimit -Hn)"
for cmd in wrk curl python3; do
    command -v "$cmd" >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk curl python3; }
done
target=${CARGO_TARGET_DIR:-$top/target}
[ -n "${SKIP_BUILD:-}" ] || (cd "$top" && cargo build --release -q -p switchyard --bin switchyard && cargo build --release -q -p switchyard-switch --example switch)
bin="$target/release/switchyard"
if [ -z "${SWITCH_BIN:-}" ]; then
    if "$bin" switch --help >/dev/null 2>&1; then SWITCH_BIN="$bin switch"; else SWITCH_BIN="$target/release/examples/switch"; fi
fi

work=$(mktemp -d /tmp/sy-locality-XXXXXX)
pids=()
stop_all() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT

root="$work/root"; mkdir -p "$root"
python3 - "$root" "$FILES" "$SIZE" "$ALPHA" "$work/paths.txt" <<'PY'
import os, random, sys
root, n, size, alpha, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
rng = random.Random(7)
for i in range(n):
    with open(os.path.join(root, f"f{i}"), "wb") as f:
        f.write(rng.randbytes(size))
# Zipf-like popularity: the object of rank r has weight 1 / r^alpha; ranks shuffled over names.
names = [f"/f{i}" for i in range(n)]
rng.shuffle(names)
weights = [1.0 / (r + 1) ** alpha for r in range(n)]
with open(out, "w") as f:
    for p in rng.choices(names, weights, k=400_000):
        f.write(p + "\n")
PY
cat > "$work/paths.lua" <<LUA
local paths = {}
for line in io.lines("$work/paths.txt") do paths[#paths + 1] = line end
local i = 0
function init(args) i = math.random(1, #paths) end
function request()
    i = i + 1
    if i > #paths then i = 1 end
    return wrk.format("GET", paths[i])
end
LUA
cache=$((FILES * SIZE / 3))

node_sum() { # metric name
    local t=0
    for k in 0 1 2 3; do
        v=$(curl -sf "http://127.0.0.1:$((ADMIN0 + k))/metrics" | awk -v m="$1" '$1==m {print $2}')
        t=$(awk -v a="$t" -v b="${v:-0}" 'BEGIN {print a+b}')
    done
    echo "$t"
}

echo "$FILES objects of $SIZE bytes ($((FILES * SIZE / 1048576)) MiB), Zipf alpha $ALPHA, 4 nodes with $((cache / 1048576)) MiB cache each (a third of the set), emulated disk ${DISK_US} µs per miss; wrk -t$THREADS -c$CONNS, warm ${WARM}s, measured ${DURATION}s"
echo
echo "| policy | hit rate | req/s | p99 ms |"
echo "|---|---:|---:|---:|"
for policy in $POLICIES; do
    nodes=()
    for k in 0 1 2 3; do
        "$bin" node --listen 127.0.0.1:$((NODE0 + k)) --admin 127.0.0.1:$((ADMIN0 + k)) --root "$root" \
            --workers 1 --cache-bytes "$cache" --disk-latency-us "$DISK_US" 2>"$work/node-$k.log" &
        pids+=($!)
        nodes+=(--node 127.0.0.1:$((NODE0 + k)))
    done
    $SWITCH_BIN --listen 127.0.0.1:$SW "${nodes[@]}" --policy "$policy" --workers 2 2>"$work/switch.log" &
    pids+=($!)
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$SW/f0" && break; sleep 0.1; done
    wrk -t"$THREADS" -c"$CONNS" -d"${WARM}s" -s "$work/paths.lua" "http://127.0.0.1:$SW/" >/dev/null
    h0=$(node_sum switchyard_node_cache_hits_total); m0=$(node_sum switchyard_node_cache_misses_total)
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency -s "$work/paths.lua" "http://127.0.0.1:$SW/")
    h1=$(node_sum switchyard_node_cache_hits_total); m1=$(node_sum switchyard_node_cache_misses_total)
    rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
    p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")
    errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
    [ -n "$errs" ] && echo "  note: $policy: $errs" >&2
    awk -v p="$policy" -v h="$((${h1%.*} - ${h0%.*}))" -v m="$((${m1%.*} - ${m0%.*}))" -v r="$rps" -v l="$p99" \
        'BEGIN {printf "| %s | %.1f%% | %.0f | %.1f |\n", p, 100*h/(h+m), r, l}'
    stop_all
    sleep 0.5
done
