#!/usr/bin/env python3
"""A `switchyard load --rate-profile` shaped by a real per-minute request-rate profile.

The source is bench data from /work/shared/data: the University of Saskatchewan server's log
of 1 June 1995 (Common Log Format), whose first excerpt covers 00:00-02:45 with every line, so
minutes without a line really had no request. The requests of each minute from START for
MINUTES minutes are counted; each minute becomes SECS seconds of the profile, at a rate
proportional to its count, the busiest minute at PEAK requests/s (per client).

usage: crowd_profile.py LOG START(HH:MM) MINUTES SECS PEAK
"""

import collections
import re
import sys

log, start, minutes, secs, peak = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
h0, m0 = (int(x) for x in start.split(":"))
counts = collections.Counter()
day = None
for line in open(log, errors="replace"):
    m = re.search(r"\[(\d+/\w+/\d+):(\d+):(\d+):", line)
    if not m:
        continue
    day = day or m.group(1)
    if m.group(1) != day:
        break  # the first excerpt only: later ones are other days
    counts[int(m.group(2)) * 60 + int(m.group(3))] += 1
series = [counts[h0 * 60 + m0 + k] for k in range(minutes)]
top = max(series) or 1
print(",".join(f"{peak * c / top:.2f}:{secs:g}" for c in series))
print(f"# {day} {start} +{minutes} min, counts per minute: {series}", file=sys.stderr)
