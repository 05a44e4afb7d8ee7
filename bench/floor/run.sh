#!/usr/bin/env bash
# floor: what a server can reach against nginx on this machine by doing less per request.
#
# Builds the floor server (bench/floor/src/main.rs: a fixed in-memory answer, no parsing beyond
# the end of the head, one thread per core on SO_REUSEPORT, on epoll and on io_uring; on epoll
# bodies over 16 KiB are sent with sendfile, as the node sends them, on io_uring always copied,
# since it has no sendfile) and runs
# it, nginx (tuned as in bench/node-vs-nginx) and the switchyard node on the same file sizes.
# wrk drives each in turn (the order rotates every round), keep-alive and "Connection: close";
# the table gives medians of ROUNDS rounds: requests per second, the ratio to nginx, p99 and
# each server's CPU time per request. floor/nginx is the most a server can lead nginx by through
# doing less per request: what is left of a request when all of a server's own work is taken
# away is the kernel's and wrk's. How a server sleeps changes the kernel's share too: the
# floor sleeps as soon as it is idle, the node's workers yield their CPU first and lead it in
# Connection: close (bench/RESULTS.md, 2026-12-06).
#
# With COMPARE_BIN set to another switchyard binary (an earlier build), that binary's node runs
# too, as "node-b", in the same rotation: a change to the node is measured against the build
# before it in the same run.
#
# FLOOR_HOLD=N,US makes the io_uring floor's waits hold for N completions, or US microseconds
# after the first (default 1,0: one completion).
#
# Usage: bench/floor/run.sh                 (defaults below)
#        SIZES="1k 100k" MODES=close ROUNDS=7 DURATION=5 bench/floor/run.sh
#        COMPARE_BIN=/tmp/switchyard-before SIZES=16k MODES=keepalive bench/floor/run.sh
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
SIZES=${SIZES:-"1k 16k 100k 1m"}
MODES=${MODES:-"close keepalive"}
NGINX_PORT=18080
NODE_PORT=18081
EPOLL_PORT=18090
URING_PORT=18091
NODE_B_PORT=18092
ulimit -n "$(ulimit -Hn)"

# shellcheck source=../lib/wrk.sh
. "$top/bench/lib/wrk.sh"
bench_tools nginx wrk curl
switchyard_bin
target=${CARGO_TARGET_DIR:-$top/target}
(cd "$here" && cargo build --release -q --target-dir "$target/floor")
floor="$target/floor/release/switchyard-floor"
bench_workdir floor

bytes() { case $1 in *k) echo $((${1%k} * 1024)) ;; *m) echo $((${1%m} * 1048576)) ;; *) echo "$1" ;; esac; }
wait_port() { for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$1/$2" && return; sleep 0.1; done; echo "nothing answers on port $1" >&2; exit 1; }

root="$work/root"; mkdir -p "$root"
chmod 755 "$work" "$root"  # nginx workers run unprivileged
for size in $SIZES; do head -c "$(bytes "$size")" /dev/urandom > "$root/$size"; done
ports_free $NGINX_PORT $NODE_PORT $EPOLL_PORT $URING_PORT $NODE_B_PORT
nginx_conf "$root" $NGINX_PORT
nginx -c "$work/nginx.conf" -e "$work/nginx-error.log" &
pids+=($!); nginx_pid=$!
"$bin" node --listen 127.0.0.1:$NODE_PORT --root "$root" --cache-bytes 67108864 2>"$work/node.log" &
pids+=($!); node_pid=$!
names=(nginx node floor-epoll floor-uring)
if [ -n "${COMPARE_BIN:-}" ]; then
    "$COMPARE_BIN" node --listen 127.0.0.1:$NODE_B_PORT --root "$root" --cache-bytes 67108864 \
        2>"$work/node-b.log" &
    pids+=($!); node_b_pid=$!
    names+=(node-b)
fi
first=${SIZES%% *}
wait_port $NGINX_PORT "$first"; wait_port $NODE_PORT "$first"
[ -n "${COMPARE_BIN:-}" ] && wait_port $NODE_B_PORT "$first"
nginx_all() { echo "$nginx_pid $(pgrep -P "$nginx_pid" | tr '\n' ' ')"; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| file | mode | server | req/s | / nginx | p99 µs | CPU µs/req |"
echo "|---|---|---|---:|---:|---:|---:|"
for size in $SIZES; do
    # The floor answers every path with one body: one pair of floors per size.
    # Bodies over 16 KiB go out with sendfile (as the node sends them), smaller ones copied.
    sf=(); [ "$(bytes "$size")" -gt 16384 ] && sf=(--sendfile)
    "$floor" --port $EPOLL_PORT --engine epoll --threads "$(nproc)" --body "$(bytes "$size")" "${sf[@]}" &
    epoll_pid=$!; pids+=($epoll_pid)
    "$floor" --port $URING_PORT --engine uring --hold "${FLOOR_HOLD:-1,0}" --threads "$(nproc)" --body "$(bytes "$size")" &
    uring_pid=$!; pids+=($uring_pid)
    wait_port $EPOLL_PORT "$size"; wait_port $URING_PORT "$size"
    for mode in $MODES; do
        for n in "${names[@]}"; do for f in rps p99 cpu; do : > "$work/$n.$f"; done; done
        for r in $(seq "$ROUNDS"); do
            for k in "${!names[@]}"; do
                i=$(( (k + r) % ${#names[@]} ))
                case $i in
                    0) port=$NGINX_PORT; p=$(nginx_all) ;;
                    1) port=$NODE_PORT; p=$node_pid ;;
                    2) port=$EPOLL_PORT; p=$epoll_pid ;;
                    3) port=$URING_PORT; p=$uring_pid ;;
                    4) port=$NODE_B_PORT; p=$node_b_pid ;;
                esac
                # shellcheck disable=SC2086
                read -r a b c < <(run_wrk "$port" "$size" "$mode" $p)
                n=${names[$i]}
                echo "$a" >> "$work/$n.rps"; echo "$b" >> "$work/$n.p99"; echo "$c" >> "$work/$n.cpu"
            done
        done
        base=$(median < "$work/nginx.rps")
        for n in "${names[@]}"; do
            rps=$(median < "$work/$n.rps")
            printf "| %s | %s | %s | %.0f | %.2f | %.0f | %.1f |\n" "$size" "$mode" "$n" "$rps" \
                "$(awk -v a="$rps" -v b="$base" 'BEGIN {print a / b}')" \
                "$(median < "$work/$n.p99")" "$(median < "$work/$n.cpu")"
        done
    done
    kill $epoll_pid $uring_pid; wait $epoll_pid $uring_pid 2>/dev/null || true
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
