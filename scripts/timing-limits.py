#!/usr/bin/env python3
"""The limits of the README's timing promise, measured (issue 38).

Two scenarios against the release (or debug) binary, loopback only, free
ports picked by the kernel:

  storm   a writer puts a key as fast as consul takes it (every --gap
          seconds) for --seconds; for each write, the time until the agent
          answers the new value (asked every 5 ms, as a fast agent-inter
          would). The watch's token bucket (a burst of 5 reads, then one a
          second) bounds how often it reads consul, so under a storm a
          write waits for the next read.
  outage  consul (a second process of the binary in -dev, standing in for
          it) is killed for --down seconds, started again on the same port,
          and a key written at once; the time until the agent answers it.
          The watch backs off 250 ms doubling to 30 s (jittered) while
          consul is down, so the first read after it is back can come up to
          30 s later.

  scripts/timing-limits.py [--bin PATH] storm [--seconds 30] [--gap 0.05]
  scripts/timing-limits.py [--bin PATH] outage [--down 60] [--runs 3]

Prints one summary line per scenario (p50, p90, p99, max in seconds).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, limit=10.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"timing-limits: nothing listens on 127.0.0.1:{port} after {limit}s")


def ask(port, identity):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(identity.encode() + b"\n")
            return s.makefile().readline().strip()
    except OSError:
        return None


def put(kv, key, value):
    req = urllib.request.Request(f"http://127.0.0.1:{kv}/v1/kv/{key}", data=value.encode(), method="PUT")
    with urllib.request.urlopen(req, timeout=2) as r:
        r.read()


def start(binary, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "GITLAB_"))}
    env["GITLAB_LOG_LEVEL"] = "warn"
    return subprocess.Popen([binary, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kv_process(binary, port):
    p = start(binary, ["-dev", "-dev-kv-addr", f"127.0.0.1:{port}", "-listen-addr", "",
                       "-monitoring-addr", "", "-pprof-addr", ""])
    wait_port(port)
    return p


def until_answered(agent, identity, want, limit):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if ask(agent, identity) == want:
            return time.monotonic() - t0
        time.sleep(0.005)
    return float("inf")


def summary(name, took):
    took = sorted(took)
    q = lambda p: took[min(len(took) - 1, int(p * len(took)))]
    print(f"{name}: n={len(took)} p50={q(0.5):.2f}s p90={q(0.9):.2f}s p99={q(0.99):.2f}s max={took[-1]:.2f}s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/gitlab-haproxy-agent")
    sub = ap.add_subparsers(dest="scenario", required=True)
    st = sub.add_parser("storm")
    st.add_argument("--seconds", type=float, default=30)
    st.add_argument("--gap", type=float, default=0.05)
    ou = sub.add_parser("outage")
    ou.add_argument("--down", type=float, default=60)
    ou.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    kv_port, agent_port = free_port(), free_port()
    kv = kv_process(a.bin, kv_port)
    agent = start(a.bin, ["-consul-addr", f"127.0.0.1:{kv_port}", "-listen-addr", f"127.0.0.1:{agent_port}",
                          "-monitoring-addr", "", "-pprof-addr", ""])
    try:
        wait_port(agent_port)
        key = "gitlab-haproxy-agent/state/be/s1"
        if a.scenario == "storm":
            took = []
            end = time.monotonic() + a.seconds
            n = 0
            while time.monotonic() < end:
                n += 1
                pct = 1 + n % 99
                put(kv_port, key, f"{pct}%")
                took.append(until_answered(agent_port, "be/s1", f"ready {pct}%", 10))
                time.sleep(a.gap)
            summary(f"storm (a write every {a.gap}s after the last was seen, {a.seconds}s)", took)
        else:
            took = []
            for run in range(a.runs):
                put(kv_port, key, "drain")
                until_answered(agent_port, "be/s1", "drain 100%", 10)
                kv.kill()
                kv.wait()
                time.sleep(a.down)
                kv = kv_process(a.bin, kv_port)
                value = f"{run + 1}%"
                put(kv_port, key, value)
                took.append(until_answered(agent_port, "be/s1", f"ready {value}", 120))
            summary(f"outage (consul down {a.down}s, a write as it is back)", took)
    finally:
        for p in (agent, kv):
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
