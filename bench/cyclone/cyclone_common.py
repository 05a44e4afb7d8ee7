"""What the real-node drivers of bench/cyclone share (sim_vs_real.py, lab_figs.py): running a
command, reading a node's /metrics, the replication settings, the trace and its document root,
a node's configuration file, and the simulator run with a real cluster's settings."""

import json
import os
import shutil
import subprocess
import sys

BERKELEY_BYTES = 650_000_000  # switchyard_trace::synth::CYCLONE_BYTES
AGING_MS = 10_000


def env(name, default):
    """A setting from the environment, or its default."""
    return os.environ.get(name, default)


def run(args, **kw):
    """A command's standard output; RuntimeError with the tail of its errors when it fails."""
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def parse_metrics(text):
    """The counters and gauges of a Prometheus text page, by name with labels."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def counter(m, name):
    """A metric summed over its labels (`_total` or not)."""
    return sum(v for k, v in m.items() if k == name or k == name + "_total" or
               k.startswith(name + "{") or k.startswith(name + "_total{"))


# Seed 000 §5's six systems, in the order of its figures.
SYSTEMS = ("RR", "CF-LRU", "CF-LFU", "CF-REP", "SC", "Cyclone")


def node_setup(system):
    """How the real nodes of `system` run, as the simulator models it: (cooperative,
    replicating, fetching, object cache policy). CF-LFU and CF-REP keep their objects in LFU
    caches (seed 000 §5: CF-REP "used LFU for non-replicated objects"), the others in LRU."""
    return (system != "RR", system in ("CF-REP", "Cyclone"), system.startswith("CF"),
            "lfu" if system in ("CF-LFU", "CF-REP") else "lru")


def replication_settings(setting):
    """(hot threshold, copy freshness in ms, aging period in ms) of a setting, each overridable
    by HOT, FRESH_MS and AGING_MS in the environment: `static` for a site whose files do not
    change during the replay, `defaults` the node's own."""
    if setting == "static":
        hot, fresh_ms = 20.0, 60_000
    elif setting == "defaults":
        hot, fresh_ms = 200.0, 1_000
    else:
        sys.exit(f"SETTING must be static or defaults, not {setting}")
    return (float(env("HOT", hot)), int(env("FRESH_MS", fresh_ms)), int(env("AGING_MS", AGING_MS)))


def make_trace(binary, what, work, scale, requests, seed, log):
    """The trace (`synthetic`: `trace synth --preset cyclone`; `real`: the log) and the site
    made from it with `trace root`: (trace path, name, root path, bytes in the root)."""
    trace = os.path.join(work, "trace.log")
    if what == "synthetic":
        run([binary, "trace", "synth", "--preset", "cyclone", "--scale", str(scale),
             "--requests", str(requests), "--seed", str(seed), "--trace", trace])
        name = f"synthetic-s{scale}-r{requests}"
    elif what == "real":
        shutil.copy(log, trace)
        name = "real-" + os.path.basename(log).split(".")[0]
    else:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} synthetic|real (not {what})")
    root = os.path.join(work, "root")
    rj = json.loads(run([binary, "trace", "root", trace, "--out-root", root, "--json"]))
    return trace, name, root, rj["bytes"]


def write_node_config(path, fresh_ms, aging_ms, hot, replica_bytes, replicate, members=""):
    """A node's configuration file: revalidation and LFU aging, the cluster's members (a TOML
    array's inside; empty when they come as flags) and its replication."""
    with open(path, "w") as f:
        f.write(f"""[node]
cache_revalidate_ms = {fresh_ms}
lfu_aging_interval_ms = {aging_ms}

[cluster]
members = [{members}]

[cluster.replication]
enabled = {"true" if replicate else "false"}
hot_threshold = {hot}
aging_interval_ms = {aging_ms}
aging_factor = 0.5
replica_bytes = {replica_bytes}
""")
    os.chmod(path, 0o644)


def simulate(binary, trace, nodes, systems, clients, cache_bytes, replica_bytes, hot, fresh_ms,
             aging_ms, disk_us, link_mbps, extra=()):
    """`sim cyclone` on `trace` with the settings real nodes ran with (`nodes` one count or a
    comma list; LRU object caches, replication and aging as given; a disk per node of
    `disk_us` per miss and no transfer cost, as the node's emulated disk; one warm-up pass, the
    passes run apart), `extra` arguments after them: its runs, from its JSON."""
    args = [binary, "sim", "cyclone", "--trace", trace, "--nodes", str(nodes),
            "--systems", ",".join(systems), "--clients", str(clients),
            "--cache-bytes", str(cache_bytes), "--replica-bytes", str(replica_bytes),
            "--cache-policy", "lru", "--hot-threshold", f"{hot:g}", "--aging-ms", str(aging_ms),
            "--replica-fresh-ms", str(fresh_ms), "--private-disks",
            "--disk-seek-us", str(disk_us), "--disk-per-4k-us", "0", "--disk-extent-seek-us", "0",
            "--link-mbps", f"{link_mbps:g}", "--warmup-passes", "1", "--separate-passes",
            "--threads", "1", "--json", *extra]
    return json.loads(run(args, timeout=3600))["runs"]
