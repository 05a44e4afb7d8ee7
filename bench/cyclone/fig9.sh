#!/usr/bin/env bash
# Seed 000 Fig. 9 (the socket-cloning micro-benchmark) on links shaped to LINK_MBIT (tc tbf on
# both ends of every veth; netem is not in this kernel), in the namespace lab: normalized
# efficiency = throughput(mechanism) / throughput(one server alone), ONE client connection at a
# time (wrk -c1), HTTP/1.0 (a new connection per request), one file of each size asked again and
# again, as ApacheBench did in the paper:
#   single   the request goes straight to the node that owns the file (the client's route to the
#            VIP points at it): one server alone, nothing moves; measured in every lab, and each
#            mechanism is divided by its own lab's;
#   clone    two cooperative nodes (`lab up --cooperative --nodes 2`); the client's route to the
#            VIP points at the node that does NOT own the file, so every request is cloned to the
#            owner (TCP_REPAIR, the client's packets steered from the entry node), answered there
#            and the connection given back;
#   fetch    the same with `[cluster] mechanism = "fetch"`: the entry node fetches the whole
#            response from the owner's HTTP listener, holds it, then sends it (the paper's CF);
#   handoff  `lab up --mechanism handoff --nodes 2`: the switch reads each request and hands the
#            connection to a node (one-way; the paper's LARD front end).
# Per-clone overhead in microseconds, as the paper computed it (1/X_clone - 1/X_single at the
# smallest size), and from the entry node's own CPU histogram per cloned connection
# (`switchyard_node_clone_cpu_seconds`: steering entry, TCP_REPAIR dump, restore, removal of the
# entry), beside the paper's 46 us (PIII 733) and 134 us (PII 300).
#
# Usage: bench/cyclone/fig9.sh
#        DURATION=5 ROUNDS=3 LINK_MBIT=100 SIZES="128 1k 4k 16k 64k 256k 1m" \
#        MECHS="clone fetch handoff" PREFIX=fig9 WRK_TIMEOUT=10 bench/cyclone/fig9.sh
# Hot-object replication is off in the cooperative labs (every request through the mechanism).
# SWITCHYARD_BIN=/path/to/switchyard uses that binary and skips the build (SKIP_BUILD=1 skips it
# too, using $CARGO_TARGET_DIR/release/switchyard). DIAG=1 also samples, during one more
# transfer of the largest size per mechanism, `ss -tin` on the serving node and the entry node
# and the tbf counters of every link (written to $OUT/fig9-diag.txt). Needs root (network
# namespaces); installs wrk, curl and jq with apt-get when missing. Results go to stdout and
# $OUT/fig9.txt (OUT=bench/cyclone/results). All traffic stays inside the lab's namespaces; every
# lab is removed on exit, also after a failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
# shellcheck source=../lib/lab.sh
. "$top/bench/lib/lab.sh"
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
LINK_MBIT=${LINK_MBIT:-100}
SIZES=${SIZES:-"128 1k 4k 16k 64k 256k 1m"}
MECHS=${MECHS:-"clone fetch handoff"}
PREFIX=${PREFIX:-fig9}
WRK_TIMEOUT=${WRK_TIMEOUT:-10}
OUT=${OUT:-$top/bench/cyclone/results}
DIAG=${DIAG:-}
# Files of each size on the site: the owner map sends some of them to each node; the first one
# node 1 owns is the one asked for.
NFILES=8

usage() {
    sed -n '/^# Usage:/,/^# lab is removed/p' "$0" | sed 's/^# \{0,1\}//'
}
case "${1:-}" in -h | --help) usage; exit 0 ;; "") ;; *) usage >&2; exit 2 ;; esac

[ "$(id -u)" -eq 0 ] || { echo "bench/cyclone/fig9.sh needs root (network namespaces)" >&2; exit 1; }
for m in $MECHS; do
    case $m in clone | fetch | handoff) ;; *) echo "unknown mechanism in MECHS: $m (clone fetch handoff)" >&2; exit 2 ;; esac
done
size_bytes() {
    case $1 in
    *k) echo $((${1%k} * 1024)) ;;
    *m) echo $((${1%m} * 1048576)) ;;
    *[!0-9]* | "") return 1 ;;
    *) echo "$1" ;;
    esac
}
for s in $SIZES; do
    b=$(size_bytes "$s") || { echo "bad size in SIZES: $s (bytes, or with k or m)" >&2; exit 2; }
    [ "$b" -gt 0 ] || { echo "bad size in SIZES: $s" >&2; exit 2; }
done
has() { case " $MECHS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

lab_tools

lab_binary

cmdline="DURATION=$DURATION ROUNDS=$ROUNDS LINK_MBIT=$LINK_MBIT SIZES=\"$SIZES\" MECHS=\"$MECHS\" bench/cyclone/fig9.sh"

lab_workdir fig9
mkdir -p "$OUT"

# The site: NFILES files of each size, the same on both nodes.
root="$work/site"
mkdir -p "$root"
chmod 755 "$root"
for s in $SIZES; do
    for i in $(seq 0 $((NFILES - 1))); do
        head -c "$(size_bytes "$s")" /dev/urandom > "$root/f$s-$i"
    done
done

# paths.lua: wrk's requests for the one path given as its first argument, HTTP/1.0.
cat > "$work/paths.lua" <<'LUA'
local req
function init(args)
    req = "GET " .. args[1] .. " HTTP/1.0\r\nHost: lab\r\n\r\n"
end
function request()
    return req
end
LUA

status_field() { jq -r --arg h "$2" --arg f "$3" '.hosts[] | select(.name == $h) | .[$f]' "$work/$1.status.json"; }

# lab_up PREFIX ARGS...: a lab with two nodes and one client; its status in PREFIX.status.json.
lab_up() {
    local p=$1
    shift
    if [ -n "$(ip netns list | awk -v p="$p-" 'index($1, p) == 1')" ]; then
        timeout 120 "$bin" lab down --prefix "$p" >/dev/null
    fi
    labs+=("$p")
    timeout 180 "$bin" lab up --prefix "$p" --nodes 2 --clients 1 --link-mbit "$LINK_MBIT" --root "$root" "$@" > "$work/$p-up.out" 2>&1 ||
        { cat "$work/$p-up.out" >&2; exit 1; }
    timeout 30 "$bin" lab status --prefix "$p" --json > "$work/$p.status.json"
}

in_client() { local p=$1; shift; timeout 60 ip netns exec "$(status_field "$p" client0 netns)" "$@"; }

# metrics PREFIX NODE_INDEX: that node's Prometheus text, fetched from the client.
metrics() { in_client "$1" curl -s -m 5 "http://$(status_field "$1" "node$2" ip):9080/metrics"; }

# via PREFIX NODE_INDEX: the client's packets for the VIP go to that node (as a layer-4
# director in direct-routing mode would send them there); `via PREFIX` restores the lab's route.
via() {
    local vip
    vip=$(jq -r .vip "$work/$1.status.json")
    if [ -n "${2:-}" ]; then
        in_client "$1" ip route replace "$vip/32" via "$(status_field "$1" "node$2" ip)" dev eth0
    else
        in_client "$1" ip route del "$vip/32" 2>/dev/null || true
    fi
}

coop_peers_up() {
    for k in 0 1; do
        for _ in $(seq 200); do
            up=$(metrics "$1" "$k" | awk '$1 == "switchyard_node_cluster_peers_up" {print $2}')
            [ "${up:-0}" = 1 ] && break
            sleep 0.1
        done
        [ "${up:-0}" = 1 ] || { echo "$1: node$k's peer did not come up" >&2; exit 1; }
    done
}

# wait_ok PREFIX URL BYTES: until URL answers 200 with BYTES bytes from the client.
wait_ok() {
    local got
    for _ in $(seq 150); do
        got=$(in_client "$1" curl -s -m 5 -H "Host: lab" -o /dev/null -w '%{http_code} %{size_download}' "$2" || true)
        [ "$got" = "200 $3" ] && return 0
        sleep 0.2
    done
    echo "$1: $2 did not answer (got '$got', want '200 $3')" >&2
    exit 1
}

# No hot-object replication: the one file asked again and again would turn hot after a few
# hundred requests, and the entry node would answer it from its copy instead of cloning or
# fetching (seed 000 measured the mechanisms alone; replication is Figs. 11-13's).
cat > "$work/no-replication.toml" <<'TOML'
[cluster]
members = []
[cluster.replication]
enabled = false
TOML
chmod 644 "$work/no-replication.toml"
clone_lab=${PREFIX}c
fetch_lab=${PREFIX}f
switch_lab=${PREFIX}h
coop_labs=()
norep=--node-arg=--config=$work/no-replication.toml
has clone && { lab_up "$clone_lab" --cooperative "$norep"; coop_labs+=("$clone_lab"); }
has fetch && { lab_up "$fetch_lab" --cooperative "$norep" --node-arg=--cluster-mechanism=fetch; coop_labs+=("$fetch_lab"); }
has handoff && lab_up "$switch_lab" --mechanism handoff
for p in "${coop_labs[@]}"; do coop_peers_up "$p"; done

# The file of each size that node 1 owns (the same owner map in every cooperative lab): a
# request sent to a node's own address is served there, and counted as its own when it owns it.
# The owner map hashes the Host field too: every request here says `Host: lab`, as wrk's do.
declare -A file
owner_lab=${coop_labs[0]:-}
for s in $SIZES; do
    if [ -z "$owner_lab" ]; then file[$s]="/f$s-0"; continue; fi
    for i in $(seq 0 $((NFILES - 1))); do
        before=$(metrics "$owner_lab" 1 | awk '$1 == "switchyard_node_cluster_owned_requests_total" {print $2 + 0}')
        in_client "$owner_lab" curl -s -m 5 -o /dev/null -H "Host: lab" "http://$(status_field "$owner_lab" node1 ip)/f$s-$i"
        after=$(metrics "$owner_lab" 1 | awk '$1 == "switchyard_node_cluster_owned_requests_total" {print $2 + 0}')
        if [ "$after" -gt "$before" ]; then file[$s]="/f$s-$i"; break; fi
    done
    [ -n "${file[$s]:-}" ] || { echo "node1 owns none of the $NFILES files of size $s" >&2; exit 1; }
done
for p in "${coop_labs[@]}"; do
    vip=$(jq -r .vip "$work/$p.status.json")
    for k in 0 1; do
        via "$p" "$k"
        for s in $SIZES; do wait_ok "$p" "http://$vip${file[$s]}" "$(size_bytes "$s")"; done
    done
done
if has handoff; then
    vip=$(jq -r .vip "$work/$switch_lab.status.json")
    for s in $SIZES; do wait_ok "$switch_lab" "http://$vip${file[$s]}" "$(size_bytes "$s")"; done
fi

# wrk_run PREFIX URL PATH -> requests/s, "err" after it when wrk saw errors.
wrk_run() {
    local o
    o=$(timeout -k 5 $((DURATION + 30)) ip netns exec "$(status_field "$1" client0 netns)" \
        wrk -t1 -c1 -d"${DURATION}s" --timeout "${WRK_TIMEOUT}s" -s "$work/paths.lua" "$2" -- "$3" 2>&1) || true
    local r e
    r=$(awk '/^Requests\/sec/ {print $2; exit}' <<<"$o")
    e=$(grep -E 'Socket errors|Non-2xx' <<<"$o" | tr -s ' \n' ' ' || true)
    echo "${r:-0}${e:+ err: $e}"
}

# measure MECH SIZE -> "single_rps mech_rps"
measure() {
    local m=$1 s=$2 lab vip single mech
    case $m in clone) lab=$clone_lab ;; fetch) lab=$fetch_lab ;; handoff) lab=$switch_lab ;; esac
    vip=$(jq -r .vip "$work/$lab.status.json")
    if [ "$m" = handoff ]; then
        single=$(wrk_run "$lab" "http://$(status_field "$lab" node0 ip)/" "${file[$s]}")
        mech=$(wrk_run "$lab" "http://$vip/" "${file[$s]}")
    else
        via "$lab" 1
        single=$(wrk_run "$lab" "http://$vip/" "${file[$s]}")
        via "$lab" 0
        mech=$(wrk_run "$lab" "http://$vip/" "${file[$s]}")
    fi
    case "$single $mech" in *err*) echo "$m $s: wrk reported errors: single $single, $m $mech" >&2 ;; esac
    echo "${single%% *} ${mech%% *}"
}

declare -A singles mechs
for round in $(seq 1 "$ROUNDS"); do
    for s in $SIZES; do
        for m in $MECHS; do
            read -r a b <<<"$(measure "$m" "$s")"
            singles["$m $s"]+="$a "
            mechs["$m $s"]+="$b "
            echo "round $round: $s $m: single $a req/s, $m $b req/s" >&2
        done
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}'; }

# hist_median FAMILY METRICS_FILE: the median of a histogram in seconds (interpolated within
# the bucket that holds the middle observation), or nothing without observations.
hist_median() {
    local total
    total=$(awk -v f="$1_count" '$1 == f {t += $NF} END {print t + 0}' "$2")
    [ "$total" != 0 ] || return 0
    awk -v f="$1_bucket" 'index($0, f "{") == 1 {
             match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
             if (le != "+Inf") n[le] += $NF }
         END { for (le in n) print le, n[le] }' "$2" | sort -g |
        awk -v total="$total" '
            { if (!done && $2 >= total / 2) {
                  f = ($2 > pn) ? (total / 2 - pn) / ($2 - pn) : 0
                  printf "%.1f %d\n", (pl + f * ($1 - pl)) * 1e6, total
                  done = 1 }
              pl = $1; pn = $2 }'
}

{
    echo "Command: $cmdline"
    echo "$(date -u +%Y-%m-%d), load average $(cut -d' ' -f1-3 /proc/loadavg), links $LINK_MBIT Mbit/s, 2 nodes, 1 client, one connection at a time, HTTP/1.0"
    echo
    printf '| size | file |'
    for m in $MECHS; do printf ' single (%s lab) req/s | %s req/s | %s efficiency |' "$m" "$m" "$m"; done
    echo
    printf '|---|---|'
    for m in $MECHS; do printf -- '---:|---:|---:|'; done
    echo
    for s in $SIZES; do
        printf '| %s | %s |' "$s" "${file[$s]}"
        for m in $MECHS; do
            a=$(echo "${singles["$m $s"]}" | median)
            b=$(echo "${mechs["$m $s"]}" | median)
            awk -v a="$a" -v b="$b" 'BEGIN {printf " %.1f | %.1f | %.3f |", a, b, (a > 0 ? b / a : 0)}'
        done
        echo
    done
    echo
    first=${SIZES%% *}
    for m in $MECHS; do
        a=$(echo "${singles["$m $first"]}" | median)
        b=$(echo "${mechs["$m $first"]}" | median)
        awk -v m="$m" -v s="$first" -v a="$a" -v b="$b" 'BEGIN {
            if (a > 0 && b > 0) printf "%s: time per request at %s: %.1f us alone, %.1f us with %s: overhead %.1f us per request (1/X_%s - 1/X_single)\n", m, s, 1e6 / a, 1e6 / b, m, 1e6 / b - 1e6 / a, m }'
    done
    if has clone; then
        metrics "$clone_lab" 0 > "$work/clone-metrics"
        cpu=$(hist_median switchyard_node_clone_cpu_seconds "$work/clone-metrics")
        lat=$(hist_median switchyard_node_clone_seconds "$work/clone-metrics")
        [ -z "$cpu" ] || echo "clone: entry node's CPU per cloned connection (steering entry, dump, restore, removal): median ${cpu% *} us over ${cpu#* } clones (histogram, interpolated)"
        [ -z "$lat" ] || echo "clone: Create to Accepted at the entry node: median ${lat% *} us over ${lat#* } clones"
        fb=$(awk '/^switchyard_node_clone_fallbacks_total/ {t += $NF} END {print t + 0}' "$work/clone-metrics")
        echo "clone: fallbacks (requests served at the entry node after all): $fb"
        # What the clone column measured: the entry node's own answers against its clones.
        own=$(awk '/^switchyard_node_requests_total/ {t += $NF} END {print t + 0}' "$work/clone-metrics")
        out=$(awk '/^switchyard_node_clones_out_total/ {t += $NF} END {print t + 0}' "$work/clone-metrics")
        echo "clone: entry node cloned $out requests and answered $own itself (owner probes and wait checks included)"
        rh=$(awk '/^switchyard_node_replica_hits/ {t += $NF} END {print t + 0}' "$work/clone-metrics")
        echo "clone: replica hits at the entry node: $rh (replication is off here)"
    fi
    if has fetch; then
        metrics "$fetch_lab" 0 > "$work/fetch-metrics"
        f=$(awk '/^switchyard_node_cluster_fetches_total/ {t += $NF} END {print t + 0}' "$work/fetch-metrics")
        h=$(awk '/^switchyard_node_cluster_fetches_held_total/ {t += $NF} END {print t + 0}' "$work/fetch-metrics")
        x=$(awk '/^switchyard_node_cluster_fetch_failures_total/ {t += $NF} END {print t + 0}' "$work/fetch-metrics")
        echo "fetch: entry node fetched $f responses, $h held whole before sending, $x failures"
    fi
    echo "paper (seed 000 §4.2): SC overhead 46 us (PIII 733) and 134 us (PII 300), LARD 194 us (PII 300); SC nearly 1.0 for large files, CF about 0.5, LARD below 0.8"
} | tee "$OUT/fig9.txt.new"
mv "$OUT/fig9.txt.new" "$OUT/fig9.txt"

# DIAG: what one more transfer of the largest size looks like on the wire.
if [ -n "$DIAG" ]; then
    big=${SIZES##* }
    {
        echo "Diagnostics: one transfer of ${file[$big]} per mechanism (client: curl, HTTP/1.0)"
        for m in $MECHS; do
            [ "$m" != handoff ] || continue
            case $m in clone) lab=$clone_lab ;; fetch) lab=$fetch_lab ;; esac
            vip=$(jq -r .vip "$work/$lab.status.json")
            for entry in 1 0; do
                via "$lab" "$entry"
                echo
                echo "== $m, entry node$entry (node1 owns the file)"
                for h in node0 node1 client0 switch; do
                    ns=$(status_field "$lab" "$h" netns)
                    echo "-- tc before, $h: $(ip netns exec "$ns" tc -s qdisc show dev eth0 | tr -s ' \n' ' ')"
                done
                ( for _ in $(seq 40); do
                      for h in node0 node1; do
                          ns=$(status_field "$lab" "$h" netns)
                          ip netns exec "$ns" ss -tin "( sport = :80 )" 2>/dev/null | sed "s/^/$h /" | grep -v '^[a-z0-9]* State' || true
                      done
                      sleep 0.02
                  done ) > "$work/ss.txt" &
                sampler=$!
                in_client "$lab" curl -s -m 20 -H "Host: lab" -o /dev/null -w 'curl: %{http_code} %{size_download} B, connect %{time_connect} s, first byte %{time_starttransfer} s, total %{time_total} s\n' "http://$vip${file[$big]}"
                wait "$sampler" || true
                grep -E 'cwnd|bytes_acked' "$work/ss.txt" | grep -v 'cwnd:10 .*bytes_acked:1 ' | head -n 12 || true
                for h in node0 node1 client0 switch; do
                    ns=$(status_field "$lab" "$h" netns)
                    echo "-- tc after, $h: $(ip netns exec "$ns" tc -s qdisc show dev eth0 | tr -s ' \n' ' ')"
                done
            done
        done
    } > "$OUT/fig9-diag.txt" 2>&1
    echo "diagnostics in $OUT/fig9-diag.txt" >&2
fi
