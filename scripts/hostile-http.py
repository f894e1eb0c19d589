#!/usr/bin/env python3
"""Measure how hostile HTTP clients affect gitlab-haproxy-agent (loopback only, stdlib only).

usage: scripts/hostile-http.py [--seconds N] BIN

Starts BIN in -dev mode on ephemeral ports, seeds two keys in its dev KV,
then runs each attack pattern for N seconds (default 8). During every
pattern:
  - a checker thread does sequential agent checks (new connection each,
    ~200/s) and records connect-to-reply latency;
  - a liveness thread does GET /-/liveness on a new connection every
    100 ms with a 1 s overall timeout and counts HTTP 200s;
  - a sampler thread reads VmRSS (and the daemon's fd count) every 50 ms.
The attack itself runs in a child process (this script re-invoked with a
private option) so its CPU use does not hold the measuring threads' GIL;
it stops at its own deadline, closes every socket it opened, and prints
its stats as one JSON line. The parent kills it by PID if it overruns.

Columns: RSS idle = last sample before the attack starts; RSS peak = max
from attack start until the attack process has exited (sockets closed);
RSS after = sample 2 s after that. Latencies are of successful checks;
failures are listed in the detail table.
"""
import argparse
import collections
import http.client
import json
import os
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

PREFIX = "gitlab-haproxy-agent/state"
CHECK_LINE = b"be/srv1\n"
CHECK_EXPECT = b"drain"
CHECK_INTERVAL = 0.005  # ~200/s
CHECK_TIMEOUT = 2.0  # per socket op; a stalled daemon shows up as a failure
LIVE_INTERVAL = 0.1
LIVE_TIMEOUT = 1.0
SAMPLE_INTERVAL = 0.05
AFTER_DELAY = 2.0
IDLE_SETTLE = 1.0

PATTERNS = [
    # (name, kind, target listener)
    ("baseline", "none", None),
    ("pipeline-monitoring", "pipeline", "monitoring"),
    ("pipeline-devkv", "pipeline", "devkv"),
    ("slowloris-monitoring", "slowloris", "monitoring"),
    ("slowloris-pprof", "slowloris", "pprof"),
    ("slowloris-devkv", "slowloris", "devkv"),
    ("bigbody-liveness", "bigbody", "monitoring"),
    ("bigbody-devkv-get", "bigbody", "devkv"),
]

PIPE_REQ = {
    "monitoring": b"GET /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n",
    "devkv": b"GET /v1/kv/" + PREFIX.encode() + b"/be/srv1 HTTP/1.1\r\nHost: x\r\n\r\n",
}
BIG_HEAD = {
    "monitoring": b"POST /-/liveness HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n",
    "devkv": b"GET /v1/kv/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n",
}
BIG_BODY_SENT = 1048575  # one byte short of the declared length: never complete


# --------------------------------------------------------------------------
# attack side (child process)
# --------------------------------------------------------------------------

class StatusCounter:
    """Counts b'HTTP/1.1 ' across chunk boundaries and keeps a few status lines."""

    PAT = b"HTTP/1.1 "

    def __init__(self):
        self.tail = b""
        self.count = 0

    def feed(self, data):
        buf = self.tail + data
        self.count += buf.count(self.PAT)
        self.tail = buf[-(len(self.PAT) - 1):]


def attack_none(addr, seconds):
    time.sleep(seconds)
    return {}


def attack_pipeline(addr, seconds, req, nconn=4, reps=1000):
    deadline = time.monotonic() + seconds
    payload = req * reps
    lock = threading.Lock()
    st = collections.Counter()
    socks = []
    for _ in range(nconn):
        try:
            s = socket.create_connection(addr, timeout=1.0)
            s.settimeout(0.5)
            socks.append(s)
        except OSError as e:
            st["connect_fail:" + type(e).__name__] += 1
    st["connections"] = len(socks)

    def writer(s):
        sent = 0
        try:
            while time.monotonic() < deadline:
                view = memoryview(payload)
                while view and time.monotonic() < deadline:
                    try:
                        n = s.send(view)
                    except socket.timeout:
                        with lock:
                            st["send_timeouts"] += 1
                        continue
                    view = view[n:]
                    sent += n
        except OSError as e:
            with lock:
                st["send_error:" + type(e).__name__] += 1
        with lock:
            st["bytes_sent"] += sent

    def reader(s):
        sc = StatusCounter()
        got = 0
        try:
            while time.monotonic() < deadline:
                try:
                    d = s.recv(262144)
                except socket.timeout:
                    continue
                if not d:
                    with lock:
                        st["closed_by_server"] += 1
                    break
                got += len(d)
                sc.feed(d)
        except OSError as e:
            with lock:
                st["recv_error:" + type(e).__name__] += 1
        with lock:
            st["bytes_recv"] += got
            st["responses"] += sc.count

    threads = []
    for s in socks:
        for fn in (writer, reader):
            t = threading.Thread(target=fn, args=(s,), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic() + 2.0))
    for s in socks:
        s.close()
    st["threads_stuck"] = sum(t.is_alive() for t in threads)
    st["responses_per_s"] = round(st["responses"] / seconds)
    return dict(st)


def _status_line(d):
    return d.split(b"\r\n", 1)[0][:40].decode("latin-1")


def attack_slowloris(addr, seconds, nconn=1100, every=2.0):
    deadline = time.monotonic() + seconds
    st = collections.Counter()
    statuses = collections.Counter()
    sel = selectors.DefaultSelector()
    alive = {}
    t_open = time.monotonic()
    for _ in range(nconn):
        if time.monotonic() >= deadline:
            st["not_opened_deadline"] += 1
            continue
        try:
            s = socket.create_connection(addr, timeout=1.0)
            s.send(b"G")
            s.setblocking(False)
        except OSError as e:
            st["connect_fail:" + type(e).__name__] += 1
            try:
                s.close()
            except Exception:
                pass
            continue
        alive[s.fileno()] = s
        sel.register(s, selectors.EVENT_READ)
    st["opened"] = len(alive)
    st["open_ms"] = round((time.monotonic() - t_open) * 1000)
    drip = b"ET /" + b"a" * 100000
    pos = 0
    next_drip = time.monotonic() + every

    def drop(s, why):
        st[why] += 1
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
        alive.pop(s.fileno(), None)
        s.close()

    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        for key, _ in sel.select(min(0.2, deadline - now)):
            s = key.fileobj
            try:
                d = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError as e:
                drop(s, "server_reset:" + type(e).__name__)
                continue
            if d:
                statuses[_status_line(d)] += 1
                drop(s, "server_answered_then_dropped")
            else:
                drop(s, "closed_by_server")
        if time.monotonic() >= next_drip and time.monotonic() < deadline:
            next_drip += every
            b = drip[pos:pos + 1]
            pos += 1
            for s in list(alive.values()):
                try:
                    s.send(b)
                    st["drip_bytes"] += 1
                except BlockingIOError:
                    st["drip_would_block"] += 1
                except OSError as e:
                    drop(s, "send_error:" + type(e).__name__)
    st["alive_at_end"] = len(alive)
    for s in list(alive.values()):
        s.close()
    sel.close()
    out = dict(st)
    if statuses:
        out["statuses"] = dict(statuses)
    return out


def attack_bigbody(addr, seconds, head, nconn=1000, body=BIG_BODY_SENT, chunk=65536):
    deadline = time.monotonic() + seconds
    st = collections.Counter()
    statuses = collections.Counter()
    sel = selectors.DefaultSelector()
    buf = b"a" * chunk
    conns = {}  # fd -> [sock, pending head memoryview, body remaining]
    t0 = time.monotonic()
    for _ in range(nconn):
        if time.monotonic() >= deadline:
            st["not_opened_deadline"] += 1
            continue
        try:
            s = socket.create_connection(addr, timeout=1.0)
            s.setblocking(False)
        except OSError as e:
            st["connect_fail:" + type(e).__name__] += 1
            continue
        conns[s.fileno()] = [s, memoryview(head), body]
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    st["opened"] = len(conns)
    st["open_ms"] = round((time.monotonic() - t0) * 1000)

    def drop(c, why):
        st[why] += 1
        try:
            sel.unregister(c[0])
        except (KeyError, ValueError):
            pass
        conns.pop(c[0].fileno(), None)
        c[0].close()

    last_done = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        for key, mask in sel.select(min(0.2, deadline - now)):
            c = conns.get(key.fd)
            if c is None:
                continue
            s = c[0]
            if mask & selectors.EVENT_READ:
                try:
                    d = s.recv(4096)
                except BlockingIOError:
                    d = None
                except OSError as e:
                    drop(c, "server_reset:" + type(e).__name__)
                    continue
                if d is not None:
                    if d:
                        statuses[_status_line(d)] += 1
                        drop(c, "server_answered_then_dropped")
                    else:
                        drop(c, "closed_by_server")
                    continue
            if mask & selectors.EVENT_WRITE:
                try:
                    if c[1]:
                        n = s.send(c[1])
                        c[1] = c[1][n:]
                        st["bytes_sent"] += n
                    elif c[2] > 0:
                        n = s.send(buf[:min(chunk, c[2])])
                        c[2] -= n
                        st["bytes_sent"] += n
                except BlockingIOError:
                    continue
                except OSError as e:
                    drop(c, "send_error:" + type(e).__name__)
                    continue
                if not c[1] and c[2] == 0:
                    st["bodies_fully_sent"] += 1
                    last_done = time.monotonic()
                    sel.modify(s, selectors.EVENT_READ)
    if last_done is not None:
        st["all_sent_after_ms"] = round((last_done - t0) * 1000)
    st["alive_at_end"] = len(conns)
    st["MiB_sent"] = round(st.pop("bytes_sent", 0) / 1048576)
    for c in list(conns.values()):
        c[0].close()
    sel.close()
    out = dict(st)
    if statuses:
        out["statuses"] = dict(statuses)
    return out


def attack_main(argv):
    kind, target, host, port, seconds = argv[0], argv[1], argv[2], int(argv[3]), float(argv[4])
    addr = (host, port)
    if kind == "none":
        out = attack_none(addr, seconds)
    elif kind == "pipeline":
        out = attack_pipeline(addr, seconds, PIPE_REQ[target])
    elif kind == "slowloris":
        out = attack_slowloris(addr, seconds)
    elif kind == "bigbody":
        out = attack_bigbody(addr, seconds, BIG_HEAD[target])
    else:
        sys.exit("unknown attack " + kind)
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------
# measuring side (parent process)
# --------------------------------------------------------------------------

def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def log_fields(line):
    """(level, msg) of one of the daemon's JSON log lines; ("?", line) if it is not JSON."""
    try:
        j = json.loads(line)
        return j.get("level", "?"), j.get("msg", line)
    except ValueError:
        return "?", line


class Daemon:
    ADDR_RE = re.compile(r"\b(listen_addr|monitoring_addr|pprof_addr|dev_kv_addr)=([0-9.]+):(\d+)")

    def __init__(self, binary):
        self.binary = binary
        self.proc = None
        self.addrs = {}
        self.lines = []  # (monotonic, level, msg)
        self.lock = threading.Lock()

    def start(self):
        args = [self.binary, "-dev", "-listen-addr", "127.0.0.1:0", "-monitoring-addr", "127.0.0.1:0",
                "-pprof-addr", "127.0.0.1:0", "-dev-kv-addr", "127.0.0.1:0"]
        env = dict(os.environ, GITLAB_LOG_FORMAT="json", GITLAB_LOG_LEVEL="info")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        self.addrs = {}
        got = threading.Event()

        def read_stderr(proc):
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                level, msg = log_fields(line)
                with self.lock:
                    self.lines.append((time.monotonic(), level, msg))
                if not got.is_set() and msg == "listening":
                    found = {k: (h, int(p)) for k, h, p in self.ADDR_RE.findall(line)}
                    if found:
                        self.addrs = found
                        got.set()

        threading.Thread(target=read_stderr, args=(self.proc,), daemon=True).start()
        if not got.wait(10):
            self.stop()
            raise SystemExit("daemon did not log its listening line within 10 s")
        for k in ("listen_addr", "monitoring_addr", "pprof_addr", "dev_kv_addr"):
            if k not in self.addrs:
                self.stop()
                raise SystemExit("listening line lacks " + k)
        self.seed()

    def seed(self):
        h, p = self.addrs["dev_kv_addr"]
        c = http.client.HTTPConnection(h, p, timeout=5)
        for key, val in (("be/srv1", b"drain"), ("be/srv2", b"maint")):
            c.request("PUT", f"/v1/kv/{PREFIX}/{key}", body=val)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise SystemExit(f"seed PUT {key}: {r.status} {body!r}")
        c.close()
        end = time.monotonic() + 10
        last = None
        while time.monotonic() < end:
            last = one_check(self.addrs["listen_addr"], 1.0)
            if last[0] and last[1].startswith(b"drain 100%"):
                return
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"agent never answered drain 100% (last: {last!r})")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(7)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode

    def log_since(self, t):
        with self.lock:
            return [(lvl, msg) for (tt, lvl, msg) in self.lines if tt >= t]


def one_check(addr, timeout):
    """(ok, reply, ms) for one agent check on a new connection."""
    t0 = time.perf_counter()
    s = None
    stage = "connect"
    try:
        s = socket.create_connection(addr, timeout=timeout)
        stage = "send"
        s.sendall(CHECK_LINE)
        stage = "reply"
        buf = b""
        while b"\n" not in buf and len(buf) < 256:
            d = s.recv(256)
            if not d:
                break
            buf += d
        ms = (time.perf_counter() - t0) * 1000
        return (True, buf, ms)
    except socket.timeout:
        return (False, stage + " timeout", (time.perf_counter() - t0) * 1000)
    except OSError as e:
        return (False, stage + " " + type(e).__name__, (time.perf_counter() - t0) * 1000)
    finally:
        if s is not None:
            s.close()


def checker(addr, stop, out):
    lat, fails = [], collections.Counter()
    nxt = time.monotonic()
    while not stop.is_set():
        ok, reply, ms = one_check(addr, CHECK_TIMEOUT)
        if ok and reply.startswith(CHECK_EXPECT):
            lat.append(ms)
        elif ok:
            fails["reply " + repr(reply[:24])] += 1
            out.setdefault("fail_ms", []).append(ms)
        else:
            fails[reply] += 1
            out.setdefault("fail_ms", []).append(ms)
        nxt += CHECK_INTERVAL
        now = time.monotonic()
        if nxt > now:
            time.sleep(nxt - now)
        else:
            nxt = now  # behind: no burst to catch up
    out["lat"], out["fails"] = lat, fails


def liveness(addr, stop, out):
    ok = total = 0
    fails = collections.Counter()
    worst = 0.0
    nxt = time.monotonic()
    req = b"GET /-/liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    while not stop.is_set():
        total += 1
        t0 = time.monotonic()
        end = t0 + LIVE_TIMEOUT
        s = None
        stage = "connect"
        try:
            s = socket.create_connection(addr, timeout=LIVE_TIMEOUT)
            s.settimeout(max(0.001, end - time.monotonic()))
            stage = "send"
            s.sendall(req)
            stage = "reply"
            buf = b""
            while b"\r\n" not in buf:
                s.settimeout(max(0.001, end - time.monotonic()))
                d = s.recv(4096)
                if not d:
                    break
                buf += d
            if buf.startswith(b"HTTP/1.1 200") or buf.startswith(b"HTTP/1.0 200"):
                ok += 1
            elif not buf:
                fails["closed without reply"] += 1
            else:
                fails["status " + repr(buf[:16])] += 1
        except socket.timeout:
            fails[stage + " timeout"] += 1
        except OSError as e:
            fails[stage + " " + type(e).__name__] += 1
        finally:
            if s is not None:
                s.close()
        worst = max(worst, (time.monotonic() - t0) * 1000)
        nxt += LIVE_INTERVAL
        now = time.monotonic()
        if nxt > now:
            time.sleep(nxt - now)
        else:
            nxt = now
    out.update(ok=ok, total=total, fails=fails, worst_ms=worst)


class Sampler:
    """VmRSS (KiB) and open fd count of the daemon every 50 ms."""

    def __init__(self):
        self.pid = None
        self.samples = []  # (monotonic, rss_kib, fds)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            pid = self.pid
            if pid is not None:
                rss = fds = None
                try:
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmRSS:"):
                                rss = int(line.split()[1])
                                break
                    fds = len(os.listdir(f"/proc/{pid}/fd"))
                except (OSError, ValueError):
                    pass
                if rss is not None:
                    with self.lock:
                        self.samples.append((time.monotonic(), rss, fds))
            self.stop.wait(SAMPLE_INTERVAL)

    def between(self, a, b):
        with self.lock:
            return [(t, r, f) for (t, r, f) in self.samples if a <= t <= b]

    def last_before(self, t):
        with self.lock:
            prior = [s for s in self.samples if s[0] <= t]
        return prior[-1] if prior else None


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def pct(sorted_vals, p):
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def fmt(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


def collect_attack(child, grace):
    """The attack process's JSON stats line; it is killed by PID if it runs `grace` s past its deadline."""
    try:
        so, se = child.communicate(timeout=grace)
        try:
            return json.loads(so.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"attack_output": (so + se).decode("utf-8", "replace")[-300:]}
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        return {"attack_killed": f"overran {grace:g} s after its deadline"}


def run_pattern(name, kind, target, daemon, sampler, seconds):
    keymap = {"monitoring": "monitoring_addr", "pprof": "pprof_addr", "devkv": "dev_kv_addr"}
    if target:
        host, port = daemon.addrs[keymap[target]]
    else:
        host, port = daemon.addrs["monitoring_addr"]
    pid = daemon.proc.pid
    time.sleep(IDLE_SETTLE)
    idle = sampler.last_before(time.monotonic())
    cpu0 = cpu_seconds(pid)
    t_log = time.monotonic()

    stop = threading.Event()
    chk, live = {}, {}
    th = [threading.Thread(target=checker, args=(daemon.addrs["listen_addr"], stop, chk), daemon=True),
          threading.Thread(target=liveness, args=(daemon.addrs["monitoring_addr"], stop, live), daemon=True)]
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_attack", kind, target or "-",
                              host, str(port), str(seconds)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for t in th:
        t.start()
    # Measure for exactly the attack window.
    time.sleep(max(0.0, t0 + seconds - time.monotonic()))
    stop.set()
    attack = collect_attack(child, 20)
    t_end = time.monotonic()
    for t in th:
        t.join(CHECK_TIMEOUT * 2 + 2)
    time.sleep(max(0.0, t_end + AFTER_DELAY - time.monotonic()))
    after = sampler.last_before(time.monotonic())
    during = sampler.between(t0, t_end)
    cpu1 = cpu_seconds(pid)
    alive = daemon.alive()

    lat = sorted(chk.get("lat", []))
    fails = chk.get("fails", collections.Counter())
    row = {
        "pattern": name,
        "rss_idle": idle[1] if idle else None,
        "rss_peak": max((r for _, r, _ in during), default=None),
        "rss_after": after[1] if (after and alive) else None,
        "p50": pct(lat, 50), "p99": pct(lat, 99), "max": lat[-1] if lat else None,
        "live_ok": live.get("ok", 0), "live_total": live.get("total", 0),
        "live_fails": dict(live.get("fails", {})), "live_worst": live.get("worst_ms"),
        "checks_ok": len(lat), "checks_total": len(lat) + sum(fails.values()),
        "check_fails": dict(fails), "fail_max_ms": max(chk.get("fail_ms", []), default=None),
        "fds_idle": idle[2] if idle else None,
        "fds_peak": max((f for _, _, f in during if f is not None), default=None),
        "cpu_s": (cpu1 - cpu0) if (cpu0 is not None and cpu1 is not None) else None,
        "attack": attack,
        "alive": alive,
        "rc": None if alive else daemon.proc.returncode,
        "log": collections.Counter(f"{lvl}: {msg}" for lvl, msg in daemon.log_since(t_log)
                                   if lvl not in ("info", "debug", "trace")),
    }
    return row


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--_attack":
        return attack_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description="hostile HTTP clients vs gitlab-haproxy-agent")
    ap.add_argument("--seconds", type=float, default=8.0, help="attack time per pattern (default 8)")
    ap.add_argument("bin", metavar="BIN")
    a = ap.parse_args()
    if not (0 < a.seconds <= 60):
        ap.error("--seconds must be in (0, 60]")
    nofile = raise_nofile()
    print(f"# RLIMIT_NOFILE {nofile[0]}/{nofile[1]}; {a.seconds:g} s per pattern", file=sys.stderr)

    daemon = Daemon(a.bin)
    sampler = Sampler()
    rows = []
    try:
        daemon.start()
        sampler.pid = daemon.proc.pid
        print(f"# daemon pid {daemon.proc.pid}: " +
              " ".join(f"{k}={h}:{p}" for k, (h, p) in sorted(daemon.addrs.items())), file=sys.stderr)
        for name, kind, target in PATTERNS:
            if not daemon.alive():
                print(f"# daemon had died (rc {daemon.proc.returncode}); restarting", file=sys.stderr)
                daemon.start()
                sampler.pid = daemon.proc.pid
            print(f"# {name} ...", file=sys.stderr, flush=True)
            row = run_pattern(name, kind, target, daemon, sampler, a.seconds)
            rows.append(row)
            print(f"#   checks {row['checks_ok']}/{row['checks_total']} p99 {fmt(row['p99'])} ms, "
                  f"liveness {row['live_ok']}/{row['live_total']}, peak RSS {row['rss_peak']} KiB, "
                  f"alive {row['alive']}", file=sys.stderr, flush=True)
    finally:
        sampler.stop.set()
        rc = daemon.stop()
        print(f"# daemon stopped (rc {rc})", file=sys.stderr)

    print("| pattern | RSS idle KiB | RSS peak KiB | RSS after KiB | agent-check p50 ms | p99 ms | max ms "
          "| liveness ok/total |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        after = r["rss_after"] if r["alive"] else f"DIED rc={r['rc']}"
        print(f"| {r['pattern']} | {r['rss_idle']} | {r['rss_peak']} | {after} | {fmt(r['p50'])} | "
              f"{fmt(r['p99'])} | {fmt(r['max'])} | {r['live_ok']}/{r['live_total']} |")
    print()
    print("| pattern | checks ok/total | check failures | liveness failures | liveness worst ms "
          "| daemon fds idle/peak | daemon CPU s | attack |")
    print("|---|---:|---|---|---:|---:|---:|---|")
    for r in rows:
        cf = ", ".join(f"{k}×{v}" for k, v in r["check_fails"].items()) or "-"
        if r["fail_max_ms"] is not None:
            cf += f" (slowest failure {r['fail_max_ms']:.0f} ms)"
        lf = ", ".join(f"{k}×{v}" for k, v in r["live_fails"].items()) or "-"
        att = json.dumps(r["attack"], separators=(",", ":")).replace("|", "/")
        print(f"| {r['pattern']} | {r['checks_ok']}/{r['checks_total']} | {cf} | {lf} | "
              f"{fmt(r['live_worst'], 0)} | {r['fds_idle']}/{r['fds_peak']} | {fmt(r['cpu_s'])} | {att} |")
    logs = [(r["pattern"], r["log"]) for r in rows if r["log"]]
    if logs:
        print()
        print("Daemon warn/error log lines during each pattern:")
        for name, c in logs:
            for msg, n in c.most_common(5):
                print(f"- {name}: {n}× {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
