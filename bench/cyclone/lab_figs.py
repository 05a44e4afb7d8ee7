#!/usr/bin/env python3
"""Seed 000 Figs. 11-13 on real nodes in the namespace lab: one trace replayed in log order by
HTTP/1.0 connections through a layer-4 director onto 1, 2, 4 and 8 real nodes with shaped links,
for every system the nodes can run. Run through bench/cyclone/figs11-13-lab.sh, which builds the
binary and says what the settings are; README.md explains the method.

Exit status: 0 when every run answered every request with 200, 1 when a run had errors (a
request timed out, failed or got another status), 2 on a failure to run.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from cyclone_common import (BERKELEY_BYTES, SYSTEMS as KNOWN, counter, env, make_trace,
                            node_setup, parse_metrics, replication_settings, run, simulate,
                            write_node_config)


BIN = os.path.abspath(env("BIN", "target/release/switchyard"))
WHAT = sys.argv[1] if len(sys.argv) > 1 else "synthetic"
NODES = [int(n) for n in env("NODES", "1 2 4 8").split()]
SYSTEMS = env("SYSTEMS", " ".join(KNOWN)).split()
CLIENTS = int(env("CLIENTS", "38"))
LINK_MBIT = float(env("LINK_MBIT", "10"))
SCALE = float(env("SCALE", "0.1"))
REQUESTS = int(env("REQUESTS", "30000"))
SEED = int(env("SEED", "1"))
DISK_US = int(env("DISK_US", "50000"))
SETTING = env("SETTING", "static")
BULK_SECS = float(env("BULK_SECS", "4"))
PREFIX = env("PREFIX", "syfig")
LOG = env("LOG", "/work/shared/data/usask_1995_excerpt.log")
OUT = env("OUT", "bench/cyclone/results")
LOAD_TIMEOUT = env("LOAD_TIMEOUT", "30s")
# A directory for the clients' per-request logs of the measured pass (`load --request-log`:
# issue, first byte and completion of every request), one CSV per lab and client host.
REQUEST_LOG_DIR = os.environ.get("REQUEST_LOG_DIR")

HOT, FRESH_MS, AGING_MS = replication_settings(SETTING)
for s in SYSTEMS:
    if s not in KNOWN:
        sys.exit(f"unknown system {s} (known: {' '.join(sorted(KNOWN))})")

# One bulk sender and its receiver, run in the node and client
# namespaces: the available bandwidth is what plain TCP carries on the same links.
BULK_SEND = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
c, _ = s.accept(); buf = b"\0" * 65536; end = time.time() + float(sys.argv[3]) + 2
try:
    while time.time() < end: c.sendall(buf)
except OSError: pass
"""
BULK_RECV = r"""
import socket, sys, time
for _ in range(100):
    try: c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); break
    except OSError: time.sleep(0.05)
warm = time.time() + 1; n = 0
while time.time() < warm: n += len(c.recv(1 << 20))
t0 = time.time(); n = 0; end = t0 + float(sys.argv[3])
while time.time() < end: n += len(c.recv(1 << 20))
print(n / (time.time() - t0))
"""


class Lab:
    """One `switchyard lab up` of `nodes` nodes and as many client hosts, links shaped."""

    def __init__(self, prefix, nodes, args):
        self.prefix, self.nodes = prefix, nodes
        self.down()
        run([BIN, "lab", "up", "--prefix", prefix, "--nodes", str(nodes), "--clients", str(nodes),
             "--link-mbit", f"{LINK_MBIT:g}"] + args, timeout=300)
        st = json.loads(run([BIN, "lab", "status", "--prefix", prefix, "--json"], timeout=30))
        self.vip = st["vip"]
        hosts = {h["name"]: h for h in st["hosts"]}
        self.node_ip = [hosts[f"node{k}"]["ip"] for k in range(nodes)]
        self.client_ns = [hosts[f"client{k}"]["netns"] for k in range(nodes)]
        self.node_ns = [hosts[f"node{k}"]["netns"] for k in range(nodes)]

    def down(self):
        subprocess.run([BIN, "lab", "down", "--prefix", self.prefix], capture_output=True,
                       timeout=300)

    def in_client(self, k, args):
        return ["ip", "netns", "exec", self.client_ns[k]] + args

    def metrics(self, k):
        """Node k's /metrics, by name with labels, fetched from client host 0."""
        return parse_metrics(run(self.in_client(0, ["curl", "-s", "-m", "5",
                                                    f"http://{self.node_ip[k]}:9080/metrics"]),
                                 timeout=20))

    def wait_ready(self, cooperative):
        deadline = time.time() + 60
        for k in range(self.nodes):
            while True:
                try:
                    m = self.metrics(k)
                    if not cooperative or counter(m, "switchyard_node_cluster_peers_up") \
                            >= self.nodes - 1:
                        break
                except (RuntimeError, subprocess.TimeoutExpired):
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"{self.prefix}: node{k} not ready in 60 s")
                time.sleep(0.1)

    def bulk(self):
        """Bytes per second that plain TCP carries, node k to client k, all pairs at once."""
        port = 5999
        senders = [subprocess.Popen(["ip", "netns", "exec", self.node_ns[k], "python3", "-c",
                                     BULK_SEND, self.node_ip[k], str(port), str(BULK_SECS)])
                   for k in range(self.nodes)]
        recvs = [subprocess.Popen(self.in_client(k, ["python3", "-c", BULK_RECV, self.node_ip[k],
                                                     str(port), str(BULK_SECS)]),
                                  stdout=subprocess.PIPE, text=True)
                 for k in range(self.nodes)]
        rates = [float(p.communicate(timeout=60)[0]) for p in recvs]
        for p in senders:
            p.wait(timeout=30)
        return sum(rates), rates

    def snapshot(self):
        names = ["switchyard_node_cache_hits", "switchyard_node_cache_misses",
                 "switchyard_node_replica_hits", "switchyard_node_clones_out",
                 "switchyard_node_objects_shipped", "switchyard_node_clone_fallbacks",
                 "switchyard_node_bytes_out", "switchyard_node_cluster_fetches"]
        per = []
        for k in range(self.nodes):
            m = self.metrics(k)
            per.append({n: counter(m, n) for n in names})
        return per

    def save_metrics(self, into):
        """Every node's whole /metrics text, beside the request logs, for a closer look."""
        for k in range(self.nodes):
            text = run(self.in_client(0, ["curl", "-s", "-m", "5",
                                          f"http://{self.node_ip[k]}:9080/metrics"]), timeout=20)
            with open(os.path.join(into, f"{self.prefix}-node{k}.metrics"), "w") as f:
                f.write(text)

    def replay(self, shards, conns, log=False):
        procs = []
        for k in range(self.nodes):
            if conns[k] == 0:
                continue
            extra = []
            if log and REQUEST_LOG_DIR:
                os.makedirs(REQUEST_LOG_DIR, exist_ok=True)
                extra = ["--request-log", os.path.join(REQUEST_LOG_DIR, f"{self.prefix}-c{k}.csv")]
            procs.append(subprocess.Popen(
                self.in_client(k, [BIN, "load", f"http://{self.vip}/", "--trace", shards[k],
                                   "-c", str(conns[k]), "--http1.0", "--json", "-q",
                                   "--timeout", LOAD_TIMEOUT] + extra),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        out = []
        for p in procs:
            o, e = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise RuntimeError(f"load failed: {e[-2000:]}")
            out.append(json.loads(o))
        return out


def system_args(system, cfg_rep, cfg_norep, cache_bytes):
    a = [f"--node-arg=--cache-bytes={cache_bytes}", f"--node-arg=--disk-latency-us={DISK_US}",
         "--node-arg=--workers=1"]
    cooperative, replicates, fetch, policy = node_setup(system)
    a.append(f"--node-arg=--cache-policy={policy}")
    if not cooperative:
        return ["--cooperative", "--alone"] + a, False
    a.append(f"--node-arg=--config={cfg_rep if replicates else cfg_norep}")
    if fetch:
        a.append("--node-arg=--cluster-mechanism=fetch")
    return ["--cooperative"] + a, True


def simulate_lab(trace, cache_bytes, replica_bytes):
    """The simulator on the same trace with the lab's settings and the lab's member names
    (`--first-member 0`: the owner map hashes the names), by (system, nodes)."""
    nodes = ",".join(str(n) for n in NODES)
    runs = simulate(BIN, trace, nodes, SYSTEMS, CLIENTS, cache_bytes, replica_bytes, HOT,
                    FRESH_MS, AGING_MS, DISK_US, LINK_MBIT, ["--first-member", "0"])
    return {(r["system"], r["nodes"]): r for r in runs}


def compare(rows, sim):
    """Lab against simulator, row by row: efficiency (the lab's over bulk TCP, the simulator's
    over the nominal link rate), the busiest node's bytes over the mean, memory hits."""
    cols = ["system", "nodes", "efficiency lab", "sim", "lab / sim", "busiest / mean lab",
            "sim", "memory hits lab", "sim"]
    table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out = []
    for r in rows:
        key = ("RR" if r["system"] == "single" else r["system"], r["nodes"])
        m = sim.get(key)
        if m is None:
            continue
        p = m["pass"]
        eff = p["mbytes_per_sec"] * 8 / (LINK_MBIT * r["nodes"])
        out.append({"system": r["system"], "nodes": r["nodes"], "lab_efficiency": r["efficiency"],
                    "sim_efficiency": eff, "lab_max_over_mean": r["max_bytes_over_mean"],
                    "sim_max_over_mean": m["max_bytes_over_mean"],
                    "lab_memory_hit_rate": r["memory_hit_rate"],
                    "sim_memory_hit_rate": p["memory_hit_rate"]})
        table.append(f"| {r['system']} | {r['nodes']} | {r['efficiency']:.3f} | {eff:.3f} | "
                     f"{r['efficiency'] / eff if eff else 0:.2f} | "
                     f"{r['max_bytes_over_mean']:.2f} | {m['max_bytes_over_mean']:.2f} | "
                     f"{r['memory_hit_rate']:.3f} | {p['memory_hit_rate']:.3f} |")
    return "\n".join(table), out


def main():
    # Stopped by a signal, the labs still come down (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        sys.exit("figs11-13-lab needs root (network namespaces)")
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} is not an executable switchyard binary (set BIN)")
    work = tempfile.mkdtemp(prefix="sy-figs-")
    os.chmod(work, 0o755)
    os.environ["SWITCHYARD_LAB_DIR"] = work
    os.makedirs(OUT, exist_ok=True)
    labs = []
    failed = False
    try:
        trace, name, root, total = make_trace(BIN, WHAT, work, SCALE, REQUESTS, SEED, LOG)
        name = "lab-" + name
        run(["chmod", "-R", "a+rX", root])
        scale = total / BERKELEY_BYTES
        cache_bytes = int(round(100e6 * scale))
        replica_bytes = int(round(12e6 * scale))
        cfg_rep = os.path.join(work, "rep.toml")
        cfg_norep = os.path.join(work, "norep.toml")
        write_node_config(cfg_rep, FRESH_MS, AGING_MS, HOT, replica_bytes, True)
        write_node_config(cfg_norep, FRESH_MS, AGING_MS, HOT, replica_bytes, False)
        with open(trace) as f:
            lines = f.readlines()
        head = (f"trace {name}: {len(lines)} requests, {total / 1e6:.1f} MB in the root; "
                f"{CLIENTS} HTTP/1.0 connections; links {LINK_MBIT:g} Mbit/s; "
                f"{cache_bytes} B object cache (LRU, LFU for CF-LFU and CF-REP) and {replica_bytes} B "
                f"replicas per node; setting {SETTING} (hot from {HOT:g}, copies fresh "
                f"{FRESH_MS} ms); emulated disk {DISK_US} us per miss on every node")
        print(head, flush=True)
        rows = []
        for n in NODES:
            shards = []
            for k in range(n):
                p = os.path.join(work, f"shard-{n}-{k}.log")
                with open(p, "w") as f:
                    f.writelines(lines[k::n])
                shards.append(p)
            conns = [CLIENTS // n + (1 if k < CLIENTS % n else 0) for k in range(n)]
            bulk = None
            # One node: every system is the same server alone.
            for system in (SYSTEMS[:1] if n == 1 else SYSTEMS):
                prefix = f"{PREFIX}{n}{system.replace('-', '').lower()[:3]}"
                args, coop = system_args(system, cfg_rep, cfg_norep, cache_bytes)
                lab = Lab(prefix, n, ["--root", root] + args)
                labs.append(lab)
                try:
                    lab.wait_ready(coop)
                    if bulk is None:
                        bulk, per_link = lab.bulk()
                        print(f"{n} nodes: bulk TCP {bulk / 1e6:.2f} MB/s "
                              f"({', '.join(f'{r / 1e6:.2f}' for r in per_link)})", flush=True)
                    t0 = time.time()
                    lab.replay(shards, conns)  # the warm-up pass
                    before = lab.snapshot()
                    res = lab.replay(shards, conns, log=True)
                    after = lab.snapshot()
                    if REQUEST_LOG_DIR:
                        lab.save_metrics(REQUEST_LOG_DIR)
                finally:
                    lab.down()
                    labs.remove(lab)
                reqs = sum(r["requests"] for r in res)
                secs = max(r["duration_s"] for r in res)
                body = sum(r["body_bytes"] for r in res)
                timeouts = sum(r["timeouts"] for r in res)
                errors = sum(r["errors_total"] for r in res) + timeouts + sum(
                    v for r in res for s, v in r["status"].items() if not s.startswith("2"))
                fb = sum(r["first_byte_us"]["mean"] * r["requests"] for r in res) / max(reqs, 1)
                d = [{key: a[key] - b[key] for key in a} for a, b in zip(after, before)]
                tot = {key: sum(x[key] for x in d) for key in d[0]}
                out_bytes = [x["switchyard_node_bytes_out"] for x in d]
                mean_out = sum(out_bytes) / n
                row = {
                    "system": system if n > 1 else "single", "nodes": n, "requests": reqs,
                    "secs": secs, "throughput": reqs / secs, "mbytes_per_sec": body / secs / 1e6,
                    "bulk_mbytes_per_sec": bulk / 1e6, "efficiency": body / secs / bulk,
                    "memory_hit_rate": tot["switchyard_node_cache_hits"] / reqs,
                    "replica_hit_rate": tot["switchyard_node_replica_hits"] / reqs,
                    "disk_rate": tot["switchyard_node_cache_misses"] / reqs,
                    "clones_per_request": tot["switchyard_node_clones_out"] / reqs,
                    "fetches_per_request": tot["switchyard_node_cluster_fetches"] / reqs,
                    "copies_shipped": tot["switchyard_node_objects_shipped"],
                    "fallbacks": tot["switchyard_node_clone_fallbacks"],
                    "max_bytes_over_mean": max(out_bytes) / mean_out if mean_out else 0.0,
                    "mean_first_byte_ms": fb / 1000, "errors": errors, "timeouts": timeouts,
                    "wall_s": time.time() - t0,
                }
                rows.append(row)
                failed |= errors > 0
                print(f"{n} nodes {system}: {row['throughput']:.0f} req/s, "
                      f"{row['mbytes_per_sec']:.2f} MB/s, efficiency {row['efficiency']:.3f}, "
                      f"first byte {row['mean_first_byte_ms']:.2f} ms, errors {errors} "
                      f"(timeouts {timeouts}) "
                      f"({row['wall_s']:.0f} s)", flush=True)
        cols = [("system", "{}"), ("nodes", "{}"), ("throughput", "{:.0f}"),
                ("mbytes_per_sec", "{:.2f}"), ("bulk_mbytes_per_sec", "{:.2f}"),
                ("efficiency", "{:.3f}"), ("memory_hit_rate", "{:.3f}"),
                ("replica_hit_rate", "{:.3f}"), ("disk_rate", "{:.3f}"),
                ("clones_per_request", "{:.3f}"), ("fetches_per_request", "{:.3f}"),
                ("max_bytes_over_mean", "{:.2f}"), ("mean_first_byte_ms", "{:.2f}"),
                ("errors", "{:.0f}"), ("timeouts", "{:.0f}")]
        table = ["| " + " | ".join(c for c, _ in cols) + " |",
                 "|" + "---|" * len(cols)]
        for r in rows:
            table.append("| " + " | ".join(fmt.format(r[c]) for c, fmt in cols) + " |")
        text = "\n".join(table)
        print(text)
        # The simulator with the same settings, beside the lab (a second or two).
        try:
            versus, versus_rows = compare(rows, simulate_lab(trace, cache_bytes, replica_bytes))
            text += ("\n\nAgainst the simulator (same trace and settings, the lab's member "
                     "names):\n\n")
            text += versus
            print("\n" + versus)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            print(f"figs11-13-lab: the simulator did not run: {e}", file=sys.stderr)
            versus_rows = []
        base = os.path.join(OUT, f"{name}-{SETTING}-c{CLIENTS}-l{LINK_MBIT:g}")
        with open(base + ".txt", "w") as f:
            f.write(head + "\n\n" + text + "\n")
        with open(base + ".json", "w") as f:
            json.dump({"head": head, "rows": rows, "simulator": versus_rows}, f, indent=1)
        return 1 if failed else 0
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"figs11-13-lab: {e}", file=sys.stderr)
        return 2
    finally:
        for lab in labs:
            lab.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
