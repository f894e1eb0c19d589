#!/usr/bin/env python3
"""Helpers for scripts/load.sh and scripts/soak.sh (loopback only, std only).

  loadtool.py addrs LOGFILE              print "listen monitoring dev_kv" from the listening line
  loadtool.py put-keys KV PREFIX N       PUT N keys be_{i//10}/srv_{i%10} over one keep-alive connection
  loadtool.py metric MON SERIES          print one metric value
  loadtool.py drip ADDR N SECS [READY]   N connections sending one byte a second (reconnecting when closed)
  loadtool.py churn KV PREFIX SECS MS    one PUT every MS milliseconds for SECS seconds
  loadtool.py rss PID                    print VmRSS and VmHWM in KiB
  loadtool.py hist MON FILE              save the agent's request duration histogram
  loadtool.py hist-p99 BEFORE AFTER      agent-side p99 between two saved histograms
"""
import http.client
import socket
import sys
import time

VALUES = ["drain", "maint", "50%", "ready"]


def hostport(a):
    h, p = a.rsplit(":", 1)
    return h.strip("[]"), int(p)


def addrs(logfile):
    for line in open(logfile, encoding="utf-8", errors="replace"):
        if '"msg":"listening"' in line:
            got = {}
            for part in line.split('"addresses":"', 1)[1].split('"', 1)[0].split():
                k, v = part.split("=", 1)
                got[k] = v
            print(got.get("listen_addr", "-"), got.get("monitoring_addr", "-"), got.get("dev_kv_addr", "-"))
            return
    sys.exit("no listening line yet")


def put_keys(kv, prefix, n):
    h, p = hostport(kv)
    c = http.client.HTTPConnection(h, p, timeout=10)
    for i in range(n):
        c.request("PUT", f"/v1/kv/{prefix}/be_{i // 10}/srv_{i % 10}", body=VALUES[i % 4])
        r = c.getresponse()
        body = r.read()
        if r.status != 200 or body != b"true":
            sys.exit(f"PUT {i}: {r.status} {body!r}")
    c.close()


def metric(mon, series):
    h, p = hostport(mon)
    c = http.client.HTTPConnection(h, p, timeout=5)
    c.request("GET", "/-/metrics")
    text = c.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            print(line.split()[-1])
            return
    sys.exit(f"{series} not found")


def scrape(mon):
    h, p = hostport(mon)
    c = http.client.HTTPConnection(h, p, timeout=5)
    c.request("GET", "/-/metrics")
    return c.getresponse().read().decode()


def hist(mon, path):
    """The cumulative `le` buckets of the agent's own accept -> reply histogram."""
    name = "gitlab_haproxy_agent_request_duration_seconds_bucket{le=\""
    with open(path, "w") as f:
        for line in scrape(mon).splitlines():
            if line.startswith(name):
                le, value = line[len(name):].split('"} ')
                f.write(f"{le} {value}\n")


def hist_p99(before, after):
    """The smallest bucket bound holding 99 % of the replies in between: the
    agent's own share of the latency, without the load generator's."""
    def load(path):
        return [(le, float(v)) for le, v in (l.split() for l in open(path))]
    b, a = load(before), load(after)
    total = a[-1][1] - b[-1][1]
    for (le, va), (_, vb) in zip(a, b):
        if total > 0 and va - vb >= 0.99 * total:
            print(f"<= {float(le) * 1e6:g} us" if le != "+Inf" else "> 5 s")
            return
    print("n/a")


def drip(addr, n, secs, ready=None):
    h, p = hostport(addr)

    def conn():
        s = socket.create_connection((h, p), timeout=5)
        s.setblocking(False)
        return s

    socks = [conn() for _ in range(n)]
    if ready:
        open(ready, "w").close()
    end = time.monotonic() + secs
    reconnects = 0
    # Each connection on its own phase: 1/100 of them every 10 ms, so each
    # sends one byte a second without all of them sending at once.
    step = max(1, n // 100)
    i = 0
    while time.monotonic() < end:
        time.sleep(0.01)
        for _ in range(step):
            try:
                socks[i].send(b"x")
            except OSError:
                socks[i].close()
                socks[i] = conn()
                reconnects += 1
            i = (i + 1) % n
    print(f"drip: {n} connections, {reconnects} reconnects", file=sys.stderr)


def churn(kv, prefix, secs, ms):
    h, p = hostport(kv)
    c = http.client.HTTPConnection(h, p, timeout=10)
    end = time.monotonic() + secs
    i = 0
    while time.monotonic() < end:
        c.request("PUT", f"/v1/kv/{prefix}/be_churn/srv_{i % 50}", body=VALUES[i % 4])
        r = c.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"churn PUT: {r.status}")
        i += 1
        time.sleep(ms / 1000)
    print(f"churn: {i} PUTs", file=sys.stderr)


def rss(pid):
    got = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            got[k] = v.split()[0]
    print(got["VmRSS"], got["VmHWM"])


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "addrs":
        addrs(args[0])
    elif cmd == "put-keys":
        put_keys(args[0], args[1], int(args[2]))
    elif cmd == "metric":
        metric(args[0], args[1])
    elif cmd == "drip":
        drip(args[0], int(args[1]), float(args[2]), args[3] if len(args) > 3 else None)
    elif cmd == "churn":
        churn(args[0], args[1], float(args[2]), float(args[3]))
    elif cmd == "rss":
        rss(args[0])
    elif cmd == "hist":
        hist(args[0], args[1])
    elif cmd == "hist-p99":
        hist_p99(args[0], args[1])
    else:
        sys.exit(__doc__)
