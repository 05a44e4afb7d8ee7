#!/usr/bin/env bash
# cluster: one-way delivery (handoff) against two-way (relay), HAProxy and no front end at all, in
# the namespace lab (`switchyard lab`): CLIENTS client hosts, the switch host and NODES node hosts
# on one bridge, each host its own network namespace. Every mode uses the same nodes serving the
# same site: 64 files each of 1 KiB, 100 KiB and 1 MiB (so that the policies spread them over the
# nodes). wrk runs in the client namespace(s) against
#   direct   each node's own address: one wrk per (client, node) pair in parallel (two with one
#            client and two nodes), CONNS split between them, requests/s summed (the ceiling:
#            no front end);
#   relay    `switchyard switch --mechanism relay` (every response comes back through the switch);
#   handoff  `switchyard switch --mechanism handoff` on the VIP (one-way: the switch reads the
#            request, hands the client's TCP connection to a node, and the node answers the
#            client directly; the client's packets are steered to the node with tc/eBPF);
#   haproxy  HAProxy in the switch namespace (balance uri, hash-type consistent, keep-alive to
#            the nodes, http-reuse always, nbthread 2, tune.bufsize HAPROXY_BUFSIZE: 128 KiB by
#            default, which serves 100 KiB and 1 MiB bodies 2-4x faster here than HAProxy's own
#            16 KiB default; option splice-auto made no difference and is not used);
# with HTTP/1.1 keep-alive and with "Connection: close", in alternating rounds; medians.
#
# Requests/s is wrk's figure (summed over the wrk processes). Switch CPU is utime+stime of the
# switch (or haproxy) process read from /proc/PID/stat right before and after each run, as
# CPU-seconds per 10,000 completed requests; the nodes' CPU is measured the same way (summed over
# the nodes). All hosts share this machine's cores, so packet processing in softirq (veth
# delivery, the tc/eBPF steering of handed-off flows in the switch namespace) is charged to
# whichever task happens to be running: some of it lands in these figures, the rest in other
# processes (wrk, other work on the machine) or nowhere in particular.
#
# The lab runs with --mechanism handoff when MECHS contains handoff (its switch on the VIP is the
# handoff front end, and the script starts a second switch with --mechanism relay on the switch
# host's own address, port 8081); otherwise with --mechanism relay (its switch on the VIP is the
# relay front end). HAProxy listens on the switch host's own address, port 8080.
#
# Links are unshaped veth pairs unless LINK_MBIT is set (e.g. 100, as in the papers' testbeds;
# every host's link is shaped, both directions). With shaping, direct and handoff are limited by
# the node links (NODES x LINK_MBIT together), relay and haproxy by the switch's link, which
# carries every response; the client's own link is shaped too, so use CLIENTS=NODES (or more) to
# keep it from being the limit of all four.
#
# Usage: bench/cluster/run.sh
#        DURATION=5 ROUNDS=3 CONNS=32 THREADS=2 NODES=2 CLIENTS=1 SIZES="1k 100k 1m" \
#        MODES="keepalive close" MECHS="direct relay handoff haproxy" LINK_MBIT= PREFIX=sybench \
#        WRK_TIMEOUT=10 HAPROXY_BUFSIZE=131072 bench/cluster/run.sh
# (with LINK_MBIT=100 a 1 MiB response takes about a second per connection: use DURATION=10 or
# more so that the requests cut off at the end of a run do not dominate.)
# CC=cubic makes every lab host use that TCP congestion control (the host's default is what the
# lab's namespaces start with). A kernel without the fq qdisc paces BBR's sends with a timer per
# socket, armed again and again as each burst leaves (on a VM each arming is a trip to the
# hypervisor), which bounds 100 KiB responses at keep-alive in the lab (bench/RESULTS.md,
# 2026-12-06, sixth session). A namespace may only choose an algorithm the host allows
# (net.ipv4.tcp_allowed_congestion_control): CC is added to that list for the run and the list
# restored on exit.
# SWITCH_ARGS="--defer-accept-ms=1000" passes extra flags to the lab's switch on the VIP (each
# word one flag). SWITCHYARD_BIN=/path/to/switchyard uses that binary and skips the build (SKIP_BUILD=1 skips it
# too, using $CARGO_TARGET_DIR/release/switchyard). Needs root (network namespaces); installs
# haproxy, wrk, curl and jq with apt-get when missing. All traffic stays inside the lab's
# namespaces; the lab is removed on exit, also after a failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
NODES=${NODES:-2}
CLIENTS=${CLIENTS:-1}
MECHS=${MECHS:-"direct relay handoff haproxy"}
SIZES=${SIZES:-"1k 100k 1m"}
MODES=${MODES:-"keepalive close"}
LINK_MBIT=${LINK_MBIT:-}
SWITCH_ARGS=${SWITCH_ARGS:-}
PREFIX=${PREFIX:-sybench}
WRK_TIMEOUT=${WRK_TIMEOUT:-10}
HAPROXY_BUFSIZE=${HAPROXY_BUFSIZE:-131072}
CC=${CC:-}
RELAY_PORT=8081
HAPROXY_PORT=8080
NFILES=64

usage() {
    sed -n '/^# Usage:/,/^# namespaces/p' "$0" | sed 's/^# \{0,1\}//'
}
case "${1:-}" in -h | --help) usage; exit 0 ;; "") ;; *) usage >&2; exit 2 ;; esac

[ "$(id -u)" -eq 0 ] || { echo "bench/cluster/run.sh needs root (network namespaces)" >&2; exit 1; }
for m in $MECHS; do
    case $m in direct | relay | handoff | haproxy) ;; *) echo "unknown mechanism in MECHS: $m" >&2; exit 2 ;; esac
done
for s in $SIZES; do
    case $s in 1k | 100k | 1m) ;; *) echo "unknown size in SIZES: $s (1k 100k 1m)" >&2; exit 2 ;; esac
done
for m in $MODES; do
    case $m in keepalive | close) ;; *) echo "unknown mode in MODES: $m" >&2; exit 2 ;; esac
done
has() { case " $MECHS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

missing=()
for cmd in haproxy wrk curl jq; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy wrk curl jq
fi
ulimit -n "$(ulimit -Hn)"

if [ -n "${SWITCHYARD_BIN:-}" ]; then
    bin=$SWITCHYARD_BIN
else
    target=${CARGO_TARGET_DIR:-$top/target}
    [ -n "${SKIP_BUILD:-}" ] || (cd "$top" && cargo build --release -q -p switchyard --bin switchyard)
    bin="$target/release/switchyard"
fi
[ -x "$bin" ] || { echo "no switchyard binary at $bin" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
# (the lab starts this same binary inside the namespaces)

cmdline="DURATION=$DURATION ROUNDS=$ROUNDS CONNS=$CONNS THREADS=$THREADS NODES=$NODES CLIENTS=$CLIENTS MECHS=\"$MECHS\" SIZES=\"$SIZES\" MODES=\"$MODES\"${LINK_MBIT:+ LINK_MBIT=$LINK_MBIT} WRK_TIMEOUT=$WRK_TIMEOUT HAPROXY_BUFSIZE=$HAPROXY_BUFSIZE${CC:+ CC=$CC} bench/cluster/run.sh"

work=$(mktemp -d /tmp/sy-cluster-XXXXXX)
chmod 755 "$work"
pids=()
lab_started=0
cc_allowed_before=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$rc" -ne 0 ] && [ "$lab_started" = 1 ]; then
        echo "--- failed (exit $rc); process logs:" >&2
        local logs
        logs=$(timeout 30 "$bin" lab status --prefix "$PREFIX" --json 2>/dev/null | jq -r '.processes[]?.log' 2>/dev/null || true)
        for f in $logs "$work"/*.log; do
            [ -f "$f" ] || continue
            echo "--- $f" >&2
            tail -n 20 "$f" >&2 || true
        done
    fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    if [ -n "$cc_allowed_before" ]; then
        sysctl -qw net.ipv4.tcp_allowed_congestion_control="$cc_allowed_before" ||
            echo "warning: could not restore net.ipv4.tcp_allowed_congestion_control to '$cc_allowed_before'" >&2
    fi
    if [ "$lab_started" = 1 ]; then
        timeout 120 "$bin" lab down --prefix "$PREFIX" >/dev/null 2>&1 || echo "warning: lab down --prefix $PREFIX failed" >&2
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "$CC" ]; then
    if ! tr ' ' '\n' < /proc/sys/net/ipv4/tcp_available_congestion_control | grep -qx -- "$CC"; then
        echo "CC=$CC: not one of this kernel's congestion controls ($(cat /proc/sys/net/ipv4/tcp_available_congestion_control))" >&2
        exit 2
    fi
    allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
    if ! tr ' ' '\n' <<< "$allowed" | grep -qx -- "$CC"; then
        cc_allowed_before=$allowed
        sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $CC"
    fi
fi

# The site: the same files on every node.
root="$work/site"
mkdir -p "$root"
chmod 755 "$root"
printf '<!doctype html><title>cluster bench</title>\n' > "$root/index.html"
size_bytes() { case $1 in 1k) echo 1024 ;; 100k) echo 102400 ;; 1m) echo 1048576 ;; esac; }
for s in $SIZES; do
    head -c "$(size_bytes "$s")" /dev/urandom > "$work/$s.data"
    for i in $(seq 0 $((NFILES - 1))); do cp "$work/$s.data" "$root/$s-$i"; done
    rm "$work/$s.data"
done
cat > "$work/paths.lua" <<LUA
local prefix = "1k"
local i = 0
function init(args)
    prefix = args[1] or prefix
    i = math.random(0, $((NFILES - 1)))
end
function request()
    i = (i + 1) % $NFILES
    return wrk.format("GET", "/" .. prefix .. "-" .. i)
end
LUA

# The lab.
lab_mech=relay
has handoff && lab_mech=handoff
if [ -n "$(ip netns list | awk -v p="$PREFIX-" 'index($1, p) == 1')" ]; then
    echo "removing a stale lab $PREFIX" >&2
    timeout 120 "$bin" lab down --prefix "$PREFIX" >/dev/null
fi
lab_started=1
up_args=(lab up --prefix "$PREFIX" --nodes "$NODES" --clients "$CLIENTS" --mechanism "$lab_mech" --root "$root")
[ -z "$LINK_MBIT" ] || up_args+=(--link-mbit "$LINK_MBIT")
for a in $SWITCH_ARGS; do up_args+=("--switch-arg=$a"); done
timeout 180 "$bin" "${up_args[@]}" > "$work/lab-up.out" 2>&1 || { cat "$work/lab-up.out" >&2; exit 1; }
timeout 30 "$bin" lab status --prefix "$PREFIX" --json > "$work/status.json"
vip=$(jq -r .vip "$work/status.json")
if [ -n "$CC" ]; then
    # Before any connection of the runs opens: connections, accepted ones too, take their
    # namespace's default when they are made.
    for ns in $(jq -r '.hosts[].netns' "$work/status.json" | sort -u); do
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$CC"
    done
fi
host_field() { jq -r --arg h "$1" --arg f "$2" '.hosts[] | select(.name == $h) | .[$f]' "$work/status.json"; }
proc_pid() { jq -r --arg h "$1" '.processes[] | select(.host == $h) | .pid' "$work/status.json"; }
client_ns=$(host_field client0 netns)
client_nss=()
for i in $(seq 0 $((CLIENTS - 1))); do client_nss+=("$(host_field "client$i" netns)"); done
# One client host opens tens of thousands of connections per round to one address and port.
# Where the server lets the client close first (HAProxy at 100 KiB with "Connection: close"),
# each leaves a client port in TIME-WAIT for 60 s, and the 28,232 ports of the default range
# ran out within two rounds: HAProxy fell from 5,300 to 480 req/s round after round while the
# client waited for ports. As load testers do, the client hosts reuse a TIME-WAIT port for a
# new connection when that is safe (tcp_tw_reuse, by TCP timestamps) and use the wider range.
for ns in "${client_nss[@]}"; do
    # /proc/sys/net is the namespace's own; written directly, no procps needed.
    ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv4/tcp_tw_reuse &&
        echo "1024 65535" > /proc/sys/net/ipv4/ip_local_port_range'
done
switch_ns=$(host_field switch netns)
switch_ip=$(host_field switch ip)
node_ips=()
node_pids=()
for i in $(seq 0 $((NODES - 1))); do
    node_ips+=("$(host_field "node$i" ip)")
    node_pids+=("$(proc_pid "node$i")")
done
lab_switch_pid=$(proc_pid switch)
for p in "$lab_switch_pid" "${node_pids[@]}"; do
    if [ -z "$p" ] || [ ! -d "/proc/$p" ]; then
        echo "a lab process is not running (pid '$p')" >&2
        cat "$work/status.json" >&2
        exit 1
    fi
done

# Front ends (each mechanism: start_<m> brings it up, url_<m> and pid_<m> say where it is).
start_direct() { :; }
url_direct() { :; }
pid_direct() { :; }

relay_pid=
relay_url=
start_relay() {
    if [ "$lab_mech" = relay ]; then
        relay_pid=$lab_switch_pid
        relay_url="http://$vip/"
        return
    fi
    local args=(switch --listen "$switch_ip:$RELAY_PORT" --admin "$switch_ip:9081")
    if "$bin" switch --help 2>/dev/null | grep -q -- --mechanism; then args+=(--mechanism relay); fi
    for ip in "${node_ips[@]}"; do args+=(--node "$ip:80"); done
    ip netns exec "$switch_ns" "$bin" "${args[@]}" > "$work/relay-switch.log" 2>&1 &
    relay_pid=$!
    pids+=("$relay_pid")
    relay_url="http://$switch_ip:$RELAY_PORT/"
}
url_relay() { echo "$relay_url"; }
pid_relay() { echo "$relay_pid"; }

start_handoff() { :; }
url_handoff() { echo "http://$vip/"; }
pid_handoff() { echo "$lab_switch_pid"; }

haproxy_pid=
start_haproxy() {
    {
        cat <<CONF
global
    nbthread 2
    maxconn 8000
    tune.bufsize $HAPROXY_BUFSIZE
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend fe
    bind $switch_ip:$HAPROXY_PORT
    default_backend be
backend be
    balance uri
    hash-type consistent
CONF
        for i in "${!node_ips[@]}"; do echo "    server node$i ${node_ips[$i]}:80 maxconn 1000"; done
    } > "$work/haproxy.cfg"
    ip netns exec "$switch_ns" haproxy -f "$work/haproxy.cfg" -db > "$work/haproxy.log" 2>&1 &
    haproxy_pid=$!
    pids+=("$haproxy_pid")
}
url_haproxy() { echo "http://$switch_ip:$HAPROXY_PORT/"; }
pid_haproxy() { echo "$haproxy_pid"; }

for m in $MECHS; do "start_$m"; done

# Every front end (and every node directly) must answer every size with the right length.
check_url() { # url
    local s want got ok=0
    for _ in $(seq 100); do
        ok=1
        for s in $SIZES; do
            want=$(size_bytes "$s")
            got=$(timeout 10 ip netns exec "$client_ns" curl -s -m 5 -o /dev/null -w '%{http_code} %{size_download}' "${1}$s-0" || true)
            [ "$got" = "200 $want" ] || { ok=0; break; }
        done
        [ $ok = 1 ] && return 0
        sleep 0.2
    done
    echo "$1 did not answer $s correctly (got '$got', want '200 $want')" >&2
    return 1
}
for ip in "${node_ips[@]}"; do check_url "http://$ip/"; done
for m in $MECHS; do
    [ "$m" = direct ] || check_url "$(url_"$m")"
done

cpu_ticks() { # pid... -> utime+stime summed, in clock ticks
    local t=0 p v
    for p in "$@"; do
        v=$(awk '{ sub(/^.*\) /, ""); split($0, f, " "); print f[12] + f[13] }' "/proc/$p/stat" 2>/dev/null || echo 0)
        t=$((t + v))
    done
    echo "$t"
}
hz=$(getconf CLK_TCK)

# wrk_out FILE netns url size mode conns threads: one wrk in a client namespace, bounded in time.
wrk_out() {
    local extra=()
    [ "$5" = close ] && extra=(-H "Connection: close")
    timeout -k 5 $((DURATION + 30)) ip netns exec "$2" \
        wrk -t"$7" -c"$6" -d"${DURATION}s" --timeout "${WRK_TIMEOUT}s" "${extra[@]}" -s "$work/paths.lua" "$3" -- "$4" > "$1" 2>&1 ||
        echo "wrk failed (exit $?)" >> "$1"
}
wrk_requests() { awk '/ requests in / {print $1; exit}' "$1"; }
wrk_rps() { awk '/^Requests\/sec/ {print $2; exit}' "$1"; }
wrk_errors() { grep -E 'Socket errors|Non-2xx|wrk failed' "$1" | tr -s ' \n' ' ' || true; }

# handoff_counts -> "handoffs fallbacks" from the lab switch's metrics (0 0 unless handoff runs).
handoff_counts() {
    has handoff || { echo "0 0"; return; }
    timeout 10 ip netns exec "$switch_ns" curl -s -m 5 "http://$switch_ip:9080/metrics" 2>/dev/null |
        awk '$1 == "switchyard_handoff_repair_total" || $1 == "switchyard_handoff_fd_total" {h += $2}
             index($1, "switchyard_handoff_fallbacks_total") == 1 {f += $2}
             END {printf "%d %d\n", h, f}' || echo "0 0"
}

# run MECH size mode conns -> "req/s requests switch_ticks node_ticks handoffs fallbacks"
# One wrk per client host to the front end; for direct, one wrk per (client, node) pair taken
# round robin, max(CLIENTS, NODES) of them. CONNS and THREADS are split over the wrk processes.
run() {
    local m=$1 size=$2 mode=$3 conns=$4 reqs=0 rps=0 sw_pid s0 s1 n0 n1 f k n e c threads
    local jobs_ns=() jobs_url=() jobs_name=() wpids=() h0=0 f0=0 h1=0 f1=0
    if [ "$m" = direct ]; then
        n=$((CLIENTS > NODES ? CLIENTS : NODES))
        for k in $(seq 0 $((n - 1))); do
            jobs_ns+=("${client_nss[$((k % CLIENTS))]}")
            jobs_url+=("http://${node_ips[$((k % NODES))]}/")
            jobs_name+=("client$((k % CLIENTS))->node$((k % NODES))")
        done
    else
        for k in $(seq 0 $((CLIENTS - 1))); do
            jobs_ns+=("${client_nss[$k]}")
            jobs_url+=("$("url_$m")")
            jobs_name+=("client$k")
        done
    fi
    n=${#jobs_ns[@]}
    threads=$((THREADS / n))
    [ "$threads" -ge 1 ] || threads=1
    sw_pid=$("pid_$m")
    s0=0; s1=0
    [ -z "$sw_pid" ] || s0=$(cpu_ticks "$sw_pid")
    n0=$(cpu_ticks "${node_pids[@]}")
    [ "$m" != handoff ] || read -r h0 f0 < <(handoff_counts)
    for k in $(seq 0 $((n - 1))); do
        c=$((conns / n + (k < conns % n ? 1 : 0)))
        [ "$c" -ge 1 ] || c=1
        wrk_out "$work/wrk-$m-$k.out" "${jobs_ns[$k]}" "${jobs_url[$k]}" "$size" "$mode" "$c" "$threads" &
        wpids+=($!)
    done
    for p in "${wpids[@]}"; do wait "$p"; done
    [ -z "$sw_pid" ] || s1=$(cpu_ticks "$sw_pid")
    n1=$(cpu_ticks "${node_pids[@]}")
    [ "$m" != handoff ] || read -r h1 f1 < <(handoff_counts)
    for k in $(seq 0 $((n - 1))); do
        f="$work/wrk-$m-$k.out"
        reqs=$((reqs + $(wrk_requests "$f" || true) + 0))
        rps=$(awk -v a="$rps" -v b="$(wrk_rps "$f")" 'BEGIN {print a + b}')
        e=$(wrk_errors "$f")
        [ -z "$e" ] || echo "$size $mode $m ${jobs_name[$k]}: $e" >> "$work/notes"
    done
    if [ -n "$sw_pid" ] && [ ! -d "/proc/$sw_pid" ]; then
        echo "$size $mode $m: the front-end process (pid $sw_pid) is gone" >> "$work/notes"
    fi
    echo "$rps $reqs $((s1 - s0)) $((n1 - n0)) $((h1 - h0)) $((f1 - f0))"
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
per10k() { awk -v t="$1" -v r="$2" -v hz="$hz" 'BEGIN {if (r > 0) printf "%.4f\n", t / hz / r * 10000; else print "nan"}'; }

# Warm the nodes' caches and every front end.
for m in $MECHS; do
    for size in $SIZES; do DURATION=2 run "$m" "$size" keepalive 4 > /dev/null; done
done
: > "$work/notes"

load_before=$(uptime)
started=$(date -u +%FT%TZ)
for size in $SIZES; do
    for mode in $MODES; do
        for r in $(seq "$ROUNDS"); do
            for m in $MECHS; do
                read -r rps reqs st nt ho fb < <(run "$m" "$size" "$mode" "$CONNS")
                echo "$rps" >> "$work/$size-$mode-$m.rps"
                echo "$reqs" >> "$work/$size-$mode-$m.req"
                per10k "$st" "$reqs" >> "$work/$size-$mode-$m.cpu"
                per10k "$nt" "$reqs" >> "$work/$size-$mode-$m.ncpu"
                if [ "$m" = handoff ]; then
                    echo "$ho" >> "$work/$size-$mode-$m.ho"
                    echo "$fb" >> "$work/$size-$mode-$m.fb"
                fi
                hnote=
                [ "$m" != handoff ] || hnote=", $ho handoffs, $fb fallbacks"
                echo "  round $r $size $mode $m: $rps req/s, $reqs requests, switch ${st} ticks, nodes ${nt} ticks$hnote" >&2
            done
        done
    done
done
load_after=$(uptime)

med() { # size mode mech kind -> median or "-"
    local f="$work/$1-$2-$3.$4"
    if [ -s "$f" ]; then { grep -v nan "$f" || true; } | median; else echo -; fi
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "-" || b == "-" || a == "nan" || b == "nan" || b + 0 == 0) print "-"; else printf "%.2f", a / b}'; }
fmt_rps() { case $1 in - | nan) echo - ;; *) printf '%.0f' "$1" ;; esac; }
fmt_cpu() { case $1 in - | nan) echo - ;; *) printf '%.4f' "$1" ;; esac; }
ratio3() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "-" || b == "-" || a == "nan" || b == "nan" || b + 0 == 0) print "-"; else printf "%.3f", a / b}'; }

echo
echo "command: $cmdline"
links="unshaped veth"
[ -z "$LINK_MBIT" ] || links="$LINK_MBIT Mbit/s (tc tbf, every link, both directions)"
echo "started $started; $(nproc) cores; $NODES nodes, $CLIENTS client host(s); links: $links"
echo "wrk -t$THREADS -c$CONNS -d${DURATION}s --timeout ${WRK_TIMEOUT}s in total over $NFILES files per size, from $CLIENTS client host(s); direct: one wrk per (client, node) pair in parallel, connections split, req/s summed"
echo "$ROUNDS alternating rounds, medians; CPU = utime+stime of the front-end process (and of the nodes) per 10,000 requests, read in 1/$hz s ticks"
echo "binary: $bin; $(haproxy -v | head -n 1), tune.bufsize $HAPROXY_BUFSIZE"
echo "load before: $load_before"
echo "load after:  $load_after"
echo
echo "| size | mode | direct req/s | relay | handoff | haproxy | handoff/direct | handoff/haproxy | relay CPU s/10k | handoff CPU s/10k | haproxy CPU s/10k | handoff CPU / relay CPU |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for size in $SIZES; do
    for mode in $MODES; do
        d=$(med "$size" "$mode" direct rps); rl=$(med "$size" "$mode" relay rps)
        h=$(med "$size" "$mode" handoff rps); hp=$(med "$size" "$mode" haproxy rps)
        rc=$(med "$size" "$mode" relay cpu); hc=$(med "$size" "$mode" handoff cpu); pc=$(med "$size" "$mode" haproxy cpu)
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$size" "$mode" \
            "$(fmt_rps "$d")" "$(fmt_rps "$rl")" "$(fmt_rps "$h")" "$(fmt_rps "$hp")" \
            "$(ratio "$h" "$d")" "$(ratio "$h" "$hp")" \
            "$(fmt_cpu "$rc")" "$(fmt_cpu "$hc")" "$(fmt_cpu "$pc")" "$(ratio3 "$hc" "$rc")"
    done
done
echo
echo "| size | mode | nodes' CPU s/10k: direct | relay | handoff | haproxy |"
echo "|---|---|---:|---:|---:|---:|"
for size in $SIZES; do
    for mode in $MODES; do
        printf '| %s | %s | %s | %s | %s | %s |\n' "$size" "$mode" \
            "$(fmt_cpu "$(med "$size" "$mode" direct ncpu)")" "$(fmt_cpu "$(med "$size" "$mode" relay ncpu)")" \
            "$(fmt_cpu "$(med "$size" "$mode" handoff ncpu)")" "$(fmt_cpu "$(med "$size" "$mode" haproxy ncpu)")"
    done
done
if has handoff; then
    echo
    echo "| size | mode | handoff: requests per run | connections handed off per run | fallbacks to relaying (all rounds) |"
    echo "|---|---|---:|---:|---:|"
    for size in $SIZES; do
        for mode in $MODES; do
            fbs=$(awk '{s += $1} END {print s + 0}' "$work/$size-$mode-handoff.fb")
            printf '| %s | %s | %s | %s | %s |\n' "$size" "$mode" "$(fmt_rps "$(med "$size" "$mode" handoff req)")" \
                "$(fmt_rps "$(med "$size" "$mode" handoff ho)")" "$fbs"
        done
    done
fi
if [ -s "$work/notes" ]; then
    echo
    echo "errors reported by wrk:"
    sed 's/^/  /' "$work/notes"
fi
if [ -n "$LINK_MBIT" ]; then
    echo
    echo "note: links shaped to $LINK_MBIT Mbit/s: direct and handoff are limited by the node links, relay and haproxy by the switch's link."
fi
