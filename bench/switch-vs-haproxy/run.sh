#!/usr/bin/env bash
# switch-vs-haproxy: the same two switchyard nodes behind the switchyard switch (relay, with
# consistent hashing and with LARD), behind HAProxy (balance uri, hash-type consistent,
# keep-alive to the servers, nbthread = cores) and behind nginx (hash $request_uri consistent,
# upstream keepalive). wrk drives each front end over 64 files per size (so that hashing spreads
# them over both nodes) with keep-alive and with "Connection: close", 1 KiB and 100 KiB files
# (SIZES="1k 32k 100k" adds others), in alternating rounds; the table shows medians. A second
# table compares moving 100 KiB bodies with splice(2) against the copy loop (splice_min_bytes).
# The front end "floor" is bench/floor's relay: the least a layer-7 relay can do per request
# (pooled keep-alive connections to the nodes, round robin, bodies copied, nothing parsed but the
# end of the head and Content-Length), so floor/HAProxy bounds what any relay reaches here.
# "floor-uring" is the same relay on io_uring (bench/floor/src/relay_uring.rs), waiting for one
# completion at a time; FLOOR_HOLD=N,US makes its waits hold for N completions or US
# microseconds after the first.
#
# Usage: bench/switch-vs-haproxy/run.sh
#        DURATION=5 ROUNDS=5 CONNS=64 THREADS=2 bench/switch-vs-haproxy/run.sh
#        FRONTS="haproxy sw-chash floor" SPLICE_TABLE=0 bench/switch-vs-haproxy/run.sh
# FRONTS chooses the front ends of the first table (HAProxy, the baseline, always runs); only
# those are started. SPLICE_TABLE=0 leaves out the second table and its two switches. Five
# rounds by default: with three, a median here moves by more than a 10 % lead (bench/RESULTS.md,
# 2026-11-29).
# HAPROXY_BUFSIZE sets HAProxy's tune.bufsize: 16384 by default, HAProxy's own. On loopback
# 131072 (the lab's setting in bench/cluster/run.sh, where it serves large bodies 2-4x faster)
# did not speed HAProxy up at 100 KiB and slowed it at 1 KiB Connection: close (bench/RESULTS.md,
# 2026-11-28).
# SWITCHYARD_BIN=/path/to/switchyard runs that binary (nodes and switch) and builds nothing;
# SKIP_BUILD=1 runs $CARGO_TARGET_DIR/release/switchyard without building it. SWITCH_BIN
# overrides how the switch is run (default: `switchyard switch` when the binary has that
# subcommand, else the crate's example binary). With COMPARE_BIN set to another switchyard
# binary (an earlier build), its switch runs too, as "sw-chash-b" (consistent hashing, in front
# of the same nodes), in the same rotation: a change to the switch is measured against the
# build before it in the same run. Traffic goes to 127.0.0.1 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
SIZES=${SIZES:-"1k 100k"}
MODES=${MODES:-"keepalive close"}
HAPROXY_BUFSIZE=${HAPROXY_BUFSIZE:-16384}
FRONTS=${FRONTS:-"haproxy nginx sw-chash sw-lard floor"}
SPLICE_TABLE=${SPLICE_TABLE:-1}
wants() { [[ " $FRONTS " == *" $1 "* ]]; }
wants haproxy || FRONTS="haproxy $FRONTS"
N1=18101; N2=18102; HAP=18110; NGX=18111; SWC=18112; SWL=18113; SWS=18114; SWP=18115; FLR=18116; SWB=18117; FLU=18118
if [ -n "${COMPARE_BIN:-}" ]; then
    [ -x "$COMPARE_BIN" ] || { echo "COMPARE_BIN $COMPARE_BIN is not an executable" >&2; exit 1; }
    wants sw-chash-b || FRONTS="$FRONTS sw-chash-b"
fi
ulimit -n "$(ulimit -Hn)"

for cmd in haproxy nginx wrk curl; do
    if ! command -v "$cmd" >/dev/null; then
        [ "$(id -u)" -eq 0 ] || { echo "need $cmd (apt-get install haproxy nginx wrk curl)" >&2; exit 1; }
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy nginx-light wrk curl || \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy nginx wrk curl
    fi
done
target=${CARGO_TARGET_DIR:-$top/target}
[ -n "${SKIP_BUILD:-}${SWITCHYARD_BIN:-}" ] || (cd "$top" && cargo build --release -q -p switchyard --bin switchyard && cargo build --release -q -p switchyard-switch --example switch)
bin="${SWITCHYARD_BIN:-$target/release/switchyard}"
if [ -z "${SWITCH_BIN:-}" ]; then
    if "$bin" switch --help >/dev/null 2>&1; then SWITCH_BIN="$bin switch"; else SWITCH_BIN="$target/release/examples/switch"; fi
fi

work=$(mktemp -d /tmp/sy-swbench-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

root="$work/root"; mkdir -p "$root"
chmod 755 "$work" "$root"
# 64 files of each size in SIZES (and of 1k, which the start-up check fetches): NNk is NN KiB,
# NNm NN MiB.
size_bytes() {
    case $1 in
        *k) echo $((${1%k} * 1024)) ;;
        *m) echo $((${1%m} * 1048576)) ;;
        *) echo "a size is NNk or NNm, not '$1'" >&2; exit 2 ;;
    esac
}
for size in 1k $SIZES; do
    [ -e "$root/$size-0" ] && continue
    head -c "$(size_bytes "$size")" /dev/urandom > "$root/$size-0"
    for i in $(seq 1 63); do cp "$root/$size-0" "$root/$size-$i"; done
done
cat > "$work/paths.lua" <<'LUA'
local prefix = "1k"
local i = 0
function init(args)
    prefix = args[1] or prefix
    i = math.random(0, 63)
end
function request()
    i = (i + 1) % 64
    return wrk.format("GET", "/" .. prefix .. "-" .. i)
end
LUA

cores=$(nproc)
for port in $N1 $N2; do
    "$bin" node --listen 127.0.0.1:$port --root "$root" --workers 1 --cache-bytes 67108864 2>"$work/node-$port.log" &
    pids+=($!)
done

cat > "$work/haproxy.cfg" <<CONF
global
    nbthread $cores
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
    bind 127.0.0.1:$HAP
    default_backend be
backend be
    balance uri
    hash-type consistent
    server n1 127.0.0.1:$N1 maxconn 1000
    server n2 127.0.0.1:$N2 maxconn 1000
CONF
haproxy -f "$work/haproxy.cfg" -db 2>"$work/haproxy.log" &
pids+=($!)
ports="$N1 $N2 $HAP"

cat > "$work/nginx.conf" <<CONF
worker_processes $cores;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
daemon off;
worker_rlimit_nofile 19000;
events { worker_connections 9000; }
http {
    access_log off;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    client_body_temp_path $work/nginx-body;
    proxy_temp_path $work/nginx-proxy;
    fastcgi_temp_path $work/nginx-fastcgi;
    uwsgi_temp_path $work/nginx-uwsgi;
    scgi_temp_path $work/nginx-scgi;
    upstream nodes {
        hash \$request_uri consistent;
        server 127.0.0.1:$N1;
        server 127.0.0.1:$N2;
        keepalive 512;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$NGX backlog=4096;
        location / {
            proxy_pass http://nodes;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
CONF
if wants nginx; then
    nginx -c "$work/nginx.conf" -e "$work/nginx-error.log" &
    pids+=($!)
    ports="$ports $NGX"
fi

start_switch() { # port policy splice_min [switch command]
    cat > "$work/switch-$1.toml" <<CONF
[switch]
listen = "127.0.0.1:$1"
nodes = ["127.0.0.1:$N1", "127.0.0.1:$N2"]
policy = "$2"
workers = $cores
splice_min_bytes = $3
CONF
    ${4:-$SWITCH_BIN} --config "$work/switch-$1.toml" 2>"$work/switch-$1.log" &
    pids+=($!)
    ports="$ports $1"
}
if wants sw-chash; then start_switch $SWC chash 65536; fi
if wants sw-lard; then start_switch $SWL lard 65536; fi
if wants sw-chash-b; then start_switch $SWB chash 65536 "$COMPARE_BIN switch"; fi
extra_fronts=
if [ "$SPLICE_TABLE" = 1 ]; then
    start_switch $SWS lard 1
    start_switch $SWP lard 0
    extra_fronts="sw-splice sw-copy"
fi
if wants floor || wants floor-uring; then
    (cd "$top/bench/floor" && cargo build --release -q --target-dir "$target/floor")
fi
if wants floor; then
    "$target/floor/release/switchyard-floor" --port $FLR --threads "$cores" --relay "127.0.0.1:$N1,127.0.0.1:$N2" 2>"$work/floor.log" &
    pids+=($!)
    ports="$ports $FLR"
fi
if wants floor-uring; then
    "$target/floor/release/switchyard-floor" --port $FLU --threads "$cores" --engine uring --hold "${FLOOR_HOLD:-1,0}" \
        --relay "127.0.0.1:$N1,127.0.0.1:$N2" 2>"$work/floor-uring.log" &
    pids+=($!)
    ports="$ports $FLU"
fi

for port in $ports; do
    ok=0
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/1k-0" && { ok=1; break; }; sleep 0.1; done
    [ $ok = 1 ] || { echo "port $port did not come up" >&2; cat "$work"/*.log >&2; exit 1; }
done

port_of() { case $1 in haproxy) echo $HAP;; nginx) echo $NGX;; sw-chash) echo $SWC;; sw-lard) echo $SWL;; sw-splice) echo $SWS;; sw-copy) echo $SWP;; floor) echo $FLR;; floor-uring) echo $FLU;; sw-chash-b) echo $SWB;; esac; }
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us/,"",v); print v} else if (v ~ /ms$/) {sub(/ms/,"",v); print v*1000} else if (v ~ /s$/) {sub(/s/,"",v); print v*1000000} else print v}'; }
run_wrk() { # port size mode
    local extra=()
    [ "$3" = close ] && extra=(-H "Connection: close")
    local out
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${extra[@]}" -s "$work/paths.lua" "http://127.0.0.1:$1/" -- "$2")
    local rps p99 errs
    rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
    p99=$(awk '$1=="99%" {print $2}' <<<"$out" | to_us)
    errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
    [ -n "$errs" ] && echo "  note: port $1 $2 $3: $errs" >&2
    echo "$rps $p99"
}
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# Warm every front end and the nodes' caches.
for f in $FRONTS $extra_fronts; do
    for size in $SIZES; do wrk -t1 -c8 -d1s -s "$work/paths.lua" "http://127.0.0.1:$(port_of $f)/" -- "$size" >/dev/null; done
done

echo "cores: $cores; wrk -t$THREADS -c$CONNS -d${DURATION}s, $ROUNDS alternating rounds, medians; 2 nodes (1 worker each) on the same machine; HAProxy tune.bufsize $HAPROXY_BUFSIZE"
echo
echo "| file | mode | front end | req/s | vs HAProxy | p99 µs |"
echo "|---|---|---|---:|---:|---:|"
for size in $SIZES; do
    for mode in $MODES; do
        for f in $FRONTS; do : > "$work/$f.rps"; : > "$work/$f.p99"; done
        for r in $(seq "$ROUNDS"); do
            for f in $FRONTS; do
                read -r a b < <(run_wrk "$(port_of $f)" "$size" "$mode")
                echo "$a" >> "$work/$f.rps"; echo "$b" >> "$work/$f.p99"
            done
        done
        base=$(median < "$work/haproxy.rps")
        for f in $FRONTS; do
            rps=$(median < "$work/$f.rps"); p99=$(median < "$work/$f.p99")
            ratio=$(awk -v a="$rps" -v b="$base" 'BEGIN {printf "%.2f", a/b}')
            printf "| %s | %s | %s | %.0f | %s | %.0f |\n" "$size" "$mode" "$f" "$rps" "$ratio" "$p99"
        done
    done
done

[ "$SPLICE_TABLE" = 1 ] || exit 0
echo
echo "| 100k bodies, keep-alive, LARD | req/s | p99 µs |"
echo "|---|---:|---:|"
: > "$work/s.rps"; : > "$work/c.rps"; : > "$work/s.p99"; : > "$work/c.p99"
for r in $(seq "$ROUNDS"); do
    read -r a b < <(run_wrk $SWS 100k keepalive); echo "$a" >> "$work/s.rps"; echo "$b" >> "$work/s.p99"
    read -r a b < <(run_wrk $SWP 100k keepalive); echo "$a" >> "$work/c.rps"; echo "$b" >> "$work/c.p99"
done
printf "| splice(2) through a pipe (splice_min_bytes = 1) | %.0f | %.0f |\n" "$(median < "$work/s.rps")" "$(median < "$work/s.p99")"
printf "| copy loop, 64 KiB buffer (splice_min_bytes = 0) | %.0f | %.0f |\n" "$(median < "$work/c.rps")" "$(median < "$work/c.p99")"
