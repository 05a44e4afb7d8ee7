#!/usr/bin/env python3
"""Summarizes a run of bench/rescue/six-sites.sh (seed 001 Fig. 11): timeouts per rate step,
the order in which the origin allocated rescue servers, each rescue server's share of the
redirects against its share of D_redi, the origin's outbound rate against T_high x D_out,
and the bytes the servers counted against the bytes the clients received.

usage: six_sites_report.py OUT SCALE DNS
"""

import glob
import json
import re
import sys

T_HIGH = 0.75
T_ALERT = 0.5
SITES = ["bjs", "maglev", "ottawa", "delhi", "beirut", "ankara"]
DOUT = dict(zip(SITES, [1000, 10000, 5000, 4000, 3000, 2000]))

out, scale, dns = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
d_out = {s: round(v * scale) for s, v in DOUT.items()}
t_start = float(open(f"{out}/t_start").read())
t_end = float(open(f"{out}/t_end").read())

# --- clients: timeouts per step (all five clients together) --------------------------------------
steps = {}
bytes_clients = 0
issued = completed = timeouts = errors = redirects = 0
ok200 = 0
statuses = {}
if dns:
    files = sorted(glob.glob(f"{out}/client*.step*.json"))
else:
    files = sorted(glob.glob(f"{out}/client[0-9].json"))
for f in files:
    j = json.load(open(f))
    m = re.search(r"step(\d+)", f)
    base = int(m.group(1)) if m else 0
    bytes_clients += j["bytes"]
    issued += j["issued"]
    timeouts += j["timeouts"]
    errors += j["errors_total"]
    redirects += j.get("redirects", 0)
    ok200 += j["status"].get("200", 0)
    for k, v in j["status"].items():
        statuses[k] = statuses.get(k, 0) + v
    for k, st in enumerate(j.get("rate_steps") or []):
        s = steps.setdefault(base + k, {"rate": 0.0, "issued": 0, "timeouts": 0, "errors": 0})
        s["rate"] += st["rate"]
        s["issued"] += st["issued"]
        s["timeouts"] += st["timeouts"]
        s["errors"] += st["errors"]

print(f"## Six sites, scale {scale:g}, DNS round robin {'on' if dns else 'off'}\n")
print("D_out (kB/s): " + ", ".join(f"{s} {d_out[s]}" for s in SITES) + "\n")
print("| offered req/s (5 clients) | issued | timeouts | errors | timeout % |")
print("|---:|---:|---:|---:|---:|")
worst = 0.0
for k in sorted(steps):
    s = steps[k]
    pct = 100.0 * s["timeouts"] / s["issued"] if s["issued"] else 0.0
    worst = max(worst, pct)
    print(f"| {s['rate']:g} | {s['issued']} | {s['timeouts']} | {s['errors']} | {pct:.2f} |")
print(f"\nAll steps: {issued} issued, {ok200} answered 200, {timeouts} timeouts, {errors} errors, "
      f"{redirects} redirects followed; final statuses {dict(sorted(statuses.items()))}; "
      f"worst step {worst:.2f}% timeouts.\n")

# --- allocation order -------------------------------------------------------------------------------
adds = []
for line in open(f"{out}/bjs.log", errors="replace"):
    if "rescue server added" in line:
        peer = re.search(r"peer=(\S+)", line)
        dr = re.search(r"d_redi_kbps=(\d+)", line)
        ts = line.split()[0] if line.split() else ""
        adds.append((ts, peer.group(1).strip('"') if peer else "?", int(dr.group(1)) if dr else None))
print("Allocation order (origin's log): " +
      (", ".join(f"{p} (D_redi {d} kB/s, at {t})" for t, p, d in adds) or "none"))
expected = sorted((s for s in SITES[1:]), key=lambda s: -d_out[s])
got = [p.split(".")[1] if p.count(".") >= 2 else p for _, p, _ in adds]
first = []
for g in got:
    if g not in first:
        first.append(g)
print(f"\nDescending free capacity (D_resc = {1 - T_ALERT:g} x D_out) would be: {', '.join(expected)}; "
      f"first allocations were: {', '.join(first) or 'none'} -> "
      f"{'in that order' if first == expected[:len(first)] else 'NOT in that order'}.\n")

# --- status samples ------------------------------------------------------------------------------------
rows = [json.loads(l) for l in open(f"{out}/status.jsonl") if l.strip()]
rows = [r for r in rows if "bjs" in r and "auto" in r["bjs"]]
run = [r for r in rows if t_start <= r["epoch"] <= t_end + 1]
pat = re.compile(r"rescued by (\S+) as (\S+) \((\S+)\)\s+D_redi (\d+) kB/s\s+d_redi ([\d.]+) kB/s\s+redirects (\d+)")


def rescuers(r):
    res = {}
    for l in r["bjs"].get("rescuers", []):
        m = pat.search(l)
        if m:
            res[m.group(1)] = (int(m.group(4)), int(m.group(6)))
    return res


# Share of redirects against share of D_redi, interval by interval.
actual, expect = {}, {}
for a, b in zip(run, run[1:]):
    ra, rb = rescuers(a), rescuers(b)
    common = [p for p in rb if p in ra]
    total = sum(rb[p][1] - ra[p][1] for p in common)
    weight = sum(rb[p][0] for p in common)
    if total <= 0 or weight <= 0:
        continue
    for p in common:
        actual[p] = actual.get(p, 0) + rb[p][1] - ra[p][1]
        expect[p] = expect.get(p, 0) + total * rb[p][0] / weight
print("| rescue server | redirects to it | expected from D_redi | ratio |")
print("|---|---:|---:|---:|")
for p in sorted(actual, key=lambda p: -actual[p]):
    ratio = f"{actual[p] / expect[p]:.2f}" if expect[p] else "-"
    print(f"| {p} | {actual[p]} | {expect[p]:.0f} | {ratio} |")

# Rescue servers' own counts of what they served for the origin.
if run:
    first_r, last_r = run[0], run[-1]
    print("\nRequests each rescue server served for the origin (its own counter): " + ", ".join(
        f"{s} {int(float(last_r[s]['auto'].get('RequestsRescued', 0)) - float(first_r[s]['auto'].get('RequestsRescued', 0)))}"
        for s in SITES[1:] if "auto" in last_r.get(s, {}) and "auto" in first_r.get(s, {})))

# --- the origin's outbound rate ----------------------------------------------------------------------
dout = [(r["epoch"] - t_start, float(r["bjs"]["auto"].get("DOut", 0)) / 1000.0,
         int(r["bjs"]["auto"].get("Rescuers", 0))) for r in run]
limit = d_out["bjs"]
rescued = [d for _, d, n in dout if n > 0]
if dout:
    over = sum(1 for _, d, _ in dout if d > limit)
    print(f"\nOrigin outbound (d_out, kB/s, one sample a second): max {max(d for _, d, _ in dout):.0f}, "
          f"samples above D_out = {limit}: {over} of {len(dout)}")
if rescued:
    mean = sum(rescued) / len(rescued)
    print(f"While rescued ({len(rescued)} s): mean {mean:.0f} kB/s = {mean / limit:.2f} x D_out "
          f"(T_high x D_out = {T_HIGH * limit:.0f}), min {min(rescued):.0f}, max {max(rescued):.0f}")

# The link's own count: the origin's eth0 transmitted bytes, second by second.
try:
    tx = [tuple(float(x) for x in l.split()) for l in open(f"{out}/origin-tx.txt") if len(l.split()) == 2]
except FileNotFoundError:
    tx = []
tx = [(t, b) for t, b in tx if t_start <= t <= t_end]
# The sampling loop's own delays make single seconds noisy: rates over 10 s windows.
rates = []
i = 0
for j in range(len(tx)):
    if tx[j][0] - tx[i][0] >= 10:
        rates.append((tx[j][1] - tx[i][1]) / (tx[j][0] - tx[i][0]) / 1000.0)
        i = j
if rates:
    whole = (tx[-1][1] - tx[0][1]) / (tx[-1][0] - tx[0][0]) / 1000.0
    print(f"Origin uplink (eth0 transmitted bytes, all headers and ACKs included), kB/s over 10 s "
          f"windows: {', '.join(f'{r:.0f}' for r in rates)}; whole run {whole:.0f}; windows above "
          f"D_out = {limit}: {sum(1 for r in rates if r > limit)} of {len(rates)}")

# --- totals --------------------------------------------------------------------------------------------
if len(run) >= 2:
    srv = 0.0
    for s in SITES:
        a, b = run[0].get(s, {}).get("auto"), run[-1].get(s, {}).get("auto")
        if a and b:
            srv += float(b["TotalBytesServed"]) - float(a["TotalBytesServed"])
    print(f"\nBytes: servers counted {srv / 1e6:.2f} MB (responses, redirects and rescued responses), "
          f"clients received {bytes_clients / 1e6:.2f} MB; difference {100.0 * (srv - bytes_clients) / max(bytes_clients, 1):+.2f}%")

# --- which level absorbed the crowd ----------------------------------------------------------------
if len(run) >= 2:
    a, b = run[0]["bjs"]["auto"], run[-1]["bjs"]["auto"]
    own = float(b["RequestsServed"]) - float(a["RequestsServed"])
    redir = float(b["RequestsRedirected"]) - float(a["RequestsRedirected"])
    resc = 0.0
    for s in SITES[1:]:
        x, y = run[0].get(s, {}).get("auto"), run[-1].get(s, {}).get("auto")
        if x and y:
            resc += float(y["RequestsRescued"]) - float(x["RequestsRescued"])
    direct = max(resc - redir, 0.0)
    total = own + redir + direct
    if total > 0:
        print(f"\nRequests for the origin's content: {total:.0f} arrived; the origin served {own:.0f} "
              f"({100 * own / total:.1f}%), redirected {redir:.0f} ({100 * redir / total:.1f}%), and "
              f"{direct:.0f} ({100 * direct / total:.1f}%) went straight to rescue servers by DNS round robin "
              f"(rescue servers served {resc:.0f} in all).")
