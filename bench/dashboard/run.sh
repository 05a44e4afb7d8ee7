#!/usr/bin/env bash
# dashboard: what live dashboard viewers cost the switch. The switch relays a 1 KiB file from
# one node; VIEWERS clients hold its /events stream (server-sent events, one update a second).
#   1. idle: the switch's CPU over IDLE seconds with no viewer, then with VIEWERS viewers
#      (percent of one core, from /proc/PID/stat);
#   2. under load: wrk -t2 -c32 for DURATION s, with no viewer and with VIEWERS viewers:
#      requests per second and p99 latency.
# Alternating rounds; the table gives medians.
#
# Usage: bench/dashboard/run.sh
#        VIEWERS=50 IDLE=10 DURATION=5 ROUNDS=3 bench/dashboard/run.sh
# SWITCHYARD_BIN: the binary (default target/release/switchyard, built unless SKIP_BUILD is set).
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
VIEWERS=${VIEWERS:-50}
IDLE=${IDLE:-10}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
NODE=18301; SW=18302; ADM=18303
for cmd in wrk curl; do
    command -v "$cmd" >/dev/null || { echo "need $cmd (apt-get install wrk curl)" >&2; exit 1; }
done
target=${CARGO_TARGET_DIR:-$top/target}
bin=${SWITCHYARD_BIN:-$target/release/switchyard}
[ -n "${SKIP_BUILD:-}" ] || [ -n "${SWITCHYARD_BIN:-}" ] || (cd "$top" && cargo build --release -q -p switchyard --bin switchyard)

work=$(mktemp -d /tmp/sy-dashbench-XXXXXX)
pids=(); viewers=()
cleanup() {
    for p in "${viewers[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
mkdir -p "$work/root"
head -c 1024 /dev/urandom > "$work/root/1k"
printf '[log]\nlevel = "error"\n' > "$work/sy.toml"
up() { for _ in $(seq 1 200); do curl -sf -m 2 -o /dev/null "$1" && return 0; sleep 0.05; done; echo "$1 did not come up" >&2; exit 1; }

"$bin" --config "$work/sy.toml" node --listen 127.0.0.1:$NODE --root "$work/root" > "$work/node.log" 2>&1 & pids+=($!)
up "http://127.0.0.1:$NODE/1k"
"$bin" --config "$work/sy.toml" switch --listen 127.0.0.1:$SW --node 127.0.0.1:$NODE \
    --admin 127.0.0.1:$ADM --mechanism relay > "$work/switch.log" 2>&1 & sw=$!; pids+=($sw)
up "http://127.0.0.1:$SW/1k"
up "http://127.0.0.1:$ADM/"

ticks() { awk '{print $14 + $15}' "/proc/$sw/stat"; }
hz=$(getconf CLK_TCK)
# Percent of one core the switch used over $1 seconds.
cpu_over() {
    local a b
    a=$(ticks); sleep "$1"; b=$(ticks)
    awk -v a="$a" -v b="$b" -v s="$1" -v hz="$hz" 'BEGIN {printf "%.2f", (b - a) / hz / s * 100}'
}
start_viewers() {
    for _ in $(seq 1 "$VIEWERS"); do
        curl -sN "http://127.0.0.1:$ADM/events" > /dev/null 2>&1 & viewers+=($!)
    done
    # Every viewer has its stream open once the admin port holds that many connections.
    for _ in $(seq 1 100); do
        n=$(ss -Htn state established "( sport = :$ADM )" | wc -l)
        [ "$n" -ge "$VIEWERS" ] && return 0
        sleep 0.1
    done
    echo "only $n of $VIEWERS viewers connected" >&2
}
stop_viewers() { for p in "${viewers[@]}"; do kill "$p" 2>/dev/null || true; done; wait "${viewers[@]}" 2>/dev/null || true; viewers=(); }
# wrk: "req/s p99_ms"
load() {
    local out
    out=$(wrk -t2 -c32 -d"${DURATION}s" --latency "http://127.0.0.1:$SW/1k" 2>&1)
    awk '/Requests\/sec/ {r=$2} /^ +99%/ {v=$2; if (v ~ /us$/) {sub(/us/, "", v); v/=1000} else if (v ~ /ms$/) {sub(/ms/, "", v)} else if (v ~ /s$/) {sub(/s/, "", v); v*=1000}; p=v} END {print r, p}' <<<"$out"
}

declare -A col
for round in $(seq 1 "$ROUNDS"); do
    col[idle0]+="$(cpu_over "$IDLE") "
    read -r r p < <(load); col[rps0]+="$r "; col[p990]+="$p "
    start_viewers
    col[idleV]+="$(cpu_over "$IDLE") "
    read -r r p < <(load); col[rpsV]+="$r "; col[p99V]+="$p "
    stop_viewers
    echo "round $round: idle CPU % $(awk '{print $NF}' <<<"${col[idle0]}") -> $(awk '{print $NF}' <<<"${col[idleV]}")" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "| viewers | switch CPU idle (% of a core) | req/s under load | p99 under load (ms) |"
echo "|---:|---:|---:|---:|"
echo "| 0 | $(median <<<"${col[idle0]}") | $(median <<<"${col[rps0]}") | $(median <<<"${col[p990]}") |"
echo "| $VIEWERS | $(median <<<"${col[idleV]}") | $(median <<<"${col[rpsV]}") | $(median <<<"${col[p99V]}") |"
