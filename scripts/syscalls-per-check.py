#!/usr/bin/env python3
"""Syscalls per agent check, counted by strace on the running agent.

Usage: scripts/syscalls-per-check.py BIN [CHECKS] [THREADS]

Starts BIN in -dev on fixed loopback ports (29777, dev KV 28500; no
monitoring or pprof listener), writes 1,000 keys, warms up, then attaches
`strace -c -f` to every thread of the agent, makes CHECKS (20,000) checks
from THREADS (8) client threads, each a new connection sending its line at
once, and prints each syscall the agent made per check.

The README's claim: four syscalls per check (`accept4`, `recvfrom`,
`sendto`, `close`); `epoll_ctl` only for a connection whose line was not
there at accept; `epoll_wait` shared by the checks of one loop turn (with
one client at a time, one per check). Each wake-up also costs one
`accept4` that finds the queue empty (EAGAIN). Exits 1 when `recvfrom`,
`sendto`, `close`, or `accept4` less one per `epoll_wait`, is not 1 per
check (within 5 %), or any other syscall but `epoll_wait` passes 0.05 per
check. strace slows the agent several times, so with many clients the
backlog is rarely empty and `epoll_wait` is rare. Needs strace and ptrace
permission; loopback only; the agent and strace are stopped by their PIDs."""
import os, signal, socket, subprocess, sys, tempfile, threading, time

BIN = sys.argv[1]
CHECKS = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
THREADS = int(sys.argv[3]) if len(sys.argv) > 3 else 8
PORT, KV_PORT = 29777, 28500
PREFIX = b"gitlab-haproxy-agent/state"
NAMES = [b"be_%d/srv_%d" % (i // 10, i % 10) for i in range(1000)]
FOUR = ["accept4", "recvfrom", "sendto", "close"]


def connect(port):
    for _ in range(500):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.01)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


def put_keys():
    s = connect(KV_PORT)
    for start in range(0, len(NAMES), 200):
        batch = NAMES[start:start + 200]
        s.sendall(b"".join(b"PUT /v1/kv/%s/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\ndrain"
                           % (PREFIX, n) for n in batch))
        got = b""
        while got.count(b"true") < len(batch):
            got += s.recv(65536)
    s.close()


def check(line):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    s.sendall(line)
    got = b""
    while True:
        b = s.recv(64)
        if not b:
            break
        got += b
    s.close()
    return got


def clients(n):
    def run(k):
        for i in range(k, n, THREADS):
            if check(NAMES[i % len(NAMES)] + b"\n") != b"drain 100%\n":
                failed.append(i)
    failed = []
    ts = [threading.Thread(target=run, args=(k,)) for k in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return failed


def traced(status):
    """Whether a thread (its /proc status file) has a tracer."""
    for line in open(status):
        if line.startswith("TracerPid:"):
            return line.split()[1] != "0"
    return False


def summary(path):
    """strace -c's table: syscall -> calls."""
    calls = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    return calls


agent = subprocess.Popen([BIN, "-dev", "-listen-addr", f"127.0.0.1:{PORT}", "-monitoring-addr", "",
                          "-pprof-addr", "", "-dev-kv-addr", f"127.0.0.1:{KV_PORT}"],
                         stderr=subprocess.DEVNULL)
strace = None
out = tempfile.NamedTemporaryFile(prefix="syscalls-", suffix=".txt", delete=False).name
try:
    put_keys()
    deadline = time.monotonic() + 10
    while check(NAMES[-1] + b"\n") != b"drain 100%\n":
        if time.monotonic() > deadline:
            sys.exit("the agent never answered the keys written")
        time.sleep(0.05)
    clients(1000)  # warm-up: buffers and tables at their size
    strace = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(agent.pid)],
                              stderr=subprocess.DEVNULL)
    # Counting starts once strace is the tracer of every thread.
    tasks = [f"/proc/{agent.pid}/task/{t}/status" for t in os.listdir(f"/proc/{agent.pid}/task")]
    threads = len(tasks)
    deadline = time.monotonic() + 10
    while not all(traced(t) for t in tasks):
        if strace.poll() is not None or time.monotonic() > deadline:
            sys.exit("strace could not attach to every thread (ptrace permission?)")
        time.sleep(0.01)
    t0 = time.monotonic()
    failed = clients(CHECKS)
    took = time.monotonic() - t0
    time.sleep(0.2)  # the last closes
    strace.send_signal(signal.SIGINT)
    strace.wait(timeout=10)
finally:
    if strace and strace.poll() is None:
        strace.kill()
    agent.terminate()
    agent.wait()

calls = summary(out)
os.remove(out)
print(f"{CHECKS} checks from {THREADS} client threads in {took:.1f} s under strace "
      f"({threads} agent threads traced); {len(failed)} without the expected reply")
print(f"{'syscall':<16}{'calls':>10}{'per check':>12}")
for name, n in sorted(calls.items(), key=lambda kv: -kv[1]):
    print(f"{name:<16}{n:>10}{n / CHECKS:>12.3f}")
# A wake-up (epoll_wait) ends its accepts on an empty queue: one accept4
# more (EAGAIN) per epoll_wait.
waits = calls.get("epoll_wait", 0) / CHECKS
bad = [f"{s}: {calls.get(s, 0) / CHECKS:.3f} per check, not 1" for s in FOUR
       if not 0.95 <= calls.get(s, 0) / CHECKS - (waits if s == "accept4" else 0) <= 1.05]
bad += [f"{s}: {n / CHECKS:.3f} per check" for s, n in calls.items()
        if s not in FOUR and s != "epoll_wait" and n / CHECKS > 0.05]
if failed or bad:
    sys.exit("not four syscalls per check: " + "; ".join(bad or [f"{len(failed)} checks failed"]))
print(f"four syscalls per check: {', '.join(FOUR)}; plus {waits:.3f} epoll_wait and as many accept4 "
      "finding the queue empty (a wake-up: one per check when checks come one at a time)")
