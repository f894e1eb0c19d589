#!/usr/bin/env python3
"""Measure how the agent's own work stalls its answers (loopback only, stdlib only).

usage: scripts/loop-stall.py [--seconds N] [--only NAME,...] [--json] [--load-nice N] BIN

BIN is a release build of the agent. Each scenario starts two of them,
every listener on an ephemeral loopback port: a KV holder (`-dev`, watching
a prefix of its own, so it only serves its consul-compatible KV) and the
agent measured, reading that KV as its consul (`-consul-addr`). The dev KV
renders each listing in one turn of its own loop; kept in the measured
process, a 27 MB listing (big-values) would stall it 200-700 ms for
reasons that are no part of the product. The script seeds the KV through
its consul KV API (PUTs pipelined on one keep-alive connection), waits
until the agent answers from the whole seeded state, then runs the
scenario's load for N seconds (default 8; at most 60) while:
  - a checker thread does sequential agent checks (`be/srv1`, expecting
    `drain`; a new connection each, one every ~5 ms) and records
    connect-to-reply latency (a check slower than 2 s per socket step is a
    failure);
  - a sampler thread reads the measured agent's VmRSS every 50 ms.
The load runs in a child process (this script re-invoked with a private
option) so its CPU does not hold the measuring threads' GIL; it and the KV
holder run at nice 10 (--load-nice): on a 2-core machine a load that
saturates a core otherwise preempts the agent mid-turn, and the wait
shows in the turn's wall clock and the checks: the machine's scheduler,
not the agent's work (production load arrives from other hosts;
loop_preempted below counts the preemptions). It stops at
its own deadline, closes what it opened and prints its stats as one JSON
line; the parent kills it by PID if it overruns. Both agents are stopped
(SIGTERM, then SIGKILL after 7 s) after each scenario. Nothing else is
started or killed.

Scenarios (the findings of issue 26):
  baseline                 2 keys, checks only.
  sweep-churn              -unasked-after 4s; 2,000 diverted keys never asked
                           (be_sweep/srv-dNNNN) and 2,000 identities without a
                           key one edit away (be_sweep/srv-aNNNN) asked ~400/s,
                           cycling, one connection each; one KV write a second
                           (be_deploy/srvN, drain/ready: a rolling deploy). Checks
                           start 5 s after the load, past the unasked window, so
                           sweeps with did-you-mean suggestions run while they do.
  debug-state-pipelining   20,000 keys; 4 pprof connections pipelining
                           GET /debug/state and reading the responses (a
                           connection the agent closes is opened again).
  metrics-pipelining       20,000 keys; 5 monitoring connections pipelining
                           GET /-/metrics and reading the responses (likewise).
  non-reading              20,000 keys; 32 pprof connections (the pool's size)
                           each send 8 pipelined GET /debug/state and never read.
  hint-flood-slow-stderr   the agent's stderr is read at 100 KB/s (10 KB every
                           100 ms, from its start); 3,000 connections each send a
                           distinct identity without a newline and close.
  long-unknown-identities  -max-line-bytes 65536; 2,000 distinct 65,000-byte
                           identities without a key, asked once each.
  big-values               40 keys of 500,000-byte values; one of them
                           rewritten each second (any write makes the agent
                           re-read and decode the whole prefix, ~27 MB of JSON).
  expiry-slow-stderr       20,000 keys, all `drain`, written with consul Flags
                           (`set -for`) that all expire at one second, 2 s into
                           the checks; the agent's stderr read at 100 KB/s. At
                           that second the agent counts 20,000 expired keys and
                           logs a warning for each (~6 MB of log lines).
The 20,000 keys are be_<i/10>/srv_<i%10>, every fourth `drain` (5,000
diverted: more than the 1,000 diverted-key metric series), the rest
`ready`. Every scenario but sweep-churn runs with -unasked-after 1h, so the
unasked sweep (sweep-churn's subject) does not mix into the others.

How to read the table: p50/p99/max are connect-to-reply latencies of the
checks that got `drain` back, in ms; `fail` counts checks that timed out or
got something else (reasons listed under the table). Where a failed check
took longer than every answered one, max shows `≥` its time instead: a
check that timed out waited at least that long (JSON: `max_ms` of the
answered checks, `max_any_ms` of all). RSS idle is the last
sample before the load started (after seeding), peak the highest from the
load's start until the load process exited, growth = peak - idle, in MiB.
The evidence column shows that the scenario did what it says, from one
scrape of the agent's /-/metrics after the load (names without the
gitlab_haproxy_agent_ prefix; a metric the binary lacks is left out), the
agent's log lines the script read during the load, and the load's own
counts. `loop_preempted` is how many times the scheduler took the CPU
from the agent's loop thread during the load (its nonvoluntary context
switches): a loop turn or a check slower than the agent's work shows up
there. `loop_turn_max_ms` is the longest loop turn since the previous
scrape (in metrics-pipelining, since the load's last request); a binary
that renders /-/metrics at most once a second may show a render up to a
second old. Loop turns are wall-clock time: a busy machine that
deschedules the agent shows up there and in the checks' max.
Figures on a machine busy with other work overstate latencies: measure on a
quiet one, and compare builds on the same machine, one after the other.

The checker, the RSS sampler and the pipelining load are
scripts/hostile-http.py's, imported from it.
"""
import argparse
import collections
import http.client
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

_spec = importlib.util.spec_from_file_location(
    "hostile_http", os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile-http.py"))
hh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hh)

PREFIX = hh.PREFIX
BASE_KEYS = [("be/srv1", b"drain"), ("be/srv2", b"maint")]  # the checker asks be/srv1
METRIC_PREFIX = "gitlab_haproxy_agent_"
IDLE_SETTLE = 1.0
SEED_TIMEOUT = 120.0  # seeding and the agent taking it all in
ATTACK_GRACE = 20.0  # past its deadline, the load process is killed
METRICS_TIMEOUT = 20.0  # the closing scrape (a blocked agent may take long)
STOP_WAIT = 7.0
SLOW_STDERR = (10240, 0.1)  # bytes per read, seconds between reads: 100 KB/s

SWEEP_KEYS = 2000
SWEEP_ASK_RATE = 400
SWEEP_UNASKED_AFTER = 4
SWEEP_WARMUP = SWEEP_UNASKED_AFTER + 1.0
MANY_KEYS = 20000
EXPIRY_LEAD = 2.0  # the checks start this long before the keys expire
EXPIRY_MARGIN = 30  # seconds from the start of seeding to the expiry: seeding and settling fit
HINTS = 3000
LONG_IDS = 2000
LONG_ID_BYTES = 65000
BIG_KEYS = 40
BIG_VALUE_BYTES = 500000
NO_SWEEP = ["-unasked-after", "1h"]
KV_HOLDER_PREFIX = "loop-stall/kv-holder"  # the KV holder's own watch: empty

DEBUG_STATE_REQ = b"GET /debug/state HTTP/1.1\r\nHost: x\r\n\r\n"
METRICS_REQ = b"GET /-/metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def sweep_keys():
    return [(f"be_sweep/srv-d{i:04d}", b"drain") for i in range(SWEEP_KEYS)]


def many_keys():
    return [(f"be_{i // 10}/srv_{i % 10}", b"drain" if i % 4 == 0 else b"ready") for i in range(MANY_KEYS)]


def expiring_keys():
    """Every key diverted, all expiring at one second: (key, value, flags), and that second."""
    at = int(time.time()) + EXPIRY_MARGIN
    return [(f"be_{i // 10}/srv_{i % 10}", b"drain", at) for i in range(MANY_KEYS)], at


def big_value(n):
    return (b"%010d" % n) + b"x" * (BIG_VALUE_BYTES - 10)


def big_keys():
    return [(f"be_big/srv{i}", big_value(i)) for i in range(BIG_KEYS)]


class Scenario:
    def __init__(self, name, flags, keys, attack, warmup=0.0, slow_stderr=False, evidence=(), logs=()):
        self.name = name
        self.flags = flags
        self.keys = keys  # () -> [(key, value[, flags])] seeded after BASE_KEYS, or (that, expiry second)
        self.attack = attack  # {"kind": ..., params}: what the load process does
        self.warmup = warmup  # load runs this long before the checks start
        self.slow_stderr = slow_stderr
        self.evidence = evidence  # (label, metric name without prefix, label filter or None)
        self.logs = logs  # (label, start of a log message) counted during the load


COMMON_EVIDENCE = (("keys", "state_keys", None), ("loop_turn_max_ms", "loop_turn_max_seconds", None))
SWEEP_EVIDENCE = (("unasked", "state_unasked_keys", None), ("unknown_ids", "unknown_identities", None),
                  ("swaps", "state_swaps_total", None))
HTTP_EVIDENCE = (("swaps", "state_swaps_total", None), ("http_dropped", "http_connections_dropped_total", None))

SCENARIOS = [
    Scenario("baseline", NO_SWEEP, lambda: [], {"kind": "none"}),
    Scenario("sweep-churn", ["-unasked-after", f"{SWEEP_UNASKED_AFTER}s"], sweep_keys,
             {"kind": "sweep"}, warmup=SWEEP_WARMUP, evidence=SWEEP_EVIDENCE,
             logs=(("unasked_warnings", "diverted key unasked"),)),
    Scenario("debug-state-pipelining", NO_SWEEP, many_keys,
             {"kind": "pipeline", "target": "pprof_addr", "req": "debug_state", "conns": 4},
             evidence=HTTP_EVIDENCE),
    Scenario("metrics-pipelining", NO_SWEEP, many_keys,
             {"kind": "pipeline", "target": "monitoring_addr", "req": "metrics", "conns": 5},
             evidence=HTTP_EVIDENCE),
    Scenario("non-reading", NO_SWEEP, many_keys, {"kind": "nonreading"}, evidence=HTTP_EVIDENCE),
    Scenario("hint-flood-slow-stderr", NO_SWEEP, lambda: [], {"kind": "hints"}, slow_stderr=True,
             evidence=(("no_newline", "requests_total", 'outcome="no_newline"'),
                       ("log_dropped", "log_lines_dropped_total", None)),
             logs=(("hint_lines", "agent connection sent"), ("drop_reports", "log lines dropped"))),
    Scenario("long-unknown-identities", NO_SWEEP + ["-max-line-bytes", "65536"], lambda: [],
             {"kind": "longids"},
             evidence=(("unknown_ids", "unknown_identities", None),
                       ("unknown_overflow", "unknown_identities_overflow_total", None),
                       ("too_long", "requests_total", 'outcome="too_long"'))),
    Scenario("big-values", NO_SWEEP, big_keys, {"kind": "bigvalues"},
             evidence=(("swaps", "state_swaps_total", None),
                       ("invalid", "state_invalid_keys", None),
                       ("consul_rx_MiB", "consul_received_bytes_total", None))),
    Scenario("expiry-slow-stderr", NO_SWEEP, expiring_keys, {"kind": "none"}, slow_stderr=True,
             evidence=(("expired", "state_expired_keys", None),
                       ("log_dropped", "log_lines_dropped_total", None)),
             logs=(("expiry_lines", "a divert is past its expiry"), ("drop_reports", "log lines dropped"))),
]


# --------------------------------------------------------------------------
# load side (child process)
# --------------------------------------------------------------------------

def paced(rate, deadline):
    """Yields about `rate` times a second until `deadline`; no burst to catch up."""
    nxt = time.monotonic()
    while time.monotonic() < deadline:
        yield
        nxt += 1.0 / rate
        now = time.monotonic()
        if nxt > now:
            time.sleep(min(nxt, deadline) - now)
        else:
            nxt = now


def ask(addr, line, timeout=2.0):
    """One agent check on a new connection: the reply's first word, or the error's name."""
    try:
        with socket.create_connection(addr, timeout=timeout) as s:
            s.sendall(line)
            buf = b""
            while b"\n" not in buf:
                d = s.recv(256)
                if not d:
                    break
                buf += d
        return (buf.split(b" ", 1)[0].decode("latin-1") or "closed") if buf else "closed"
    except OSError as e:
        return type(e).__name__


def kv_writer(addr, deadline, value_of, st, lock):
    """One KV PUT a second on one keep-alive connection: value_of(n) -> (key, body)."""
    conn = http.client.HTTPConnection(*addr, timeout=10)
    n = 0
    for _ in paced(1.0, deadline):
        key, body = value_of(n)
        n += 1
        t0 = time.monotonic()
        try:
            conn.request("PUT", f"/v1/kv/{PREFIX}/{key}", body=body)
            r = conn.getresponse()
            r.read()
            outcome = "writes_ok" if r.status == 200 else f"write_status_{r.status}"
        except (OSError, http.client.HTTPException) as e:
            outcome = "write_error:" + type(e).__name__
            conn.close()
            conn = http.client.HTTPConnection(*addr, timeout=10)
        with lock:
            st[outcome] += 1
            st["write_max_ms"] = max(st["write_max_ms"], round((time.monotonic() - t0) * 1000))
    conn.close()


def attack_sweep(addrs, deadline):
    st, lock = collections.Counter(), threading.Lock()
    lines = [b"be_sweep/srv-a%04d\n" % i for i in range(SWEEP_KEYS)]

    def asker():
        for i, _ in enumerate(paced(SWEEP_ASK_RATE, deadline)):
            reply = ask(addrs["listen_addr"], lines[i % len(lines)])
            with lock:
                st["asks:" + reply] += 1

    def deploy(n):
        return f"be_deploy/srv{n % 20}", b"drain" if n % 2 == 0 else b"ready"

    th = [threading.Thread(target=asker, daemon=True),
          threading.Thread(target=kv_writer, args=(addrs["dev_kv_addr"], deadline, deploy, st, lock), daemon=True)]
    for t in th:
        t.start()
    for t in th:
        t.join(max(0.1, deadline - time.monotonic() + 5))
    return dict(st)


def attack_pipelining(addr, deadline, req, conns):
    """`conns` connections pipelining `req` and reading, each reopened if the agent closes it."""
    st, lock = collections.Counter(), threading.Lock()

    def slot():
        while deadline - time.monotonic() > 0.1:
            one = hh.attack_pipeline(addr, deadline - time.monotonic(), req, nconn=1)
            one.pop("responses_per_s", None)
            with lock:
                st.update({k: v for k, v in one.items() if k != "connections"})
                st["connections_opened"] += one.get("connections", 0)

    th = [threading.Thread(target=slot, daemon=True) for _ in range(conns)]
    for t in th:
        t.start()
    for t in th:
        t.join(max(0.1, deadline - time.monotonic() + 5))
    st["MiB_received"] = round(st.pop("bytes_recv", 0) / 1048576)
    st.pop("bytes_sent", None)
    return dict(st)


def attack_nonreading(addrs, deadline, conns=32, requests=8):
    st = collections.Counter()
    socks = []
    for _ in range(conns):
        try:
            s = socket.create_connection(addrs["pprof_addr"], timeout=1.0)
            s.sendall(DEBUG_STATE_REQ * requests)
            socks.append(s)
        except OSError as e:
            st["connect_fail:" + type(e).__name__] += 1
    st["connections"] = len(socks)
    time.sleep(max(0.0, deadline - time.monotonic()))
    for s in socks:  # what the agent did with them, without reading it
        try:
            d = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            st["answered_unread" if d else "closed_by_server"] += 1
        except BlockingIOError:
            st["nothing_sent"] += 1
        except OSError as e:
            st["recv_error:" + type(e).__name__] += 1
        s.close()
    return dict(st)


def attack_hints(addrs, deadline):
    st = collections.Counter()
    t0 = time.monotonic()
    for i in range(HINTS):
        if time.monotonic() >= deadline:
            st["not_sent_deadline"] = HINTS - i
            break
        try:
            with socket.create_connection(addrs["listen_addr"], timeout=2.0) as s:
                s.sendall(b"be_hint/srv-%05d-no-newline" % i)
            st["sent"] += 1
        except OSError as e:
            st["error:" + type(e).__name__] += 1
    st["send_ms"] = round((time.monotonic() - t0) * 1000)
    time.sleep(max(0.0, deadline - time.monotonic()))
    return dict(st)


def attack_longids(addrs, deadline):
    st = collections.Counter()
    pad = b"x" * LONG_ID_BYTES
    t0 = time.monotonic()
    for i in range(LONG_IDS):
        if time.monotonic() >= deadline:
            st["not_sent_deadline"] = LONG_IDS - i
            break
        head = b"be_long/%06d/" % i
        st["replies:" + ask(addrs["listen_addr"], head + pad[len(head):] + b"\n")] += 1
    st["send_ms"] = round((time.monotonic() - t0) * 1000)
    time.sleep(max(0.0, deadline - time.monotonic()))
    return dict(st)


def attack_bigvalues(addrs, deadline):
    st, lock = collections.Counter(), threading.Lock()

    def rewrite(n):
        return f"be_big/srv{n % BIG_KEYS}", big_value(BIG_KEYS + n)

    kv_writer(addrs["dev_kv_addr"], deadline, rewrite, st, lock)
    return dict(st)


def attack_main(spec):
    spec = json.loads(spec)
    addrs = {k: tuple(v) for k, v in spec["addrs"].items()}
    deadline = time.monotonic() + spec["seconds"]
    kind = spec["kind"]
    if kind == "none":
        time.sleep(spec["seconds"])
        out = {}
    elif kind == "sweep":
        out = attack_sweep(addrs, deadline)
    elif kind == "pipeline":
        req = {"debug_state": DEBUG_STATE_REQ, "metrics": METRICS_REQ}[spec["req"]]
        out = attack_pipelining(addrs[spec["target"]], deadline, req, spec["conns"])
    elif kind == "nonreading":
        out = attack_nonreading(addrs, deadline)
    elif kind == "hints":
        out = attack_hints(addrs, deadline)
    elif kind == "longids":
        out = attack_longids(addrs, deadline)
    elif kind == "bigvalues":
        out = attack_bigvalues(addrs, deadline)
    else:
        sys.exit("unknown load " + kind)
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------
# measuring side (parent process)
# --------------------------------------------------------------------------

class Agent:
    """One agent process, its stderr read (at 100 KB/s if slow) and its log lines kept."""

    def __init__(self, binary, flags, slow_stderr, addr_keys, nice=0):
        self.addrs = {}
        self.addr_keys = addr_keys
        self.lines = []  # (monotonic, level, msg)
        self.stderr_bytes = 0
        self.lock = threading.Lock()
        args = [binary, "-listen-addr", "127.0.0.1:0", "-monitoring-addr", "127.0.0.1:0",
                "-pprof-addr", "127.0.0.1:0"] + flags
        env = dict(os.environ, GITLAB_LOG_FORMAT="json", GITLAB_LOG_LEVEL="info")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, preexec_fn=niced(nice))
        self.listening = threading.Event()
        chunk, pause = SLOW_STDERR if slow_stderr else (65536, 0.0)
        threading.Thread(target=self.read_stderr, args=(chunk, pause), daemon=True).start()
        if not self.listening.wait(10):
            self.stop()
            raise SystemExit(f"agent did not log its listening line within 10 s ({binary} {' '.join(flags)})")

    def read_stderr(self, chunk, pause):
        fd = self.proc.stderr.fileno()
        pending = b""
        while True:
            d = os.read(fd, chunk)
            if not d:
                return
            self.stderr_bytes += len(d)
            *complete, pending = (pending + d).split(b"\n")
            for raw in complete:
                self.note_line(raw.decode("utf-8", "replace"))
            if pause:
                time.sleep(pause)

    def note_line(self, line):
        level, msg = hh.log_fields(line)
        with self.lock:
            self.lines.append((time.monotonic(), level, msg))
        if not self.listening.is_set() and msg == "listening":
            found = {k: (h, int(p)) for k, h, p in hh.Daemon.ADDR_RE.findall(line)}
            if all(k in found for k in self.addr_keys):
                self.addrs = found
                self.listening.set()

    def count_logs(self, since, start):
        with self.lock:
            return sum(1 for t, _, msg in self.lines if t >= since and msg.startswith(start))

    def warnings_since(self, since):
        with self.lock:
            return collections.Counter(f"{lvl}: {msg}" for t, lvl, msg in self.lines
                                       if t >= since and lvl not in ("info", "debug", "trace"))

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


def read_response(f):
    """Status and body of one HTTP/1.1 response with a Content-Length, from a buffered reader."""
    status = f.readline()
    if not status:
        raise OSError("connection closed")
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = f.read(length)
    return int(status.split()[1]), body


def put_all(addr, items, batch_bytes=4 << 20, batch_count=256):
    """PUTs every (key, value[, flags]), pipelined in batches on one keep-alive connection."""
    with socket.create_connection(addr, timeout=30) as s, s.makefile("rb") as f:
        i = 0
        while i < len(items):
            reqs, size = [], 0
            while i < len(items) and len(reqs) < batch_count and size < batch_bytes:
                key, value, *flags = items[i]
                query = f"?flags={flags[0]}" if flags else ""
                req = (f"PUT /v1/kv/{PREFIX}/{key}{query} HTTP/1.1\r\nHost: x\r\n"
                       f"Content-Length: {len(value)}\r\n\r\n").encode() + value
                reqs.append(req)
                size += len(req)
                i += 1
            s.sendall(b"".join(reqs))
            for _ in reqs:
                status, body = read_response(f)
                if status != 200:
                    raise SystemExit(f"seeding PUT: HTTP {status} {body[:80]!r}")


def scrape(addr, timeout):
    """The agent's /-/metrics as {series: value}, or an error string."""
    try:
        c = http.client.HTTPConnection(*addr, timeout=timeout)
        c.request("GET", "/-/metrics")
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
    except (OSError, http.client.HTTPException) as e:
        return f"scrape failed: {type(e).__name__}"
    if r.status != 200:
        return f"scrape failed: HTTP {r.status}"
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            try:
                out[series] = float(value)
            except ValueError:
                pass
    return out


SERIES_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?$")


def metric(metrics, name, label):
    """Sum of the series of METRIC_PREFIX+name (with `label` in their labels), or None."""
    total, seen = 0.0, False
    for series, value in metrics.items():
        m = SERIES_RE.match(series)
        if m and m.group(1) == METRIC_PREFIX + name and (label is None or label in (m.group(2) or "")):
            total, seen = total + value, True
    return total if seen else None


def settle(agent, want_keys):
    """Waits until the agent answers be/srv1 and its state holds every seeded key."""
    end = time.monotonic() + SEED_TIMEOUT
    last = None
    while time.monotonic() < end:
        m = scrape(agent.addrs["monitoring_addr"], 5)
        if isinstance(m, dict):
            last = (metric(m, "state_keys", None) or 0) + (metric(m, "state_invalid_keys", None) or 0)
            ok, reply, _ = hh.one_check(agent.addrs["listen_addr"], 1.0)
            if last >= want_keys and ok and reply.startswith(hh.CHECK_EXPECT):
                return
        time.sleep(0.1)
    raise SystemExit(f"agent never took in the {want_keys} seeded keys (last seen {last})")


def preemptions(pid):
    """Times the scheduler took the CPU from the agent's loop thread (its main thread) so far, or None."""
    try:
        with open(f"/proc/{pid}/task/{pid}/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def evidence(sc, metrics, agent, t0, load, preempted):
    """What shows the scenario did what it says: {label: value}."""
    ev = {}
    if preempted is not None:
        ev["loop_preempted"] = preempted
    if isinstance(metrics, str):
        ev["metrics"] = metrics
    else:
        for label, name, lab in COMMON_EVIDENCE + tuple(sc.evidence):
            v = metric(metrics, name, lab)
            if v is None:
                continue
            if name.endswith("_seconds"):
                v = round(v * 1000, 1)
            elif name.endswith("_bytes_total"):
                v = round(v / 1048576, 1)
            ev[label] = int(v) if v == int(v) else v
    for label, start in sc.logs:
        ev[label] = agent.count_logs(t0, start)
    if sc.slow_stderr:
        ev["stderr_bytes_read"] = agent.stderr_bytes
    ev["load"] = load
    return ev


def niced(n):
    """A preexec_fn lowering a child's priority by n (None for n = 0)."""
    return (lambda: os.nice(n)) if n else None


def start_pair(binary, sc, nice):
    """The KV holder (-dev, watching a prefix of its own; at `nice`) and the measured agent reading its KV."""
    kv = Agent(binary, ["-dev", "-dev-kv-addr", "127.0.0.1:0", "-kv-prefix", KV_HOLDER_PREFIX], False,
               ("dev_kv_addr",), nice)
    try:
        kv_addr = "%s:%d" % kv.addrs["dev_kv_addr"]
        agent = Agent(binary, ["-consul-addr", kv_addr] + sc.flags, sc.slow_stderr,
                      ("listen_addr", "monitoring_addr", "pprof_addr"))
    except BaseException:
        kv.stop()
        raise
    agent.addrs["dev_kv_addr"] = kv.addrs["dev_kv_addr"]
    return kv, agent


def run_scenario(sc, binary, seconds, sampler, nice):
    kv, agent = start_pair(binary, sc, nice)
    try:
        keys = sc.keys()
        keys, expires = keys if isinstance(keys, tuple) else (keys, None)
        items = BASE_KEYS + keys
        t_seed = time.monotonic()
        put_all(agent.addrs["dev_kv_addr"], items)
        settle(agent, len(items))
        seed_s = time.monotonic() - t_seed
        sampler.pid = agent.proc.pid
        time.sleep(IDLE_SETTLE)
        idle = sampler.last_before(time.monotonic())
        spec = dict(sc.attack, addrs=agent.addrs, seconds=sc.warmup + seconds)
        t0 = time.monotonic()
        pre0 = preemptions(agent.proc.pid)
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_load", json.dumps(spec)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 preexec_fn=niced(nice))
        time.sleep(sc.warmup)
        if expires is not None:  # the checks run across the expiry
            lead = expires - EXPIRY_LEAD - time.time()
            if lead < 0:
                raise SystemExit(f"{sc.name}: seeding took past the expiry ({EXPIRY_MARGIN} s): nothing to measure")
            time.sleep(lead)
        stop, chk = threading.Event(), {}
        checker = threading.Thread(target=hh.checker, args=(agent.addrs["listen_addr"], stop, chk), daemon=True)
        checker.start()
        time.sleep(seconds)
        stop.set()
        load = hh.collect_attack(child, ATTACK_GRACE)
        t_end = time.monotonic()
        pre1 = preemptions(agent.proc.pid)
        preempted = pre1 - pre0 if pre0 is not None and pre1 is not None else None
        checker.join(hh.CHECK_TIMEOUT * 2 + 2)
        during = sampler.between(t0, t_end)
        alive = agent.proc.poll() is None
        metrics = scrape(agent.addrs["monitoring_addr"], METRICS_TIMEOUT) if alive else "agent died"
        lat = sorted(chk.get("lat", []))
        fails = chk.get("fails", collections.Counter())
        rss_idle = idle[1] / 1024 if idle else None
        rss_peak = max((r for _, r, _ in during), default=None)
        rss_peak = rss_peak / 1024 if rss_peak is not None else None
        return {
            "scenario": sc.name,
            "checks": len(lat) + sum(fails.values()),
            "failures": sum(fails.values()),
            "failure_reasons": dict(fails),
            "slowest_failure_ms": max(chk.get("fail_ms", []), default=None),
            "p50_ms": hh.pct(lat, 50), "p99_ms": hh.pct(lat, 99), "max_ms": lat[-1] if lat else None,
            "max_any_ms": max(lat[-1:] + chk.get("fail_ms", []), default=None),
            "rss_idle_mib": rss_idle, "rss_peak_mib": rss_peak,
            "rss_growth_mib": (rss_peak - rss_idle) if (rss_idle is not None and rss_peak is not None) else None,
            "seed_s": round(seed_s, 2),
            "evidence": evidence(sc, metrics, agent, t0, load, preempted),
            "agent_alive": alive,
            "agent_warnings": dict(agent.warnings_since(t0).most_common(5)),
        }
    finally:
        sampler.pid = None
        for who, proc in (("agent", agent), ("KV holder", kv)):
            rc = proc.stop()
            print(f"# {sc.name}: {who} pid {proc.proc.pid} stopped (rc {rc})", file=sys.stderr, flush=True)


def evidence_text(ev):
    parts = [f"{k}={v}" for k, v in ev.items() if k != "load"]
    load = ev.get("load", {})
    if load:
        parts.append("load " + json.dumps(load, separators=(",", ":")))
    return " ".join(parts).replace("|", "/")


def print_table(rows):
    print("| scenario | checks | fail | p50 ms | p99 ms | max ms | RSS idle MiB | RSS peak MiB | growth MiB | evidence |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        worst = hh.fmt(r["max_ms"])
        if r["max_any_ms"] is not None and r["max_any_ms"] != r["max_ms"]:
            worst = "≥" + hh.fmt(r["max_any_ms"], 0)  # a failed check: at least this long
        print(f"| {r['scenario']} | {r['checks']} | {r['failures']} | {hh.fmt(r['p50_ms'])} | {hh.fmt(r['p99_ms'])} "
              f"| {worst} | {hh.fmt(r['rss_idle_mib'], 1)} | {hh.fmt(r['rss_peak_mib'], 1)} "
              f"| {hh.fmt(r['rss_growth_mib'], 1)} | {evidence_text(r['evidence'])} |")
    notes = [r for r in rows if r["failures"] or not r["agent_alive"] or r["agent_warnings"]]
    if notes:
        print()
    for r in notes:
        if r["failures"]:
            reasons = ", ".join(f"{k}×{v}" for k, v in r["failure_reasons"].items())
            print(f"- {r['scenario']}: failed checks: {reasons} (slowest {hh.fmt(r['slowest_failure_ms'], 0)} ms)")
        if not r["agent_alive"]:
            print(f"- {r['scenario']}: the agent had exited before the end")
        for msg, n in r["agent_warnings"].items():
            print(f"- {r['scenario']}: agent logged {n}× {msg[:160]}")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--_load":
        return attack_main(sys.argv[2])
    names = [sc.name for sc in SCENARIOS]
    ap = argparse.ArgumentParser(description="how the agent's own work stalls its answers (issue 26)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured time per scenario (default 8, at most 60)")
    ap.add_argument("--only", default=None, help="comma-separated scenarios: " + ",".join(names))
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--load-nice", type=int, default=10, metavar="N",
                    help="run the load and the KV holder at nice N (default 10; 0 for none)")
    ap.add_argument("bin", metavar="BIN", help="the agent binary (a release build)")
    a = ap.parse_args()
    if not (0 < a.seconds <= 60):
        ap.error("--seconds must be in (0, 60]")
    if not (0 <= a.load_nice <= 19):
        ap.error("--load-nice must be in [0, 19]")
    only = names if a.only is None else [n.strip() for n in a.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in names]
    if unknown or not only:
        ap.error(f"--only: unknown scenario {','.join(unknown) or '(none given)'} (known: {','.join(names)})")
    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        ap.error(f"BIN {a.bin!r} is not an executable file")
    nofile = hh.raise_nofile()
    print(f"# RLIMIT_NOFILE {nofile[0]}/{nofile[1]}; {a.seconds:g} s per scenario; load at nice {a.load_nice}; {a.bin}",
          file=sys.stderr, flush=True)
    sampler = hh.Sampler()
    rows = []
    try:
        for sc in SCENARIOS:
            if sc.name not in only:
                continue
            print(f"# {sc.name} ...", file=sys.stderr, flush=True)
            rows.append(run_scenario(sc, a.bin, a.seconds, sampler, a.load_nice))
    finally:
        sampler.stop.set()
    if a.json:
        print(json.dumps({"binary": a.bin, "seconds": a.seconds, "load_nice": a.load_nice, "scenarios": rows},
                         indent=1))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
