#!/usr/bin/env bash
# descriptors: legitimate clients during a slowloris flood larger than the server's descriptor
# limit. Each front end runs with RLIMIT_NOFILE = LIMIT (soft and hard) and serves a 1 KiB file:
#   - "switch": the switchyard switch relaying to one switchyard node;
#   - "node":   the switchyard node alone;
#   - "haproxy": HAProxy (maxconn MAXCONN, timeout http-request 10 s) in front of the same node.
# For each, in alternating rounds: wrk alone for DURATION s (the normal rate), then SLOW slow
# connections (bench/descriptors/slowloris.py: a request head that never ends, a header line
# every 5 s, connections the server closes opened again) and, once the attackers have topped
# their connections up after the server's first sheds, wrk again while they are held. The
# table gives medians: normal and under-attack req/s, the ratio of each round's two, and
# non-2xx answers and socket errors wrk saw under attack. The attacking processes run niced
# (on a real site the attackers' CPU is not the server's; on this 2-core machine it is shared).
#
# Usage: bench/descriptors/run.sh
#        LIMIT=20000 SLOW=21000 DURATION=5 ROUNDS=3 CONNS=32 bench/descriptors/run.sh
# SWITCHYARD_BIN: the binary (default target/release/switchyard, built unless SKIP_BUILD is set).
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
LIMIT=${LIMIT:-20000}
SLOW=${SLOW:-21000}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
MAXCONN=${MAXCONN:-9000}
FRONTS=${FRONTS:-"switch node haproxy"}
NODE=18201; SW=18202; HAP=18203; ADM=18204
ulimit -n "$(ulimit -Hn)"
# The slow connections come from several processes, each within this shell's descriptor limit.
PER=$(( $(ulimit -n) - 1000 < 7000 ? $(ulimit -n) - 1000 : 7000 ))
[ "$PER" -gt 0 ] || { echo "this shell's descriptor limit is too low" >&2; exit 1; }
NSLOW=$(( (SLOW + PER - 1) / PER ))

for cmd in haproxy wrk python3 prlimit; do
    command -v "$cmd" >/dev/null || { echo "need $cmd (apt-get install haproxy wrk python3 util-linux)" >&2; exit 1; }
done
target=${CARGO_TARGET_DIR:-$top/target}
bin=${SWITCHYARD_BIN:-$target/release/switchyard}
[ -n "${SKIP_BUILD:-}" ] || [ -n "${SWITCHYARD_BIN:-}" ] || (cd "$top" && cargo build --release -q -p switchyard --bin switchyard)

work=$(mktemp -d /tmp/sy-fdbench-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
mkdir -p "$work/root"
head -c 1024 /dev/urandom > "$work/root/1k"
printf '[log]\nlevel = "error"\n' > "$work/sy.toml"

limited() { prlimit --nofile="$LIMIT:$LIMIT" -- "$@"; }
up() { for _ in $(seq 1 200); do curl -sf -m 2 -o /dev/null "http://127.0.0.1:$1/1k" && return 0; sleep 0.05; done; echo "port $1 did not come up" >&2; cat "$work"/*.log >&2; exit 1; }

limited "$bin" --config "$work/sy.toml" node --listen 127.0.0.1:$NODE --root "$work/root" > "$work/node.log" 2>&1 & pids+=($!)
up $NODE
limited "$bin" --config "$work/sy.toml" switch --listen 127.0.0.1:$SW --node 127.0.0.1:$NODE \
    --admin 127.0.0.1:$ADM --mechanism relay > "$work/switch.log" 2>&1 & pids+=($!)
up $SW
cat > "$work/haproxy.cfg" <<CFG
global
    maxconn $MAXCONN
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-request 10s
    timeout http-keep-alive 10s
frontend fe
    bind 127.0.0.1:$HAP
    default_backend be
backend be
    http-reuse always
    server n1 127.0.0.1:$NODE maxconn 1000
CFG
limited haproxy -f "$work/haproxy.cfg" -db > "$work/haproxy.log" 2>&1 & pids+=($!)
up $HAP

port_of() { case $1 in switch) echo $SW;; node) echo $NODE;; haproxy) echo $HAP;; esac; }

# wrk on PORT: "req/s non2xx socket_errors"
measure() {
    local out rps non2xx errs
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$1/1k" 2>&1)
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); non2xx=${non2xx:-0}
    errs=$(awk -F'[ ,]+' '/Socket errors/ {print $5+$7+$9+$11}' <<<"$out"); errs=${errs:-0}
    echo "$rps $non2xx $errs"
}

declare -A normal attacked bad errors ratios
for round in $(seq 1 "$ROUNDS"); do
    for f in $FRONTS; do
        p=$(port_of "$f")
        read -r rps _ _ < <(measure "$p")
        normal[$f]+="$rps "
        slows=()
        for k in $(seq 1 "$NSLOW"); do
            # Niced: on a real site the attackers' CPU is not the server's.
            nice -n 19 python3 "$here/slowloris.py" 127.0.0.1 "$p" $(( SLOW / NSLOW )) > "$work/slow.$k.log" 2>&1 & slows+=($!)
        done
        for k in $(seq 1 "$NSLOW"); do
            for _ in $(seq 1 600); do grep -q '^ready' "$work/slow.$k.log" && break; sleep 0.1; done
            grep -q '^ready' "$work/slow.$k.log" || { echo "slowloris did not get going against $f" >&2; cat "$work/slow.$k.log" >&2; exit 1; }
        done
        # Measure in the steady state of the attack: once every attacker has topped its
        # connections up again after the server's first sheds.
        for k in $(seq 1 "$NSLOW"); do
            for _ in $(seq 1 300); do grep -q '^round 1 ' "$work/slow.$k.log" && break; sleep 0.1; done
        done
        read -r rps non2xx errs < <(measure "$p")
        kill "${slows[@]}"; wait "${slows[@]}" 2>/dev/null || true
        attacked[$f]+="$rps "; bad[$f]+="$non2xx "; errors[$f]+="$errs "
        ratios[$f]+="$(awk -v a="$rps" -v n="$(awk '{print $NF}' <<<"${normal[$f]}")" 'BEGIN {printf "%.3f", a/n}') "
        echo "round $round $f: normal $(awk '{print $NF}' <<<"${normal[$f]}") attacked $rps non2xx $non2xx socket_errors $errs (slow connections: $(cat "$work"/slow.*.log | awk '/^ready/ {n += $2} END {print n}') opened)" >&2
        sleep 2  # the held connections close
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "| front end | normal req/s | req/s under $SLOW slow connections | ratio (median of rounds) | non-2xx | socket errors |"
echo "|---|---:|---:|---:|---:|---:|"
for f in $FRONTS; do
    n=$(median <<<"${normal[$f]}"); a=$(median <<<"${attacked[$f]}")
    echo "| $f | $n | $a | $(median <<<"${ratios[$f]}") | $(median <<<"${bad[$f]}") | $(median <<<"${errors[$f]}") |"
done
