#!/usr/bin/env python3
"""Start to first answer from a state file: consul down, or consul up.

Usage: scripts/state-file-first-answer.py BIN N [up]

Writes a valid state file of N keys, all `drain` (the format of
src/state/file.rs: JSON line + fnv1a64 checksum line), and starts BIN
with -state-file pointing at it, five times.

Without `up`: -consul-addr is a closed port; prints the time from spawn
to the first `drain 100%` reply.

With `up`: consul is BIN's own dev KV, holding the same N keys except
`be_0/srv_1` (deleted since the file was written, so consul says `ready
100%`). Checks of `be_0/srv_1` run back to back from before the spawn
until the first `ready 100%`; prints how many were answered with the
file's `drain 100%` (the start window: each is a server drained for one
agent interval for no reason), and when, in ms after the spawn.

Loopback only; every agent is stopped by its PID."""
import base64, json, os, socket, subprocess, sys, time

BIN = sys.argv[1]; N = int(sys.argv[2]); UP = sys.argv[3:] == ["up"]
path = f"/tmp/fa-{os.getpid()}-{N}.json"
prefix = "gitlab-haproxy-agent/state"
names = [f"be_{i//10}/srv_{i%10}" for i in range(N)]


def write_file():
    keys = [{"key": f"{prefix}/{n}", "value": base64.b64encode(b"drain").decode(), "modify_index": i + 1}
            for i, n in enumerate(names)]
    doc = json.dumps({"format": "gitlab-haproxy-agent-state", "version": 1, "prefix": prefix, "index": N + 1,
                      "written_unix_ms": int(time.time() * 1000), "keys": keys}, separators=(",", ":")).encode()
    h = 0xcbf29ce484222325
    for b in doc:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    open(path, "wb").write(doc + b"\nfnv1a64 %016x\n" % h)


def check(port):
    """One agent check of be_0/srv_1: the reply, b"" without one."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
        s.sendall(b"be_0/srv_1\n"); r = s.recv(64); s.close()
        return r
    except OSError:
        return None


def dev_kv(port):
    """BIN -dev as consul on `port`, holding every key but be_0/srv_1."""
    kv = subprocess.Popen([BIN, "-dev", "-listen-addr", "", "-monitoring-addr", "", "-pprof-addr", "",
                           "-dev-kv-addr", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    for _ in range(500):
        try:
            s = socket.create_connection(("127.0.0.1", port)); break
        except OSError:
            time.sleep(0.01)
    put = [n for n in names if n != "be_0/srv_1"]
    for start in range(0, len(put), 200):
        batch = put[start:start + 200]
        s.sendall(b"".join(b"PUT /v1/kv/%s/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\ndrain"
                           % (prefix.encode(), n.encode()) for n in batch))
        got = b""
        while got.count(b"true") < len(batch):
            got += s.recv(65536)
    s.close()
    return kv


port, kv_port = 19777, 19780
kv = dev_kv(kv_port) if UP else None
consul = f"127.0.0.1:{kv_port}" if UP else "127.0.0.1:1"
res = []
for rep in range(5):
    write_file()
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "-listen-addr", f"127.0.0.1:{port}", "-monitoring-addr", "", "-pprof-addr", "",
                          "-consul-addr", consul, "-state-file", path], stderr=subprocess.DEVNULL)
    drains = []
    while time.monotonic() - t0 < 30:
        r = check(port)
        at = (time.monotonic() - t0) * 1000
        if r == b"drain 100%\n":
            if not UP:
                break
            drains.append(at)
        elif r == b"ready 100%\n" and UP:
            break
        if r is None:
            time.sleep(0.0005)
    res.append((at, drains))
    p.terminate(); p.wait()
if kv:
    kv.terminate(); kv.wait()
size = os.path.getsize(path)
os.remove(path)
if UP:
    print(f"{N} keys, file {size} bytes, consul up: checks answered with the file's value per start:")
    for at, d in res:
        span = f", {d[0]:.1f}-{d[-1]:.1f} ms after the spawn" if d else ""
        print(f"  {len(d)}{span} (consul's ready 100% at {at:.1f} ms)")
else:
    print(f"{N} keys, file {size} bytes: start-to-first-answer ms", " ".join(f"{at:.1f}" for at, _ in res))
