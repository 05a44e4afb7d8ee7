#!/usr/bin/env bash
# perf-handoff: a CPU profile of the handoff switch in one 1 KiB Connection: close run of
# bench/cluster/run.sh (perf record -F 2999 -g for 6 s while wrk runs). Usage: BIN OUT (root; BIN
# an absolute path: the switch is found by it; SWITCH_ARGS is passed on to run.sh). Read it with
# perf report -i OUT.data --no-children --sort dso,sym (or --children -g none for totals by call).
set -u
BIN=$1; OUT=$2
cd "$(dirname "$0")/../.."
SWITCHYARD_BIN=$BIN PREFIX=prf DURATION=12 ROUNDS=1 CONNS=32 THREADS=2 NODES=2 CLIENTS=1 MECHS="handoff" SIZES="1k" MODES="close" WRK_TIMEOUT=10 bench/cluster/run.sh > "$OUT.bench" 2>&1 &
B=$!
pid=
for _ in $(seq 1 600); do
  pid=$(ps -eo pid,args | awk -v b="$BIN" '$2==b && $3=="switch" && /handoff/ {print $1}' | head -1)
  if [ -n "$pid" ] && pgrep -x wrk >/dev/null; then break; fi
  sleep 0.5
done
[ -n "$pid" ] || { echo "no handoff switch found" >&2; wait $B; exit 1; }
sleep 2
perf record -F 2999 -g -p "$pid" -o "$OUT.data" -- sleep 6 2>/dev/null
wait $B
grep '^| 1k' "$OUT.bench" | head -1
