#!/usr/bin/env bash
# strace-handoff: system calls of the handoff switch in one 1 KiB Connection: close run of
# bench/cluster/run.sh (strace -c -f for 4 s while wrk runs). Usage: BIN OUT (root; BIN an absolute path:
# the switch is found by it).
set -u
BIN=$1; OUT=$2
cd "$(dirname "$0")/../.."
SWITCHYARD_BIN=$BIN PREFIX=mover DURATION=10 ROUNDS=1 CONNS=32 THREADS=2 NODES=2 CLIENTS=1 MECHS="handoff" SIZES="1k" MODES="close" WRK_TIMEOUT=10 bench/cluster/run.sh > $OUT.bench 2>&1 &
B=$!
pid=
for i in $(seq 1 600); do
  pid=$(pgrep -f "^$BIN switch .*--mechanism handoff" | head -1)
  [ -z "$pid" ] && pid=$(ps -eo pid,args | awk -v b="$BIN" '$2==b && $3=="switch" {print $1}' | head -1)
  # wait until wrk runs
  if [ -n "$pid" ] && pgrep -x wrk >/dev/null; then break; fi
  sleep 0.5
done
sleep 2
timeout -s INT 4 strace -c -f -p $pid -o $OUT.strace
wait $B
echo done
