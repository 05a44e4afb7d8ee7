#!/usr/bin/env bash
# cooperative: seed 000's cluster without a front end, in the namespace lab (`switchyard lab`),
# with the links shaped (tc tbf, LINK_MBIT per link and direction; netem is not in this kernel)
# so that the links, not this machine's two cores, are the limit. NODES node hosts and CLIENTS
# client hosts (CLIENTS = NODES by default: every client link as wide as a node's), every node
# with the same site: NFILES files of each size, spread over the nodes by the owner map. wrk runs
# in the client namespaces, one per client host, CONNS connections split between them, in
#   coop     `lab up --cooperative`: a layer-4 director (nftables `fwd` per flow hash, LVS direct
#            routing; this kernel has no IPVS) spreads connections over cooperative nodes; a
#            request owned by another node than the entry node moves there with its connection
#            (TCP_REPAIR, steered from the entry node) and comes back once answered;
#   spread   `lab up --cooperative --alone`: the same director in front of nodes that serve
#            every request themselves (no content awareness: every node caches every file);
#   handoff  `lab up --mechanism handoff`: the switch reads each request and hands the
#            connection to the node the policy chose (one-way: the node answers directly);
#   ideal    the cooperative lab, each request sent straight to its owner's own address (client
#            host k talks to node k, asking only for node k's files): no move at all;
# with HTTP/1.0 (one request per connection) and HTTP/1.1 keep-alive, in alternating rounds;
# medians of requests/s. The owner of every file is learnt first from the nodes' counters (a
# request sent to a node's own address is counted as its own when the node owns it).
#
# BALANCE=1 (the default): the site's files are chosen so that the owner map gives every node
# the same number of them (NFILES / NODES each, picked in name order from BALANCE_CANDIDATES
# per size), so that every mechanism is asked for the same files and no node's link carries
# more of them than another's: the comparison then measures moving, not how a hash happens to
# split a handful of equally popular files. BALANCE=0 asks for the first NFILES files, however
# the map splits them (the ideal still asks each node only for its own files, so it stays
# balanced while the others follow the map).
#
# CPU per moved connection on the sending node: every cooperative node keeps a histogram of its
# own CPU time per connection it cloned across hosts and got back (steering entry, TCP_REPAIR dump,
# restore, removal of the entry; `switchyard_node_clone_cpu_seconds`); the script reports the
# median over all nodes after the coop runs (target <= 40 us).
#
# Usage: bench/cooperative/run.sh
#        DURATION=10 ROUNDS=3 CONNS=48 NODES=3 CLIENTS=3 LINK_MBIT=100 NFILES=32 \
#        SIZES="1k 10k 100k 1m" MODES="http10 keepalive" MECHS="coop spread handoff ideal" \
#        BALANCE=1 BALANCE_CANDIDATES=96 PREFIX=sycoop WRK_TIMEOUT=10 bench/cooperative/run.sh
# SWITCHYARD_BIN=/path/to/switchyard uses that binary and skips the build (SKIP_BUILD=1 skips it
# too, using $CARGO_TARGET_DIR/release/switchyard). Needs root (network namespaces); installs wrk,
# curl and jq with apt-get when missing. All traffic stays inside the lab's namespaces; every lab
# is removed on exit, also after a failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
# shellcheck source=../lib/lab.sh
. "$top/bench/lib/lab.sh"
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-48}
NODES=${NODES:-3}
CLIENTS=${CLIENTS:-$NODES}
LINK_MBIT=${LINK_MBIT:-100}
NFILES=${NFILES:-32}
SIZES=${SIZES:-"1k 10k 100k 1m"}
MODES=${MODES:-"http10 keepalive"}
MECHS=${MECHS:-"coop spread handoff ideal"}
PREFIX=${PREFIX:-sycoop}
WRK_TIMEOUT=${WRK_TIMEOUT:-10}
BALANCE=${BALANCE:-1}
BALANCE_CANDIDATES=${BALANCE_CANDIDATES:-$((NFILES * 3))}

usage() {
    sed -n '/^# Usage:/,/^# is removed/p' "$0" | sed 's/^# \{0,1\}//'
}
case "${1:-}" in -h | --help) usage; exit 0 ;; "") ;; *) usage >&2; exit 2 ;; esac

[ "$(id -u)" -eq 0 ] || { echo "bench/cooperative/run.sh needs root (network namespaces)" >&2; exit 1; }
for m in $MECHS; do
    case $m in coop | spread | handoff | ideal) ;; *) echo "unknown mechanism in MECHS: $m" >&2; exit 2 ;; esac
done
size_bytes() { case $1 in 1k) echo 1024 ;; 10k) echo 10240 ;; 100k) echo 102400 ;; 1m) echo 1048576 ;; *) return 1 ;; esac; }
for s in $SIZES; do size_bytes "$s" >/dev/null || { echo "unknown size in SIZES: $s (1k 10k 100k 1m)" >&2; exit 2; }; done
for m in $MODES; do
    case $m in http10 | keepalive) ;; *) echo "unknown mode in MODES: $m" >&2; exit 2 ;; esac
done
[ "$CLIENTS" -ge "$NODES" ] || { echo "CLIENTS must be at least NODES (ideal pairs client k with node k)" >&2; exit 2; }
case $BALANCE in 0 | 1) ;; *) echo "BALANCE must be 0 or 1" >&2; exit 2 ;; esac
if [ "$BALANCE" = 1 ]; then
    [ "$NFILES" -ge "$NODES" ] || { echo "BALANCE=1 needs NFILES >= NODES" >&2; exit 2; }
    [ "$BALANCE_CANDIDATES" -ge "$NFILES" ] || { echo "BALANCE_CANDIDATES must be at least NFILES" >&2; exit 2; }
    per_node=$((NFILES / NODES))
    NFILES=$((per_node * NODES))
    site_files=$BALANCE_CANDIDATES
else
    site_files=$NFILES
fi
has() { case " $MECHS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# The owners are learnt in the cooperative lab: it comes up for coop, ideal and a balanced site.
needs_owners() { has ideal || [ "$BALANCE" = 1 ]; }

lab_tools

lab_binary

cmdline="DURATION=$DURATION ROUNDS=$ROUNDS CONNS=$CONNS NODES=$NODES CLIENTS=$CLIENTS LINK_MBIT=$LINK_MBIT NFILES=$NFILES SIZES=\"$SIZES\" MODES=\"$MODES\" MECHS=\"$MECHS\" BALANCE=$BALANCE BALANCE_CANDIDATES=$BALANCE_CANDIDATES bench/cooperative/run.sh"

lab_workdir coop

# The site: the same files on every node.
root="$work/site"
mkdir -p "$root"
chmod 755 "$root"
for s in $SIZES; do
    head -c "$(size_bytes "$s")" /dev/urandom > "$work/$s.data"
    for i in $(seq 0 $((site_files - 1))); do cp "$work/$s.data" "$root/$s-$i"; done
    rm "$work/$s.data"
done

# paths.lua: wrk's requests, round robin over the paths in the file given as its first argument,
# HTTP/1.0 or HTTP/1.1 keep-alive (second argument).
cat > "$work/paths.lua" <<'LUA'
local paths = {}
local i = 0
local version = "HTTP/1.1"
function init(args)
    for line in io.lines(args[1]) do paths[#paths + 1] = line end
    if args[2] == "http10" then version = "HTTP/1.0" end
    i = math.random(0, #paths - 1)
end
function request()
    i = (i % #paths) + 1
    return "GET " .. paths[i] .. " " .. version .. "\r\nHost: lab\r\n\r\n"
end
LUA

status_field() { jq -r --arg h "$2" --arg f "$3" '.hosts[] | select(.name == $h) | .[$f]' "$work/$1.status.json"; }

# lab_up PREFIX ARGS...: a lab, its status in $work/PREFIX.status.json (PREFIX.json is the
# lab's own state file).
lab_up() {
    local p=$1
    shift
    if [ -n "$(ip netns list | awk -v p="$p-" 'index($1, p) == 1')" ]; then
        timeout 120 "$bin" lab down --prefix "$p" >/dev/null
    fi
    labs+=("$p")
    timeout 180 "$bin" lab up --prefix "$p" --nodes "$NODES" --clients "$CLIENTS" --link-mbit "$LINK_MBIT" --root "$root" "$@" > "$work/$p-up.out" 2>&1 ||
        { cat "$work/$p-up.out" >&2; exit 1; }
    timeout 30 "$bin" lab status --prefix "$p" --json > "$work/$p.status.json"
}

# metrics PREFIX NODE_INDEX: that node's Prometheus text, fetched from client0.
metrics() {
    timeout 10 ip netns exec "$(status_field "$1" client0 netns)" \
        curl -s -m 5 "http://$(status_field "$1" "node$2" ip):9080/metrics"
}

# wait_ready PREFIX URL: until every size answers with its length through URL.
wait_ready() {
    local s want got ok
    for _ in $(seq 150); do
        ok=1
        for s in $SIZES; do
            want=$(size_bytes "$s")
            got=$(timeout 10 ip netns exec "$(status_field "$1" client0 netns)" curl -s -m 5 -o /dev/null -w '%{http_code} %{size_download}' "$2$s-0" || true)
            [ "$got" = "200 $want" ] || { ok=0; break; }
        done
        [ $ok = 1 ] && return 0
        sleep 0.2
    done
    echo "$2 did not answer $s correctly (got '$got', want '200 $want')" >&2
    exit 1
}

coop_lab=${PREFIX}c
spread_lab=${PREFIX}s
switch_lab=${PREFIX}h
if has coop || needs_owners; then
    lab_up "$coop_lab" --cooperative
    # Every member's peers up (each node's control connections to the others).
    for k in $(seq 0 $((NODES - 1))); do
        for _ in $(seq 200); do
            up=$(metrics "$coop_lab" "$k" | awk '$1 == "switchyard_node_cluster_peers_up" {print $2}')
            [ "${up:-0}" = "$((NODES - 1))" ] && break
            sleep 0.1
        done
    done
    wait_ready "$coop_lab" "http://$(jq -r .vip "$work/$coop_lab.status.json")/"
fi
if has spread; then
    lab_up "$spread_lab" --cooperative --alone
    wait_ready "$spread_lab" "http://$(jq -r .vip "$work/$spread_lab.status.json")/"
fi
if has handoff; then
    lab_up "$switch_lab" --mechanism handoff
    wait_ready "$switch_lab" "http://$(jq -r .vip "$work/$switch_lab.status.json")/"
fi

# The owner of every file (ideal, BALANCE): a request sent to a node's own address is served
# there (a connection that did not come through the VIP cannot move), counted as its own when it
# owns the file (the count is taken before the answer): ask each node in turn until one counts
# it. `all-SIZE` lists the files every mechanism asks for, `owners-SIZE-K` those of node K.
owned_count() { # NODE_INDEX
    metrics "$coop_lab" "$1" | awk '$1 == "switchyard_node_cluster_owned_requests_total" {print $2 + 0}'
}
if needs_owners; then
    c0_ns=$(status_field "$coop_lab" client0 netns)
    for s in $SIZES; do
        for k in $(seq 0 $((NODES - 1))); do : > "$work/owners-$s-$k"; done
        for i in $(seq 0 $((site_files - 1))); do
            owner=
            for k in $(seq 0 $((NODES - 1))); do
                before=$(owned_count "$k")
                timeout 10 ip netns exec "$c0_ns" curl -s -m 5 -o /dev/null "http://$(status_field "$coop_lab" "node$k" ip)/$s-$i"
                [ "$(owned_count "$k")" -gt "$before" ] && { owner=$k; break; }
            done
            [ -n "$owner" ] || { echo "cannot tell the owner of /$s-$i" >&2; exit 1; }
            echo "/$s-$i" >> "$work/owners-$s-$owner"
        done
        if [ "$BALANCE" = 1 ]; then
            : > "$work/all-$s"
            for k in $(seq 0 $((NODES - 1))); do
                n=$(wc -l < "$work/owners-$s-$k")
                [ "$n" -ge "$per_node" ] || { echo "node$k owns $n of $site_files $s files, fewer than $per_node: raise BALANCE_CANDIDATES" >&2; exit 1; }
                head -n "$per_node" "$work/owners-$s-$k" > "$work/owners-$s-$k.tmp"
                mv "$work/owners-$s-$k.tmp" "$work/owners-$s-$k"
                cat "$work/owners-$s-$k" >> "$work/all-$s"
            done
        fi
        echo "$s files per owner: $(for k in $(seq 0 $((NODES - 1))); do printf 'node%s %s ' "$k" "$(wc -l < "$work/owners-$s-$k")"; done)" >&2
    done
fi
if [ "$BALANCE" = 0 ]; then
    for s in $SIZES; do seq 0 $((NFILES - 1)) | sed "s|^|/$s-|" > "$work/all-$s"; done
fi

# run MECH SIZE MODE -> "req/s errors"
run() {
    local m=$1 s=$2 mode=$3 lab k n ns url list rps=0 errs="" outs=()
    case $m in coop | ideal) lab=$coop_lab ;; spread) lab=$spread_lab ;; handoff) lab=$switch_lab ;; esac
    local vip
    vip=$(jq -r .vip "$work/$lab.status.json")
    local wpids=()
    for k in $(seq 0 $((CLIENTS - 1))); do
        ns=$(status_field "$lab" "client$k" netns)
        url="http://$vip/"
        list="$work/all-$s"
        if [ "$m" = ideal ]; then
            n=$((k % NODES))
            list="$work/owners-$s-$n"
            [ -s "$list" ] || continue
            url="http://$(status_field "$lab" "node$n" ip)/"
        fi
        timeout -k 5 $((DURATION + 30)) ip netns exec "$ns" \
            wrk -t1 -c$((CONNS / CLIENTS)) -d"${DURATION}s" --timeout "${WRK_TIMEOUT}s" -s "$work/paths.lua" "$url" -- "$list" "$mode" \
            > "$work/wrk-$k.out" 2>&1 &
        wpids+=($!)
        outs+=("$work/wrk-$k.out")
    done
    for p in "${wpids[@]}"; do wait "$p" || true; done
    for f in "${outs[@]}"; do
        r=$(awk '/^Requests\/sec/ {print $2; exit}' "$f")
        rps=$(awk -v a="$rps" -v b="${r:-0}" 'BEGIN {printf "%.1f", a + b}')
        e=$(grep -E 'Socket errors|Non-2xx' "$f" | tr -s ' \n' ' ' || true)
        [ -z "$e" ] || errs="$errs $e"
    done
    echo "$rps${errs:+ |$errs}"
}

declare -A results
for round in $(seq 1 "$ROUNDS"); do
    for s in $SIZES; do
        for mode in $MODES; do
            for m in $MECHS; do
                r=$(run "$m" "$s" "$mode")
                results["$m $s $mode"]+="${r%% *} "
                echo "round $round: $m $s $mode: $r req/s" >&2
            done
        done
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR] = $1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}'; }

echo
echo "Command: $cmdline"
echo "$(date -u +%Y-%m-%d), load average $(cut -d' ' -f1-3 /proc/loadavg), links $LINK_MBIT Mbit/s, $NODES nodes, $CLIENTS clients, $NFILES files of each size$([ "$BALANCE" = 1 ] && echo ", $per_node owned by each node")"
echo
printf '| size | mode |'
for m in $MECHS; do printf ' %s req/s |' "$m"; done
has coop && has ideal && printf ' coop/ideal |'
has spread && has ideal && printf ' spread/ideal |'
has handoff && has ideal && printf ' handoff/ideal |'
echo
printf '|---|---|'
for m in $MECHS; do printf -- '---:|'; done
has coop && has ideal && printf -- '---:|'
has spread && has ideal && printf -- '---:|'
has handoff && has ideal && printf -- '---:|'
echo
for s in $SIZES; do
    for mode in $MODES; do
        printf '| %s | %s |' "$s" "$mode"
        declare -A med=()
        for m in $MECHS; do
            med[$m]=$(echo "${results["$m $s $mode"]}" | median)
            printf ' %s |' "${med[$m]}"
        done
        for m in coop spread handoff; do
            if has "$m" && has ideal; then
                awk -v a="${med[$m]}" -v b="${med[ideal]}" 'BEGIN {printf " %.2f |", (b > 0 ? a / b : 0)}'
            fi
        done
        echo
        unset med
    done
done

if has coop; then
    # The median of the nodes' CPU per moved connection, from their histograms' buckets (summed
    # over the nodes, interpolated within the bucket that holds the middle move).
    for k in $(seq 0 $((NODES - 1))); do metrics "$coop_lab" "$k"; done > "$work/coop-metrics"
    total=$(awk '/^switchyard_node_clone_cpu_seconds_count/ {t += $NF} END {print t + 0}' "$work/coop-metrics")
    if [ "$total" = 0 ]; then
        echo
        echo "no connection was moved across hosts"
    else
        awk '/^switchyard_node_clone_cpu_seconds_bucket/ {
                 match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
                 if (le != "+Inf") n[le] += $NF }
             END { for (le in n) print le, n[le] }' "$work/coop-metrics" | sort -g |
            awk -v total="$total" '
                { if (!done && $2 >= total / 2) {
                      f = ($2 > pn) ? (total / 2 - pn) / ($2 - pn) : 0
                      printf "\nCPU per moved connection on the sending node: median %.1f us over %d moves (histogram, interpolated)\n", (pl + f * ($1 - pl)) * 1e6, total
                      done = 1 }
                  pl = $1; pn = $2 }'
    fi
fi
