#!/usr/bin/env bash
# The simulator against a real cooperative cluster (issue 12): one trace and one configuration,
# simulated by `switchyard sim cyclone` and run on real `switchyard node --cooperative`
# processes on this host, hit rates and throughput side by side with their relative
# differences; exits 1 when one exceeds TOLERANCE (5 %).
#
#   bench/cyclone/sim-vs-real.sh synthetic   # trace synth --preset cyclone at SCALE, REQUESTS
#   bench/cyclone/sim-vs-real.sh real        # the real log LOG (default the 2015 Apache log)
#
# Settings (environment): NODES=4 CLIENTS=38 SCALE=0.01 REQUESTS=20000 SEED=1
# SYSTEMS="RR CF-LRU CF-LFU CF-REP SC Cyclone" SETTING=static|defaults DISK_US=20000 TOLERANCE=0.05 PORT ADMIN_PORT
# BIN (a switchyard binary; default: the release build, made here) KEEP=1 (keep the work dir)
# TW_SETTLE=1000 TW_WAIT_S=90 (before each real cluster, wait for the sockets earlier replays
# left in TIME_WAIT to fall below TW_SETTLE, at most TW_WAIT_S seconds).
#
# What runs (README.md, "The simulator against a real cluster"): `trace root` makes the
# document root from the trace; every node has the simulated cache sizes and an emulated disk
# of DISK_US per miss (the limit, as the simulator models it: see README.md for why not the
# CPU); the client replays the trace in log order, HTTP/1.0, CLIENTS connections, once to warm
# up and once measured; hit rates come from the nodes' /metrics before and after the measured
# pass, throughput from the client. The simulator's CPU costs are calibrated in the same run
# (one client against one node, then two), its disk is the nodes' emulated one.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${BIN:-}" ]; then
    CARGO_INCREMENTAL=0 cargo build --release --locked -p switchyard --bin switchyard
    export BIN="${CARGO_TARGET_DIR:-target}/release/switchyard"
fi
exec python3 bench/cyclone/sim_vs_real.py "$@"
