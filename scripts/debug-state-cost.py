#!/usr/bin/env python3
"""debug-state-cost.py: what a /debug/state fetch costs the agent's one loop.

    scripts/debug-state-cost.py BIN KEYS DIVERTED [FLOOD]

Starts BIN in -dev on fixed loopback ports (39777-39779, dev KV 38500),
writes KEYS keys (the first DIVERTED `drain`, the rest `ready`), asks FLOOD
distinct identities without a key (default 0), then fetches
/debug/state and /debug/state?diverted three times each while a prober
sends a check every 2 ms, and prints each fetch's time and size and the
checks' p50 and max latency during them. The README's figures for
`status` came from `debug-state-cost.py target/release/gitlab-haproxy-agent
20000 5`.
"""
import http.client
import socket
import subprocess
import sys
import threading
import time
import urllib.request

BIN, KEYS, DIVERTED = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
FLOOD = int(sys.argv[4]) if len(sys.argv) > 4 else 0

agent = subprocess.Popen(
    [BIN, "-dev", "-listen-addr", "127.0.0.1:39777", "-monitoring-addr", "127.0.0.1:39778",
     "-pprof-addr", "127.0.0.1:39779", "-dev-kv-addr", "127.0.0.1:38500"],
    stderr=subprocess.DEVNULL)


def ask(line):
    s = socket.create_connection(("127.0.0.1", 39777))
    s.sendall(line)
    reply = s.recv(64)
    s.close()
    return reply


try:
    time.sleep(0.5)
    kv = http.client.HTTPConnection("127.0.0.1", 38500)
    for i in range(KEYS):
        value = b"drain" if i < DIVERTED else b"ready"
        kv.request("PUT", "/v1/kv/gitlab-haproxy-agent/state/be_%d/srv_%d" % (i // 10, i % 10), body=value)
        kv.getresponse().read()
    for i in range(FLOOD):
        ask(b"be_flood/" + b"x" * 180 + str(i).encode() + b"\n")
    time.sleep(1)
    latencies, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            t0 = time.perf_counter()
            ask(b"be_0/srv_1\n")
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.002)

    for path in ["/debug/state", "/debug/state?diverted"]:
        latencies.clear()
        stop.clear()
        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(0.3)
        for _ in range(3):
            t0 = time.perf_counter()
            body = urllib.request.urlopen("http://127.0.0.1:39779" + path).read()
            print("%-24s %7.1f ms %10d bytes" % (path, (time.perf_counter() - t0) * 1000, len(body)))
            time.sleep(0.2)
        stop.set()
        prober.join()
        latencies.sort()
        print("%-24s checks meanwhile: n=%d p50 %.2f ms max %.2f ms" % (
            path, len(latencies), latencies[len(latencies) // 2] * 1000, latencies[-1] * 1000))
finally:
    agent.terminate()
    agent.wait()
