#!/usr/bin/env bash
# Seed 001 Fig. 11 in the sites lab (switchyard_lab::sites): six sites with the paper's D_out
# (origin "bjs" 1000 kB/s; maglev 10000, ottawa 5000, delhi 4000, beirut 3000, ankara 2000),
# each uplink shaped to its D_out with tbf, a DNS host running BIND 9 with one zone per site
# (TSIG-signed RFC 2136 updates), three registry hosts running an etcd cluster, and five
# client hosts resolving through that named (per-namespace resolv.conf). The sites find each
# other only through the registry (no peer has a d_free_kbps) and peer over mutual TLS.
#
# Five `switchyard load` clients ramp together to RAMP_TOP req/s in all (RAMP_STEPS steps of
# STEP seconds, 7 s timeout, HTTP/1.0, one redirect followed), asking the origin for a 4 KB
# file. Run 1: redirects only (the origin has no [rescue.dns]; the paper's setting). Run 2
# (DNS=1): the origin's [rescue.dns] on as well, so rescue servers also join its name's
# round robin; each step is then a separate `load` run per client, so that clients resolve
# again as a real crowd's new visitors would.
#
# PROFILE, if set, replaces the ramp: one client's rate profile ("rate:secs,..."; see
# crowd_profile.py for one shaped by a real per-minute request rate).
#
# SCALE (default 1) multiplies every D_out and the ramp's top, so that a machine whose CPU
# cannot carry 2000 req/s runs the same experiment at a smaller size with the same ratios.
#
# Needs root (namespaces, tc), etcd, named, openssl, python3, and the switchyard binary (BIN,
# default target/release/switchyard) and the lab's `sites` example (LAB, default
# target/debug/examples/sites; `cargo build -p switchyard-lab --example sites`).
# Results go to OUT (default a new directory under /tmp); everything else is removed at exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "bench/rescue: needs root (network namespaces, tc)" >&2; exit 1; }
for p in ip tc openssl python3 etcd named; do
    command -v "$p" >/dev/null || [ -x "/usr/sbin/$p" ] || { echo "bench/rescue: needs $p" >&2; exit 1; }
done
SCALE="${SCALE:-1}"
STEP="${STEP:-20}"
RAMP_STEPS="${RAMP_STEPS:-10}"
RAMP_TOP="${RAMP_TOP:-2000}"
DNS="${DNS:-0}"
BIN="$(realpath "${BIN:-target/release/switchyard}")"
LAB="$(realpath "${LAB:-target/debug/examples/sites}")"
NAMED="$(command -v named || echo /usr/sbin/named)"
P="sx$$"
W="$(mktemp -d /tmp/bench-six.XXXXXX)"
OUT="${OUT:-$W}"
mkdir -p "$OUT"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "$LAB" down "$P" || true
    [ "$OUT" = "$W" ] || rm -rf "$W"
}
trap cleanup EXIT

SITES=(bjs maglev ottawa delhi beirut ankara)
DOUT=(1000 10000 5000 4000 3000 2000)
spec=()
for i in "${!SITES[@]}"; do
    d=$(python3 -c "print(round(${DOUT[$i]} * $SCALE))")
    DOUT[$i]=$d
    spec+=("${SITES[$i]}:$d")
done
"$LAB" up "$P" 5 3 "${spec[@]}" > "$OUT/lab.json"
ns() { python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); print(next(h["netns"] for h in l["hosts"] if h["name"]==sys.argv[2]))' "$OUT/lab.json" "$1"; }
ipof() { python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); print(next(h["ip"] for h in l["hosts"] if h["name"]==sys.argv[2]))' "$OUT/lab.json" "$1"; }
DNS_IP=$(ipof dns)
KEY="c2l4LXNpdGVzLWJlbmNoLXRzaWcta2V5LTMyLWJ5dGVz"
KEY_NAME=bench-update

# --- named: one zone per site, www at the site, updates signed with the key ---------------------
mkdir -p "$W/named"
{
    cat <<CONF
options { directory "$W/named"; pid-file "$W/named/named.pid"; session-keyfile "$W/named/s.key";
  listen-on port 53 { $DNS_IP; }; listen-on-v6 { none; }; recursion no; dnssec-validation no; notify no; };
controls { };
key "$KEY_NAME" { algorithm hmac-sha256; secret "$KEY"; };
CONF
    for s in "${SITES[@]}"; do
        echo "zone \"$s.test\" { type primary; file \"$W/named/$s.db\"; allow-update { key \"$KEY_NAME\"; }; };"
        printf '$TTL 300\n@ IN SOA ns.%s.test. h.%s.test. 1 3600 600 86400 60\n@ IN NS ns.%s.test.\nns IN A %s\nwww IN A %s\n' \
            "$s" "$s" "$s" "$DNS_IP" "$(ipof "$s")" > "$W/named/$s.db"
    done
} > "$W/named/named.conf"
ip netns exec "$(ns dns)" "$NAMED" -g -4 -n 1 -c "$W/named/named.conf" > "$OUT/named.log" 2>&1 &
pids+=($!)

# --- etcd: three members on the registry hosts -------------------------------------------------
cluster=""
for i in 0 1 2; do cluster="$cluster${cluster:+,}m$i=http://$(ipof registry$i):2380"; done
ENDPOINTS=""
for i in 0 1 2; do
    ipr=$(ipof registry$i)
    ENDPOINTS="$ENDPOINTS${ENDPOINTS:+, }\"http://$ipr:2379\""
    ip netns exec "$(ns registry$i)" etcd --name "m$i" --data-dir "$W/etcd$i" \
        --listen-client-urls "http://$ipr:2379" --advertise-client-urls "http://$ipr:2379" \
        --listen-peer-urls "http://$ipr:2380" --initial-advertise-peer-urls "http://$ipr:2380" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$P" \
        --heartbeat-interval 100 --election-timeout 1000 --log-level warn > "$OUT/etcd$i.log" 2>&1 &
    pids+=($!)
done

# --- content and certificates -------------------------------------------------------------------
mkdir -p "$W/site"
head -c 4096 /dev/urandom | base64 -w 76 | head -c 4096 > "$W/site/f.html"
( cd "$W"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj /CN=bench-peers -keyout ca.key -out ca.crt 2>/dev/null
  for s in "${SITES[@]}"; do
      n="www.$s.test"
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$n" \
          -keyout "$n.key" -out "$n.csr" 2>/dev/null
      printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$n" > "$n.ext"
      openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
          -extfile "$n.ext" -out "$n.crt" 2>/dev/null
  done )

site_config() { # $1 index
    local s=${SITES[$1]} d=${DOUT[$1]} ipx peers="" j
    ipx=$(ipof "$s")
    for j in "${!SITES[@]}"; do
        [ "$j" = "$1" ] && continue
        peers="$peers${peers:+, }{ name = \"www.${SITES[$j]}.test\", addr = \"$(ipof "${SITES[$j]}"):7070\" }"
    done
    cat <<CFG
[node]
listen = "$ipx:80"
admin = "$ipx:9000"
root = "$W/site"
workers = 1
[rescue]
server_name = "www.$s.test"
web_ip = "$ipx"
web_port = 80
bandwidth_kbps = $(python3 -c "print($d / 0.8)")
d_out_kbps = $d
[rescue.peering]
listen = "$ipx:7070"
cert = "$W/www.$s.test.crt"
key = "$W/www.$s.test.key"
ca = "$W/ca.crt"
peers = [ $peers ]
[rescue.registry]
endpoints = [ $ENDPOINTS ]
CFG
    if [ "$1" != 0 ] || [ "$DNS" = 1 ]; then
        cat <<CFG
[rescue.dns]
server = "$DNS_IP:53"
zone = "$s.test"
tsig_key_name = "$KEY_NAME"
tsig_secret = "$KEY"
CFG
    fi
}

wait_port() { # $1 namespace, $2 host:port
    for _ in $(seq 1 300); do
        if ip netns exec "$1" python3 -c 'import socket,sys; h,p=sys.argv[1].rsplit(":",1); socket.create_connection((h,int(p)),timeout=0.2).close()' "$2" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "bench/rescue: nothing listens on $2" >&2; exit 1
}
for i in 0 1 2; do
    for _ in $(seq 1 300); do
        ip netns exec "$(ns client0)" curl -s --max-time 1 "http://$(ipof registry$i):2379/health" \
            | grep -q '"health":"true"' && break
        sleep 0.1
    done
done
wait_port "$(ns client0)" "$DNS_IP:53"
# The rescue servers first, so that their registrations are there when the crowd comes.
for i in 1 2 3 4 5 0; do
    s=${SITES[$i]}
    site_config "$i" > "$OUT/$s.toml"
    ip netns exec "$(ns "$s")" env RUST_LOG=info NO_COLOR=1 "$BIN" --config "$OUT/$s.toml" node > "$OUT/$s.log" 2>&1 &
    pids+=($!)
done
for s in "${SITES[@]}"; do wait_port "$(ns client0)" "$(ipof "$s"):80"; done
# Clients resolve the origin through the lab's named.
ip netns exec "$(ns client0)" getent ahostsv4 www.bjs.test | head -1 | tee "$OUT/resolved.txt"

# --- status of every site once a second (from the DNS host: it is on the lab network) ----------
sites_ips=""
for s in "${SITES[@]}"; do sites_ips="$sites_ips $s=$(ipof "$s")"; done
ip netns exec "$(ns dns)" python3 - "$OUT/status.jsonl" $sites_ips <<'PY' &
import json, socket, sys, time
out, sites = sys.argv[1], [a.split("=") for a in sys.argv[2:]]
def get(ip, path):
    s = socket.create_connection((ip, 9000), timeout=2)
    s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data.split(b"\r\n\r\n", 1)[1].decode()
t0 = time.time()
with open(out, "w") as f:
    while True:
        row = {"t": round(time.time() - t0, 2), "epoch": time.time()}
        for name, ip in sites:
            try:
                auto = get(ip, "/dotslash-status?auto")
                kv = dict(l.split(": ", 1) for l in auto.splitlines() if ": " in l)
                page = get(ip, "/dotslash-status") if name == "bjs" else ""
                row[name] = {"auto": kv, "rescuers": [l for l in page.splitlines() if l.startswith("rescued by")]}
            except Exception as e:
                row[name] = {"error": str(e)}
        f.write(json.dumps(row) + "\n")
        f.flush()
        time.sleep(max(0.0, 1.0 - (time.time() - t0) % 1.0))
PY
pids+=($!)
# The origin's uplink as the link itself counts it: eth0's transmitted bytes once a second.
( while true; do
      echo "$(date +%s.%N) $(ip netns exec "$(ns bjs)" cat /sys/class/net/eth0/statistics/tx_bytes)"
      sleep 1
  done > "$OUT/origin-tx.txt" ) &
pids+=($!)
sleep 3 # let every site register and search at least twice (1 s search interval)

# --- the crowd ------------------------------------------------------------------------------------
per_client=$(python3 -c "print($RAMP_TOP * $SCALE / 5)")
if [ -n "${PROFILE:-}" ]; then
    steps="$PROFILE"
else
    steps=$(python3 -c "
n, top, step = $RAMP_STEPS, $per_client, $STEP
print(','.join(f'{top * (k + 1) / n:g}:{step}' for k in range(n)))")
fi
echo "$steps" > "$OUT/profile.txt"
t_start=$(date +%s.%N)
echo "$t_start" > "$OUT/t_start"
run_client() { # $1 client index, $2 profile, $3 output
    ip netns exec "$(ns client$1)" "$BIN" load "http://www.bjs.test/f.html" --rate-profile "$2" \
        --timeout 7s --http1.0 --max-redirects 1 --threads 1 --json -q > "$3"
}
if [ "$DNS" = 1 ]; then
    k=0
    for st in ${steps//,/ }; do
        cpids=()
        for c in 0 1 2 3 4; do run_client "$c" "$st" "$OUT/client$c.step$k.json" & cpids+=($!); done
        for p in "${cpids[@]}"; do wait "$p"; done
        k=$((k + 1))
    done
else
    cpids=()
    for c in 0 1 2 3 4; do run_client "$c" "$steps" "$OUT/client$c.json" & cpids+=($!); done
    for p in "${cpids[@]}"; do wait "$p"; done
fi
echo "$(date +%s.%N)" > "$OUT/t_end"
sleep 2
python3 bench/rescue/six_sites_report.py "$OUT" "$SCALE" "$DNS" | tee "$OUT/report.md"
echo "results in $OUT"
