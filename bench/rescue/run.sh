#!/usr/bin/env bash
# Seed 001 Fig. 10 on one machine: an origin behind a DSL-like link (tc tbf on its egress) and
# one rescue server, each in a network namespace, the crowd from a third; `switchyard load`
# steps the request rate up (7 s timeout, a step with more than 10% timeouts is overloaded;
# R_max is the last step before it, D_max the highest data rate up to R_max).
#
#   1. without DotSlash: the origin alone, rates 1, 2, ... req/s;
#   2. with DotSlash: the origin's D_out set to the D_max of run 1 and a rescue server with
#      D_out 2000 kB/s, peering over mutual TLS; rates 4, 8, ... req/s.
#
# Needs root (namespaces, tc), openssl and python3. Everything it makes is removed at exit.
# Settings (environment): STEP seconds per rate step (paper 60; default 20), RATE (origin link,
# default 512kbit), MAX1 and MAX2 the top rates of the two profiles (default 20 and 120), BIN
# the switchyard binary (default target/release/switchyard, else target/debug/switchyard);
# D_OUT (kB/s) skips run 1 and uses this D_out for run 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "bench/rescue: needs root (network namespaces, tc)" >&2; exit 1; }
for p in ip tc openssl python3; do
    command -v "$p" >/dev/null || { echo "bench/rescue: needs $p" >&2; exit 1; }
done
STEP="${STEP:-20}"
RATE="${RATE:-512kbit}"
MAX1="${MAX1:-20}"
MAX2="${MAX2:-120}"
BIN="${BIN:-}"
if [ -z "$BIN" ]; then
    if [ -x target/release/switchyard ]; then BIN=target/release/switchyard; else BIN=target/debug/switchyard; fi
fi
BIN="$(realpath "$BIN")"
P=syr$$
NS_O=$P-origin NS_R=$P-rescue NS_C=$P-client NS_B=$P-br
IP_O=10.99.0.1 IP_R=10.99.0.2 IP_C=10.99.0.3
W="$(mktemp -d /tmp/bench-rescue.XXXXXX)"
OUT="${OUT:-$W}"
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for n in "$NS_O" "$NS_R" "$NS_C" "$NS_B"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "/etc/netns/$NS_C"
    [ "$OUT" = "$W" ] || rm -rf "$W"
}
trap cleanup EXIT

# --- hosts: three namespaces on a bridge in a fourth ---------------------------------------
ip netns add "$NS_B"
ip -n "$NS_B" link add br0 type bridge
ip -n "$NS_B" link set br0 up
ip -n "$NS_B" link set lo up
i=0
for pair in "$NS_O:$IP_O" "$NS_R:$IP_R" "$NS_C:$IP_C"; do
    ns="${pair%%:*}" ip="${pair##*:}"
    ip netns add "$ns"
    ip link add "v$P$i" type veth peer name "b$P$i"
    ip link set "v$P$i" netns "$ns"
    ip link set "b$P$i" netns "$NS_B"
    ip -n "$ns" link set "v$P$i" name eth0
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$NS_B" link set "b$P$i" master br0
    ip -n "$NS_B" link set "b$P$i" up
    i=$((i + 1))
done
# The origin's outbound link: a DSL-like token bucket.
tc -n "$NS_O" qdisc add dev eth0 root tbf rate "$RATE" burst 8kb latency 300ms
# The client resolves the sites' names (and the rescue server's virtual hosts) locally.
mkdir -p "/etc/netns/$NS_C"
{
    echo "127.0.0.1 localhost"
    echo "$IP_O origin.test"
    printf '%s rescue.test' "$IP_R"
    for n in $(seq 1 50); do printf ' rescue-vh%d.test' "$n"; done
    echo
} > "/etc/netns/$NS_C/hosts"

# --- content and certificates ---------------------------------------------------------------
mkdir -p "$W/site"
head -c 6000 /dev/urandom | base64 -w 76 | head -c 6000 > "$W/site/f.html"
( cd "$W"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj /CN=bench-peers -keyout ca.key -out ca.crt 2>/dev/null
  for n in origin.test rescue.test; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$n" \
          -keyout "$n.key" -out "$n.csr" 2>/dev/null
      printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$n" > "$n.ext"
      openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
          -extfile "$n.ext" -out "$n.crt" 2>/dev/null
  done )

origin_config() { # $1: D_out kB/s or empty for no rescue
    cat <<CFG
[node]
listen = "$IP_O:80"
admin = "$IP_O:9000"
root = "$W/site"
workers = 1
CFG
    [ -n "$1" ] || return 0
    cat <<CFG
[rescue]
server_name = "origin.test"
web_ip = "$IP_O"
web_port = 80
bandwidth_kbps = $1
d_out_kbps = $1
[rescue.peering]
listen = "$IP_O:7070"
cert = "$W/origin.test.crt"
key = "$W/origin.test.key"
ca = "$W/ca.crt"
peers = [ { name = "rescue.test", addr = "$IP_R:7070", d_free_kbps = 1000 } ]
CFG
}

cat > "$W/rescue.toml" <<CFG
[node]
listen = "$IP_R:80"
admin = "$IP_R:9000"
root = "$W/site"
workers = 1
[rescue]
server_name = "rescue.test"
web_ip = "$IP_R"
web_port = 80
bandwidth_kbps = 2500
d_out_kbps = 2000
[rescue.peering]
listen = "$IP_R:7070"
cert = "$W/rescue.test.crt"
key = "$W/rescue.test.key"
ca = "$W/ca.crt"
peers = [ { name = "origin.test", addr = "$IP_O:7070" } ]
CFG

wait_http() { # $1 namespace, $2 address
    for _ in $(seq 1 100); do
        if ip netns exec "$1" python3 - "$2" <<'PY' 2>/dev/null; then return 0; fi
import socket, sys
h, p = sys.argv[1].rsplit(":", 1)
socket.create_connection((h, int(p)), timeout=0.2).close()
PY
        sleep 0.1
    done
    echo "bench/rescue: nothing listens on $2" >&2; exit 1
}

profile() { # $1 first, $2 step, $3 last
    local s="" r
    for r in $(seq "$1" "$2" "$3"); do s="$s${s:+,}$r:$STEP"; done
    echo "$s"
}

run_load() { # $1 name, $2 profile
    ip netns exec "$NS_C" "$BIN" load "http://origin.test/f.html" --rate-profile "$2" \
        --timeout 7s --http1.0 --max-redirects 1 --json -q > "$OUT/$1.json"
}

poll_status() { # $1 namespace, $2 admin address, $3 output file: ?auto every second
    # (seconds, state, d_out B/s, redirects, requests served, rescue servers, A_redi B)
    ip netns exec "$1" python3 - "$2" "$3" <<'PY' &
import socket, sys, time
addr, out = sys.argv[1], sys.argv[2]
h, p = addr.rsplit(":", 1)
t0 = time.time()
with open(out, "w") as f:
    while True:
        try:
            s = socket.create_connection((h, int(p)), timeout=1)
            s.sendall(b"GET /dotslash-status?auto HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            body = data.split(b"\r\n\r\n", 1)[1].decode()
            kv = dict(l.split(": ", 1) for l in body.splitlines() if ": " in l)
            f.write("%.1f %s %s %s %s %s %s\n" % (time.time() - t0, kv.get("State"), kv.get("DOut"),
                    kv.get("RequestsRedirected"), kv.get("RequestsServed"), kv.get("Rescuers"),
                    kv.get("ARedi")))
            f.flush()
        except Exception:
            pass
        time.sleep(1)
PY
    pids+=($!)
}

# --- 1. without DotSlash ------------------------------------------------------------------------
if [ -n "${D_OUT:-}" ]; then
    D_MAX1="$D_OUT"
    [ -f "$OUT/alone.json" ] || { echo "bench/rescue: D_OUT needs run 1's alone.json in OUT" >&2; exit 1; }
else
origin_config "" > "$W/origin1.toml"
ip netns exec "$NS_O" "$BIN" --config "$W/origin1.toml" node > "$OUT/origin1.log" 2>&1 &
o1=$!; pids+=($o1)
wait_http "$NS_C" "$IP_O:80"
echo "1. without DotSlash: 1..$MAX1 req/s, ${STEP}s steps"
run_load alone "$(profile 1 1 "$MAX1")"
kill "$o1"; wait "$o1" 2>/dev/null || true
D_MAX1=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["capacity"]; print(c["d_max_kb_per_sec"] or 0)' "$OUT/alone.json")
echo "   D_max alone = $D_MAX1 kB/s"
fi

# --- 2. with DotSlash -------------------------------------------------------------------------------
origin_config "$D_MAX1" > "$W/origin2.toml"
ip netns exec "$NS_R" "$BIN" --config "$W/rescue.toml" node > "$OUT/rescue.log" 2>&1 &
pids+=($!)
ip netns exec "$NS_O" "$BIN" --config "$W/origin2.toml" node > "$OUT/origin2.log" 2>&1 &
pids+=($!)
wait_http "$NS_C" "$IP_R:80"
wait_http "$NS_C" "$IP_O:80"
poll_status "$NS_O" "$IP_O:9000" "$OUT/origin-status.txt"
echo "2. with DotSlash: D_out = $D_MAX1 kB/s, 4..$MAX2 req/s, ${STEP}s steps"
run_load dotslash "$(profile 4 4 "$MAX2")"
cp "$W"/*.toml "$OUT/" 2>/dev/null || true

python3 - "$OUT" "$D_MAX1" "$STEP" <<'PY'
import json, sys
out, d_out, step = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
a = json.load(open(f"{out}/alone.json"))
b = json.load(open(f"{out}/dotslash.json"))
ca, cb = a["capacity"], b["capacity"]
print("| run | R_max req/s | D_max kB/s | overloaded at | timeouts there |")
print("|---|---:|---:|---:|---:|")
for name, s in (("origin alone", a), ("with DotSlash", b)):
    c = s["capacity"]
    over = next((st for st in s["rate_steps"] if st["overloaded"]), None)
    print(f"| {name} | {c['r_max']} | {c['d_max_kb_per_sec']} | "
          f"{over['rate'] if over else '-'} | "
          f"{(str(over['timeouts']) + '/' + str(over['issued'])) if over else '-'} |")
if ca["r_max"] and cb["r_max"]:
    print(f"\nR_max x{cb['r_max'] / ca['r_max']:.2f}, D_max x{cb['d_max_kb_per_sec'] / ca['d_max_kb_per_sec']:.2f}")
redir = [l.split() for l in open(f"{out}/origin-status.txt")]
# The bound D_out / A_redi with the A_redi the origin measured (its redirects' real size).
a_redi = max((float(r[6]) for r in redir if len(r) > 6 and r[3] not in ("None", "0")), default=None)
if a_redi and cb["r_max"]:
    bound = d_out * 1000 / a_redi
    print(f"A_redi {a_redi:.0f} B: bound D_out/A_redi = {bound:.1f} req/s, R_max = {cb['r_max'] / bound:.2f} of it")
first = next((float(r[0]) for r in redir if r[3] not in ("None", "0")), None)
if first is not None:
    n = int(first // step)
    print(f"first redirect {first:.0f}s into run 2: step {n + 1} ({4 * (n + 1)} req/s)")
PY
echo "results in $OUT"
