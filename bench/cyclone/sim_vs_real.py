#!/usr/bin/env python3
"""The simulator against a real cooperative cluster: one trace and one configuration, simulated
(`switchyard sim cyclone`) and run on real `switchyard node --cooperative` processes on this
host, hit rates and throughput side by side. Run through bench/cyclone/sim-vs-real.sh, which
builds the binary and says what the settings are; README.md explains the method.

Exit status: 0 when every compared figure is within the tolerance, 1 when one is not, 2 on a
failure to run.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from cyclone_common import (BERKELEY_BYTES, SYSTEMS as KNOWN, counter, env, make_trace,
                            node_setup, parse_metrics, replication_settings, run, simulate,
                            write_node_config)


BIN = env("BIN", "target/release/switchyard")
WHAT = sys.argv[1] if len(sys.argv) > 1 else "synthetic"
NODES = int(env("NODES", "4"))
CLIENTS = int(env("CLIENTS", "38"))
SCALE = float(env("SCALE", "0.01"))
REQUESTS = int(env("REQUESTS", "20000"))
SEED = int(env("SEED", "1"))
SYSTEMS = env("SYSTEMS", " ".join(KNOWN)).split()
SETTING = env("SETTING", "static")
DISK_US = int(env("DISK_US", "20000"))
TOL = float(env("TOLERANCE", "0.05"))
# Shares of requests below this on both sides are shown but not held to the tolerance: the
# relative difference of two small shares says little.
SMALL = float(env("SMALL_SHARE", "0.05"))
PORT = int(env("PORT", "18480"))
ADMIN = int(env("ADMIN_PORT", "18500"))
LOG = env("LOG", "/work/shared/data/usask_1995_excerpt.log")
OUT = env("OUT", "bench/cyclone/results")
CAL_REQUESTS = int(env("CAL_REQUESTS", "2000"))
# Before each real cluster starts: wait (up to TW_WAIT_S seconds) for the sockets the replays
# before it left in TIME_WAIT to fall below TW_SETTLE.
TW_SETTLE = int(env("TW_SETTLE", "1000"))
TW_WAIT_S = float(env("TW_WAIT_S", "90"))

HOT, FRESH_MS, AGING_MS = replication_settings(SETTING)
REPLICA_BYTES = os.environ.get("REPLICA_BYTES")
for _s in SYSTEMS:
    if _s not in KNOWN:
        sys.exit(f"unknown system {_s} (known: {' '.join(sorted(KNOWN))})")


def metrics(admin):
    """The counters and gauges of one node's /metrics, by name with labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        return parse_metrics(r.read().decode())


class Cluster:
    """`nodes` node processes, each on a port of its own (the client spreads its connections
    over them round robin, as LVS does and the simulator models), each with its own object cache,
    emulated disk and, cooperative, replica cache."""

    def __init__(self, work, root, nodes, system, cache_bytes, replica_bytes, disk_us, tag):
        cooperative, replicate, fetch, policy = node_setup(system)
        self.procs, self.admins = [], []
        self.addrs = [f"127.0.0.1:{PORT + i}" for i in range(nodes)]
        sockets = os.path.join(work, f"ctl-{tag}")
        os.makedirs(sockets, exist_ok=True)
        cfg = os.path.join(work, f"{tag}.toml")
        members = ", ".join(
            f'{{ name = "n{i + 1}", control = "unix:{sockets}/n{i + 1}.sock" }}'
            for i in range(nodes))
        write_node_config(cfg, FRESH_MS, AGING_MS, HOT, replica_bytes, replicate, members)
        for i in range(nodes):
            admin = ADMIN + i
            args = [BIN, "--config", cfg, "--log-format", "text", "node",
                    "--listen", f"127.0.0.1:{PORT + i}", "--admin", f"127.0.0.1:{admin}",
                    "--root", root, "--cache-bytes", str(cache_bytes), "--cache-policy", policy,
                    "--workers", "1", "--disk-latency-us", str(disk_us),
                    "--handoff-unix", f"{sockets}/n{i + 1}.sock"]
            if cooperative:
                args += ["--cooperative", "--name", f"n{i + 1}"]
            if fetch:
                args += ["--cluster-mechanism", "fetch"]
                for k in range(nodes):
                    args += ["--member-http", f"n{k + 1}=127.0.0.1:{PORT + k}"]
            p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(work, f"{tag}-n{i + 1}.log"), "w"),
                                 env={**os.environ, "RUST_LOG": "warn"})
            self.procs.append(p)
            self.admins.append(admin)
        deadline = time.time() + 20
        for i, a in enumerate(self.admins):
            while True:
                if self.procs[i].poll() is not None:
                    self.stop()
                    raise RuntimeError(f"node n{i + 1} exited; see {work}/{tag}-n{i + 1}.log")
                try:
                    m = metrics(a)
                    if not cooperative or counter(m, "switchyard_node_cluster_peers_up") >= nodes - 1:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"node n{i + 1} not ready in 20 s")
                time.sleep(0.05)

    def snapshot(self):
        ms = [metrics(a) for a in self.admins]
        names = ["switchyard_node_cache_hits", "switchyard_node_cache_misses",
                 "switchyard_node_replica_hits", "switchyard_node_clones_out",
                 "switchyard_node_objects_shipped", "switchyard_node_clone_fallbacks",
                 "switchyard_node_cache_rejections", "switchyard_node_replicas_received",
                 "switchyard_node_replicas_evicted", "switchyard_node_replicas_rejected",
                 "switchyard_node_cluster_fetches"]
        return {n: sum(counter(m, n) for m in ms) for n in names}

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def replay(cluster, trace, clients, requests=None):
    args = [BIN, "load", f"http://127.0.0.1:{PORT}/", "--trace", trace, "-c", str(clients),
            "--spread", ",".join(cluster.addrs), "--http1.0", "--json", "-q", "--timeout", "60s"]
    if requests:
        args += ["-n", str(requests)]
    s = json.loads(run(args))
    bad = sum(v for k, v in s["status"].items() if not k.startswith("2"))
    if s["errors_total"] or s["timeouts"] or bad:
        raise RuntimeError(f"replay had errors: {s['errors']} timeouts {s['timeouts']} "
                           f"status {s['status']}")
    return s


def time_wait_sockets():
    """TCP sockets in TIME_WAIT on this host (`ss -s`)."""
    out = run(["ss", "-s"])
    for line in out.splitlines():
        if line.startswith("TCP:") and "timewait" in line:
            return int(line.split("timewait")[1].split(")")[0].strip(" ,"))
    return 0


def settle(limit=TW_SETTLE, most=TW_WAIT_S):
    """Wait until the replays before have left fewer than `limit` sockets in TIME_WAIT (at most
    `most` seconds): a replay that starts among tens of thousands of them can fall into another
    mode than the same replay on a settled machine (bench/RESULTS.md, the LFU systems)."""
    deadline = time.time() + most
    while time_wait_sockets() >= limit and time.time() < deadline:
        time.sleep(1)


def real_run(work, root, trace, system, nodes, cache_bytes, replica_bytes, disk_us, clients,
             requests=None):
    settle()
    c = Cluster(work, root, nodes, system, cache_bytes, replica_bytes, disk_us,
                f"{system}-{nodes}")
    try:
        replay(c, trace, clients, requests)  # the warm-up pass
        before = c.snapshot()
        s = replay(c, trace, clients, requests)
        after = c.snapshot()
    finally:
        c.stop()
    d = {k: after[k] - before[k] for k in after}
    n = s["requests"]
    return {
        "requests": n,
        "secs": s["duration_s"],
        "throughput": n / s["duration_s"],
        "mbytes_per_sec": s["body_bytes"] / s["duration_s"] / 1e6,
        "memory_hit_rate": d["switchyard_node_cache_hits"] / n,
        "replica_hit_rate": d["switchyard_node_replica_hits"] / n,
        "disk_rate": d["switchyard_node_cache_misses"] / n,
        "clones_per_request": d["switchyard_node_clones_out"] / n,
        "fetches_per_request": d["switchyard_node_cluster_fetches"] / n,
        "copies_shipped": d["switchyard_node_objects_shipped"],
        "replicas_received": d["switchyard_node_replicas_received"],
        "replicas_evicted": d["switchyard_node_replicas_evicted"],
        "replicas_rejected": d["switchyard_node_replicas_rejected"],
        "fallbacks": d["switchyard_node_clone_fallbacks"],
        "mean_latency_us": s["latency_us"]["mean"],
    }


def sim_run(trace, systems, nodes, cache_bytes, replica_bytes, disk_us, clients, costs):
    # Links of 100 Gbit/s: loopback is not the limit; the CPU costs calibrated here are.
    extra = [a for k, v in costs.items() for a in (f"--{k.replace('_', '-')}", f"{v:.3f}")]
    runs = simulate(BIN, trace, nodes, systems, clients, cache_bytes, replica_bytes, HOT,
                    FRESH_MS, AGING_MS, disk_us, 100_000, extra)
    return {r["system"]: r["pass"] for r in runs}


def calibrate(work, root, trace, total_bytes, fetching):
    """CPU per request, per clone and (`fetching`) per fetch on this machine, from the client's
    mean latency at one connection (nothing queues): one node alone serving from memory, then
    two cooperative nodes serving from memory, where a share of the requests is cloned, or
    fetched. A fetch's owner is charged what serving a request costs, the fetching node the
    rest."""
    big = total_bytes * 2 + (1 << 20)
    one = real_run(work, root, trace, "RR", 1, big, 0, 0, 1, CAL_REQUESTS)
    two = real_run(work, root, trace, "SC", 2, big, 0, 0, 1, CAL_REQUESTS)
    request_us = one["mean_latency_us"]
    clone_us = max(0.0, (two["mean_latency_us"] - request_us) / max(two["clones_per_request"], 1e-9))
    costs = {"request_us": request_us, "clone_us": clone_us, "connect_us": 0.0,
             "teardown_us": 0.0, "transmit_per_512_us": 0.0, "receive_per_512_us": 0.0}
    fetch = None
    if fetching:
        fetch = real_run(work, root, trace, "CF-LRU", 2, big, 0, 0, 1, CAL_REQUESTS)
        per_fetch = max(0.0, (fetch["mean_latency_us"] - request_us)
                        / max(fetch["fetches_per_request"], 1e-9))
        costs["fetch_serve_us"] = min(request_us, per_fetch)
        costs["fetch_request_us"] = per_fetch - costs["fetch_serve_us"]
    return costs, one, two, fetch


ROWS = [  # (figure, key, held to the tolerance)
    ("req/s", "throughput", True),
    ("MB/s", "mbytes_per_sec", True),
    ("memory hits", "memory_hit_rate", True),
    ("replica hits", "replica_hit_rate", True),
    ("misses", "disk_rate", True),
    ("clones/req", "clones_per_request", True),
    ("fetches/req", "fetches_per_request", True),
]


def compare(system, real, sim):
    lines, worst = [], []
    for label, key, held in ROWS:
        a, b = sim[key], real[key]
        share = key != "throughput" and key != "mbytes_per_sec"
        small = share and max(a, b) < SMALL
        rel = abs(a - b) / max(abs(a), abs(b)) if max(abs(a), abs(b)) > 0 else 0.0
        gate = held and not small
        ok = rel <= TOL or not gate
        if not ok:
            worst.append(f"{system} {label}")
        note = "" if gate else "  (small share: not held)"
        lines.append(f"{system:<8} {label:<13} {a:>11.4f} {b:>11.4f} {rel * 100:>7.2f}%"
                     f"  {'ok' if ok else 'OVER'}{note}")
    return lines, worst


def main():
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} is not an executable switchyard binary (set BIN)")
    work = tempfile.mkdtemp(prefix="sim-vs-real-")
    os.makedirs(OUT, exist_ok=True)
    try:
        trace, name, root, total = make_trace(BIN, WHAT, work, SCALE, REQUESTS, SEED, LOG)
        scale = total / BERKELEY_BYTES
        cache_bytes = int(round(100e6 * scale))
        replica_bytes = int(REPLICA_BYTES) if REPLICA_BYTES else int(round(12e6 * scale))
        costs, one, two, fetch = calibrate(work, root, trace, total,
                                           any(s.startswith("CF") for s in SYSTEMS))
        head = (f"trace: {name}: {total / 1e6:.1f} MB in the root; {NODES} nodes, {CLIENTS} clients, "
                f"{cache_bytes} B cache and {replica_bytes} B replicas per node, setting {SETTING} "
                f"(hot from {HOT:g}, copies fresh {FRESH_MS} ms, aging {AGING_MS} ms), "
                f"emulated disk {DISK_US} us per miss on every node\n"
                f"calibrated: request {costs['request_us']:.1f} us (1 node, 1 client, from memory: "
                f"{one['mean_latency_us']:.1f} us), clone {costs['clone_us']:.1f} us (2 nodes, "
                f"{two['clones_per_request']:.3f} clones/request, {two['mean_latency_us']:.1f} us)")
        if fetch:
            head += (f", fetch {costs['fetch_request_us']:.1f} us on the fetching node and "
                     f"{costs['fetch_serve_us']:.1f} us on the owner (2 nodes, "
                     f"{fetch['fetches_per_request']:.3f} fetches/request, "
                     f"{fetch['mean_latency_us']:.1f} us)")
        print(head, flush=True)
        real = {}
        for system in SYSTEMS:
            t0 = time.time()
            real[system] = real_run(work, root, trace, system, NODES, cache_bytes, replica_bytes,
                                    DISK_US, CLIENTS)
            print(f"real {system}: {real[system]['requests']} requests in "
                  f"{real[system]['secs']:.1f} s ({time.time() - t0:.0f} s with the warm-up)",
                  flush=True)
        sim = sim_run(trace, SYSTEMS, NODES, cache_bytes, replica_bytes, DISK_US, CLIENTS, costs)
        lines = [f"{'system':<8} {'figure':<13} {'simulated':>11} {'real':>11} {'diff':>8}"]
        worst = []
        for system in SYSTEMS:
            l, w = compare(system, real[system], sim[system])
            lines += l
            worst += w
        table = "\n".join(lines)
        print(table)
        verdict = (f"all within {TOL * 100:.0f}%" if not worst
                   else f"over {TOL * 100:.0f}%: {', '.join(worst)}")
        print(verdict)
        base = os.path.join(OUT, f"sim-vs-real-{name}-n{NODES}-{SETTING}")
        with open(base + ".txt", "w") as f:
            f.write(head + "\n" + table + "\n" + verdict + "\n")
        with open(base + ".json", "w") as f:
            json.dump({"trace": name, "nodes": NODES, "clients": CLIENTS, "setting": SETTING,
                       "disk_us": DISK_US, "cache_bytes": cache_bytes,
                       "replica_bytes": replica_bytes, "costs": costs, "real": real,
                       "sim": sim}, f, indent=1)
        return 1 if worst else 0
    except RuntimeError as e:
        print(f"sim-vs-real: {e}", file=sys.stderr)
        return 2
    finally:
        if env("KEEP", "") == "":
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept: {work}")


if __name__ == "__main__":
    sys.exit(main())
