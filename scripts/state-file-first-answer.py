#!/usr/bin/env python3
"""Start to first answer from a state file, consul down.

Usage: scripts/state-file-first-answer.py BIN N

Writes a valid state file of N keys (the format of src/state/file.rs:
JSON line + fnv1a64 checksum line), starts BIN with -state-file pointing
at it and -consul-addr at a closed port, and times spawn -> first
`drain 100%` reply, five times. Loopback only; each agent is stopped by
its PID."""
import base64, json, os, socket, subprocess, sys, time
BIN = sys.argv[1]; N = int(sys.argv[2]); path = f"/tmp/fa-{N}.json"
prefix = "gitlab-haproxy-agent/state"
keys = [{"key": f"{prefix}/be_{i//10}/srv_{i%10}", "value": base64.b64encode(b"drain").decode(), "modify_index": i + 1} for i in range(N)]
doc = json.dumps({"format": "gitlab-haproxy-agent-state", "version": 1, "prefix": prefix, "index": N + 1,
                  "written_unix_ms": int(time.time() * 1000), "keys": keys}, separators=(",", ":")).encode()
h = 0xcbf29ce484222325
for b in doc:
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
open(path, "wb").write(doc + b"\nfnv1a64 %016x\n" % h)
port = 19777
res = []
for rep in range(5):
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "-listen-addr", f"127.0.0.1:{port}", "-monitoring-addr", "", "-pprof-addr", "",
                          "-consul-addr", "127.0.0.1:1", "-state-file", path], stderr=subprocess.DEVNULL)
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(b"be_0/srv_1\n"); r = s.recv(64); s.close()
            if r == b"drain 100%\n":
                break
        except OSError:
            pass
        time.sleep(0.0005)
    res.append((time.monotonic() - t0) * 1000)
    p.terminate(); p.wait()
print(f"{N} keys, file {os.path.getsize(path)} bytes: start-to-first-answer ms", " ".join(f"{x:.1f}" for x in res))
os.remove(path)
