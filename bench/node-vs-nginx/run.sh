#!/usr/bin/env bash
# node-vs-nginx: the switchyard node against nginx on the same files.
#
# Builds a document root (1 KiB, 16 KiB, 100 KiB, 1 MiB), starts nginx
# (workers = cores, sendfile on, access_log off, open_file_cache) and the
# node on it, drives both with wrk (same threads, connections, duration),
# keep-alive and "Connection: close", ROUNDS alternating rounds, and prints
# medians as a markdown table, with each server's CPU time (utime + stime
# of its processes, /proc/<pid>/stat) per request. Then opens 10,000 idle
# keep-alive connections to each server and reports the resident memory
# they cost, 1 s after the last was answered and 6 s after (the lasting cost:
# an allocator may give back what the burst of connections freed only after
# its purge delay). The load average is printed before and after.
#
# Usage: bench/node-vs-nginx/run.sh            (defaults below)
#        DURATION=10 ROUNDS=5 CONNS=64 THREADS=2 bench/node-vs-nginx/run.sh
#        SIZES= IDLE=10000 bench/node-vs-nginx/run.sh    (the idle test only)
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
IDLE=${IDLE:-10000}
SIZES=${SIZES-"1k 16k 100k 1m"}
NGINX_PORT=18080
NODE_PORT=18081
ulimit -n "$(ulimit -Hn)"  # the idle test needs IDLE + a few descriptors per process

# shellcheck source=../lib/wrk.sh
. "$top/bench/lib/wrk.sh"
bench_tools nginx wrk curl python3
# SWITCHYARD_BIN names a prebuilt binary; otherwise the release binary is built.
switchyard_bin
bench_workdir bench

root="$work/root"; mkdir -p "$root"
chmod 755 "$work" "$root"  # nginx workers run unprivileged
head -c 1024 /dev/urandom > "$root/1k"
head -c 16384 /dev/urandom > "$root/16k"
head -c 102400 /dev/urandom > "$root/100k"
head -c 1048576 /dev/urandom > "$root/1m"

ports_free $NGINX_PORT $NODE_PORT
nginx_conf "$root" $NGINX_PORT
nginx -c "$work/nginx.conf" -e "$work/nginx-error.log" &
pids+=($!); nginx_pid=$!
"$bin" node --listen 127.0.0.1:$NODE_PORT --root "$root" --cache-bytes 67108864 2>"$work/node.log" &
pids+=($!); node_pid=$!
for port in $NGINX_PORT $NODE_PORT; do
    for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$port/1k" && break; sleep 0.1; done
done

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
nginx_all() { echo "$nginx_pid $(pgrep -P "$nginx_pid" | tr '\n' ' ')"; }

[ -n "$SIZES" ] && {
echo "| file | mode | nginx req/s | node req/s | node/nginx | nginx p99 µs | node p99 µs | nginx CPU µs/req | node CPU µs/req |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
}
for size in $SIZES; do
    for mode in keepalive close; do
        for f in n.rps s.rps n.p99 s.p99 n.cpu s.cpu; do : > "$work/$f"; done
        for r in $(seq "$ROUNDS"); do
            # shellcheck disable=SC2046
            read -r a b c < <(run_wrk $NGINX_PORT "$size" $mode $(nginx_all))
            echo "$a" >> "$work/n.rps"; echo "$b" >> "$work/n.p99"; echo "$c" >> "$work/n.cpu"
            read -r a b c < <(run_wrk $NODE_PORT "$size" $mode "$node_pid")
            echo "$a" >> "$work/s.rps"; echo "$b" >> "$work/s.p99"; echo "$c" >> "$work/s.cpu"
        done
        n=$(median < "$work/n.rps"); s=$(median < "$work/s.rps")
        np=$(median < "$work/n.p99"); sp=$(median < "$work/s.p99")
        nc=$(median < "$work/n.cpu"); sc=$(median < "$work/s.cpu")
        ratio=$(awk -v a="$s" -v b="$n" 'BEGIN {printf "%.2f", a/b}')
        printf "| %s | %s | %.0f | %.0f | %s | %.0f | %.0f | %.1f | %.1f |\n" "$size" "$mode" "$n" "$s" "$ratio" "$np" "$sp" "$nc" "$sc"
    done
done

# Resident memory of IDLE idle keep-alive connections.
rss_kb() { # pids...
    local total=0
    for p in "$@"; do
        total=$((total + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status")))
    done
    echo $total
}
idle_test() { # port, pids...
    local port=$1; shift
    local before after after6
    before=$(rss_kb "$@")
    python3 - "$port" "$IDLE" "$work/idle-$port" <<'PY' &
import socket, sys, time, os
port, n, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks = []
req = b"GET /1k HTTP/1.1\r\nHost: bench\r\n\r\n"
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(req)
    socks.append(s)
got = 0
for s in socks:
    data = b""
    while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + 1024:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    got += data.startswith(b"HTTP/1.1 200")
open(flag, "w").write(str(got))
time.sleep(30)
PY
    local client=$!
    for _ in $(seq 600); do [ -f "$work/idle-$port" ] && break; sleep 0.2; done
    sleep 1
    after=$(rss_kb "$@")
    sleep 5
    after6=$(rss_kb "$@")
    local ok; ok=$(cat "$work/idle-$port" 2>/dev/null || echo 0)
    kill "$client" 2>/dev/null || true; wait "$client" 2>/dev/null || true
    echo "$ok $before $after $after6"
}
nginx_workers=$(pgrep -P "$nginx_pid" | tr '\n' ' ')
read -r nok nb na na6 < <(idle_test $NGINX_PORT $nginx_pid $nginx_workers)
sleep 2
read -r sok sb sa sa6 < <(idle_test $NODE_PORT $node_pid)
echo
echo "| $IDLE idle keep-alive connections | answered | RSS before (MB) | RSS with them open, 1 s (MB) | 6 s (MB) | cost at 6 s (MB) |"
echo "|---|---:|---:|---:|---:|---:|"
row() { # name, answered, before, 1 s, 6 s (KB)
    awk -v n="$1" -v ok="$2" -v b="$3" -v a="$4" -v a6="$5" \
        'BEGIN {printf "| %s | %d | %.1f | %.1f | %.1f | %.1f |\n", n, ok, b/1024, a/1024, a6/1024, (a6-b)/1024}'
}
row "nginx (master + workers)" "$nok" "$nb" "$na" "$na6"
row "switchyard node" "$sok" "$sb" "$sa" "$sa6"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
