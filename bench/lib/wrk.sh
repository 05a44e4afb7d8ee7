# Shared by the benchmarks that drive servers on loopback with wrk (bench/node-vs-nginx/run.sh,
# bench/floor/run.sh): sourced after `top` (the repository) is set.
#
#   bench_tools CMD...           install what is missing of nginx, wrk, curl, python3 (as root)
#   bench_workdir NAME           make `work` (/tmp/sy-NAME-XXXXXX); every pid added to `pids` is
#                                killed, and `work` removed, on exit
#   switchyard_bin               set `bin` to SWITCHYARD_BIN, or build the release binary
#   ticks PID...                 CPU clock ticks (utime + stime) of the processes
#   to_us                        a wrk latency (850.00us, 1.20ms, 2s) on stdin, in µs
#   median                       the median of the numbers on stdin, one per line
#   run_wrk PORT PATH MODE PID...  one wrk run (THREADS, CONNS, DURATION) on
#                                http://127.0.0.1:PORT/PATH, MODE keepalive or close; prints
#                                "req/s p99-µs CPU-µs-per-request" of the given processes
#   ports_free PORT...           exit with a message if anything listens on one of the ports (a
#                                leftover server with SO_REUSEPORT would silently share the load)
#   nginx_conf ROOT PORT         an nginx.conf in $work serving ROOT on 127.0.0.1:PORT, tuned as
#                                its users tune it for static files (workers = cores, sendfile,
#                                tcp_nopush, open_file_cache, no access log)

bench_tools() {
    local missing=() cmd
    for cmd in "$@"; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || { echo "need ${missing[*]} (apt-get install ${missing[*]})" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]/#nginx/nginx-light}" || \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

bench_workdir() {
    work=$(mktemp -d "/tmp/sy-$1-XXXXXX")
    pids=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}

switchyard_bin() {
    if [ -z "${SWITCHYARD_BIN:-}" ]; then
        (cd "$top" && cargo build --release --locked -q -p switchyard --bin switchyard)
    fi
    bin="${SWITCHYARD_BIN:-${CARGO_TARGET_DIR:-$top/target}/release/switchyard}"
}

ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us/,"",v); print v} else if (v ~ /ms$/) {sub(/ms/,"",v); print v*1000} else if (v ~ /s$/) {sub(/s/,"",v); print v*1000000} else print v}'; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

ports_free() {
    local p
    for p in "$@"; do
        if ss -Hltn "sport = :$p" | grep -q .; then
            echo "port $p is taken: $(ss -Hltnp "sport = :$p" | head -1)" >&2
            exit 1
        fi
    done
}

run_wrk() {
    local port=$1 path=$2 mode=$3; shift 3
    local extra=()
    [ "$mode" = close ] && extra=(-H "Connection: close")
    local out t0 t1 hz
    hz=$(getconf CLK_TCK)
    t0=$(ticks "$@")
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "${extra[@]}" "http://127.0.0.1:$port/$path")
    t1=$(ticks "$@")
    local rps p99 reqs cpu errs
    rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
    reqs=$(awk '/requests in/ {print $1}' <<<"$out")
    cpu=$(awk -v d=$((t1 - t0)) -v n="$reqs" -v hz="$hz" 'BEGIN {printf "%.1f", (n > 0 ? d / hz * 1e6 / n : 0)}')
    p99=$(awk '$1=="99%" {print $2}' <<<"$out" | to_us)
    errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
    [ -n "$errs" ] && echo "  note: port $port $path $mode: $errs" >&2
    echo "$rps $p99 $cpu"
}

nginx_conf() {
    local root=$1 port=$2
    cat > "$work/nginx.conf" <<CONF
worker_processes $(nproc);
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
daemon off;
worker_rlimit_nofile 19000;
events { worker_connections 18000; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    open_file_cache max=1000 inactive=60s;
    open_file_cache_valid 60s;
    default_type application/octet-stream;
    client_body_temp_path $work/nginx-body;
    proxy_temp_path $work/nginx-proxy;
    fastcgi_temp_path $work/nginx-fastcgi;
    uwsgi_temp_path $work/nginx-uwsgi;
    scgi_temp_path $work/nginx-scgi;
    server {
        listen 127.0.0.1:$port backlog=4096;
        root $root;
    }
}
CONF
}
