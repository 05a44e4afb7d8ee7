#!/usr/bin/env bash
# Compares the load generator of `switchyard load` with wrk against the same nginx:
# a 1 KiB file over keep-alive connections (or one connection per request with
# MODE=close), same connections, threads and duration, alternating rounds, medians.
# Prints a markdown table.
#
# Environment (all optional):
#   ROUNDS=3 DURATION=10 CONNECTIONS=64 THREADS=<cores> PORT=<free port>
#   NGINX_WORKERS=<cores>
#   LOAD_CMD="path/to/switchyard load"   (default: builds and uses the crate's `load` example)
#   IO=auto|uring|epoll                   (the generator's event loop, `--io`; default auto)
#   MODE=keepalive|close                  (close: wrk sends Connection: close, the generator
#                                          runs --no-keepalive; default keepalive)
#   KEEP=1                                (keep the work directory for inspection)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cores=$(nproc)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-$cores}
NGINX_WORKERS=${NGINX_WORKERS:-$cores}
IO=${IO:-auto}
MODE=${MODE:-keepalive}
case "$MODE" in
    keepalive) wrk_mode=(); ours_mode=() ;;
    close) wrk_mode=(-H "Connection: close"); ours_mode=(--no-keepalive) ;;
    *) echo "MODE must be keepalive or close, not $MODE" >&2; exit 2 ;;
esac

need() { command -v "$1" >/dev/null 2>&1; }
if ! need nginx || ! need wrk; then
    echo "installing nginx and wrk" >&2
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq nginx wrk >/dev/null
fi
need python3 || { echo "python3 is required" >&2; exit 1; }
NGINX=$(command -v nginx)

if [ -z "${LOAD_CMD:-}" ]; then
    (cd "$repo" && cargo build --release -q -p switchyard-load --example load)
    target_dir=${CARGO_TARGET_DIR:-$repo/target}
    LOAD_CMD="$target_dir/release/examples/load"
fi

work=$(mktemp -d /tmp/load-vs-wrk.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/www" "$work/logs"
head -c 1024 /dev/urandom >"$work/www/1k.bin"
chmod 644 "$work/www/1k.bin"

if [ -z "${PORT:-}" ]; then
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
fi
URL="http://127.0.0.1:$PORT/1k.bin"

user_line=""
[ "$(id -u)" -eq 0 ] && user_line="user root;"
cat >"$work/nginx.conf" <<EOF
$user_line
worker_processes $NGINX_WORKERS;
pid $work/nginx.pid;
error_log $work/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests 1000000;
    client_body_temp_path $work/tmp_body;
    proxy_temp_path $work/tmp_proxy;
    fastcgi_temp_path $work/tmp_fastcgi;
    uwsgi_temp_path $work/tmp_uwsgi;
    scgi_temp_path $work/tmp_scgi;
    default_type application/octet-stream;
    server {
        listen 127.0.0.1:$PORT;
        root $work/www;
    }
}
EOF

cleanup() {
    if [ -f "$work/nginx.pid" ]; then
        kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
        sleep 0.3
    fi
    if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work" >&2; fi
}
trap cleanup EXIT
"$NGINX" -p "$work" -c "$work/nginx.conf"
for _ in $(seq 50); do
    python3 - "$PORT" <<'PY' && break
import socket, sys
s = socket.socket()
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
    sleep 0.1
done

TIMEFORMAT="%R %U %S"
run_wrk() { # round
    local out="$work/wrk.$1"
    { time wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency "${wrk_mode[@]}" "$URL" \
        >"$out.txt"; } 2>"$out.time"
}
run_ours() { # round
    local out="$work/ours.$1"
    { time $LOAD_CMD "$URL" --connections "$CONNECTIONS" --threads "$THREADS" \
        --duration "$DURATION" --io "$IO" "${ours_mode[@]}" --json --quiet >"$out.json"; } 2>"$out.time"
}

echo "warming up" >&2
wrk -t"$THREADS" -c"$CONNECTIONS" -d2s "${wrk_mode[@]}" "$URL" >/dev/null
for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    if [ $((r % 2)) -eq 1 ]; then run_wrk "$r"; run_ours "$r"; else run_ours "$r"; run_wrk "$r"; fi
done

python3 - "$work" "$ROUNDS" "$CONNECTIONS" "$THREADS" "$DURATION" "$NGINX_WORKERS" "$MODE" <<'PY'
import json, re, statistics, sys, subprocess
work, rounds = sys.argv[1], int(sys.argv[2])
conns, threads, dur, workers, mode = sys.argv[3:8]

def to_us(v, unit):
    return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]

def wrk(r):
    t = open(f"{work}/wrk.{r}.txt").read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    n = int(re.search(r"(\d+) requests in", t).group(1))
    lat = {p: to_us(*re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", t, re.M).groups())
           for p in ("50", "99")}
    _, u, s = map(float, open(f"{work}/wrk.{r}.time").read().split())
    return rps, (u + s) * 1e6 / n, lat["50"], lat["99"]

def ours(r):
    j = json.load(open(f"{work}/ours.{r}.json"))
    _, u, s = map(float, open(f"{work}/ours.{r}.time").read().split())
    return (j["requests_per_sec"], (u + s) * 1e6 / j["requests"],
            j["latency_us"]["p50"], j["latency_us"]["p99"])

notes = []
for r in range(1, rounds + 1):
    t = open(f"{work}/wrk.{r}.txt").read()
    for line in t.splitlines():
        if "Socket errors" in line or "Non-2xx" in line:
            notes.append(f"wrk round {r}: {line.strip()}")
    j = json.load(open(f"{work}/ours.{r}.json"))
    if j["errors_total"] or j["timeouts"]:
        notes.append(f"switchyard load round {r}: {j['errors_total']} errors, {j['timeouts']} timeouts")

rows = []
for r in range(1, rounds + 1):
    rows.append(("wrk", r) + wrk(r))
    rows.append(("switchyard load", r) + ours(r))
print(f"1 KiB file, {'keep-alive' if mode == 'keepalive' else 'Connection: close'}, {conns} connections, {threads} threads, {dur} s per run, "
      f"nginx {workers} workers, {rounds} alternating rounds")
print()
print("| tool | round | requests/s | CPU µs/request | p50 µs | p99 µs |")
print("|---|---:|---:|---:|---:|---:|")
for tool, r, rps, cpu, p50, p99 in rows:
    print(f"| {tool} | {r} | {rps:,.0f} | {cpu:.2f} | {p50:,.0f} | {p99:,.0f} |")
print()
med = {}
for tool in ("wrk", "switchyard load"):
    sel = [x for x in rows if x[0] == tool]
    med[tool] = [statistics.median(x[i] for x in sel) for i in range(2, 6)]
print("| tool (median) | requests/s | CPU µs/request | p50 µs | p99 µs |")
print("|---|---:|---:|---:|---:|")
for tool, (rps, cpu, p50, p99) in med.items():
    print(f"| {tool} | {rps:,.0f} | {cpu:.2f} | {p50:,.0f} | {p99:,.0f} |")
ratio = med["switchyard load"][0] / med["wrk"][0]
cpu = med["switchyard load"][1] / med["wrk"][1]
print()
print(f"switchyard load / wrk requests/s: {ratio:.3f} (target >= 1.0)")
print(f"switchyard load / wrk CPU per request: {cpu:.3f} (target <= 1.0)")
for n in notes:
    print(f"note: {n}")
PY
