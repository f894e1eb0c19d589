"""py-consul (PyPI, a consul client this project did not write) against a
consul KV API: the calls the dev KV must answer as consul does (SPEC §11).

Usage: python3 kv_calls.py HOST:PORT PREFIX. Exits 0 when every call got
consul's answer; otherwise prints what differed and exits 1. Run by
tests/it/py_consul.rs against `gitlab-haproxy-agent -dev`.
"""

import base64
import sys
import threading
import time

import consul

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def b64(s):
    return base64.b64encode(s.encode()).decode()


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    p = sys.argv[2]
    c = consul.Consul(host=host, port=int(port))
    kv = c.kv

    # get / put: binary, empty, None; a missing key is (index, None).
    check(kv.put(f"{p}/bin", b"\x00\xff\x10") is True, "put binary answers true")
    _, e = kv.get(f"{p}/bin")
    check(e["Value"] == b"\x00\xff\x10", f"binary value read back: {e}")
    kv.put(f"{p}/empty", "")
    _, e = kv.get(f"{p}/empty")
    check(e["Value"] is None, f"an empty value reads as None (Value: null): {e}")
    kv.put(f"{p}/none", None)
    _, e = kv.get(f"{p}/none")
    check(e is not None and e["Value"] is None, f"put None stores an empty value: {e}")
    index, e = kv.get(f"{p}/missing")
    check(e is None and int(index) >= 1, f"missing key: ({index}, {e})")

    # put with cas: 0 creates only; N writes only at ModifyIndex N.
    _, e = kv.get(f"{p}/bin")
    mi = e["ModifyIndex"]
    check(kv.put(f"{p}/bin", "x", cas=mi + 1000) is False, "cas with a stale index is false")
    check(kv.put(f"{p}/bin", "x", cas=mi) is True, "cas with the index is true")
    check(kv.put(f"{p}/new", "y", cas=0) is True, "cas 0 creates")
    check(kv.put(f"{p}/new", "z", cas=0) is False, "cas 0 over a key is false")

    # flags: set, and reset to 0 when a put gives none.
    kv.put(f"{p}/flagged", "f", flags=42)
    _, e = kv.get(f"{p}/flagged")
    check(e["Flags"] == 42, f"flags kept: {e}")
    kv.put(f"{p}/flagged", "g")
    _, e = kv.get(f"{p}/flagged")
    check(e["Flags"] == 0, f"flags reset by a put without them: {e}")

    # A same-value put keeps the ModifyIndex.
    _, before = kv.get(f"{p}/flagged")
    kv.put(f"{p}/flagged", "g")
    _, after = kv.get(f"{p}/flagged")
    check(before["ModifyIndex"] == after["ModifyIndex"], "a same-value put keeps ModifyIndex")

    # recurse listing, sorted by key; keys with a separator.
    kv.put(f"{p}/dir/a", "1")
    kv.put(f"{p}/dir/sub/b", "2")
    _, entries = kv.get(f"{p}/", recurse=True)
    keys = [x["Key"] for x in entries]
    check(keys == sorted(keys) and f"{p}/dir/sub/b" in keys, f"recurse: {keys}")
    _, keys = kv.get(f"{p}/dir/", keys=True, separator="/")
    check(keys == [f"{p}/dir/a", f"{p}/dir/sub/"], f"keys with a separator: {keys}")

    # delete with cas, delete-cas of a missing key, recursive delete.
    _, e = kv.get(f"{p}/new")
    check(kv.delete(f"{p}/new", cas=e["ModifyIndex"] + 1) is False, "delete cas stale is false")
    check(kv.delete(f"{p}/new", cas=e["ModifyIndex"]) is True, "delete cas is true")
    check(kv.get(f"{p}/new")[1] is None, "deleted")
    check(kv.delete(f"{p}/new", cas=12345) is True, "delete cas of a missing key is true")
    check(kv.delete(f"{p}/bin") is True, "delete")
    kv.delete(f"{p}/dir/", recurse=True)
    check(kv.get(f"{p}/dir/", recurse=True)[1] is None, "recursive delete")

    # A blocking get: returns on a write, with a higher index ...
    index, _ = kv.get(f"{p}/watched")
    threading.Timer(0.3, lambda: kv.put(f"{p}/watched", "drain")).start()
    t = time.monotonic()
    index2, e = kv.get(f"{p}/watched", index=index, wait="10s")
    took = time.monotonic() - t
    check(e is not None and e["Value"] == b"drain", f"woken with the value: {e}")
    check(int(index2) > int(index) and took < 5, f"woken at once: {index}->{index2} in {took:.1f}s")
    # ... or at the end of its wait, at the same index.
    t = time.monotonic()
    index3, _ = kv.get(f"{p}/watched", index=index2, wait="1s")
    took = time.monotonic() - t
    check(index3 == index2 and 0.9 <= took < 5, f"timed out: {index2}->{index3} in {took:.1f}s")

    # txn: set and get; a stale cas is 409 (py-consul raises ClientError).
    r = c.txn.put(
        [
            {"KV": {"Verb": "set", "Key": f"{p}/t1", "Value": b64("drain")}},
            {"KV": {"Verb": "get", "Key": f"{p}/t1"}},
        ]
    )
    check(r["Errors"] is None and len(r["Results"]) == 2, f"txn answer: {r}")
    check(r["Results"][1]["KV"]["Value"] == b64("drain"), f"txn get: {r}")
    try:
        c.txn.put([{"KV": {"Verb": "cas", "Key": f"{p}/t1", "Value": b64("x"), "Index": 1}}])
        check(False, "a stale cas in a txn raises")
    except consul.ConsulException as err:
        check("409" in str(err) and "index is stale" in str(err), f"txn 409: {err}")

    # txn verbs get-tree, get-or-empty, delete-tree (consul's txnKVS), and
    # field names in any case (Go's decoder); an unknown field is 400.
    c.txn.put([{"kv": {"verb": "set", "key": f"{p}/tree/a", "value": b64("50%")}}])
    r = c.txn.put(
        [
            {"KV": {"Verb": "get-tree", "Key": f"{p}/tree/"}},
            {"KV": {"Verb": "get-or-empty", "Key": f"{p}/tree/none", "Index": 7}},
        ]
    )
    got = [(x["KV"]["Key"], x["KV"]["Value"], x["KV"]["ModifyIndex"]) for x in r["Results"]]
    check(got[0][:2] == (f"{p}/tree/a", b64("50%")), f"get-tree: {r}")
    check(got[1] == (f"{p}/tree/none", None, 7), f"get-or-empty of a missing key: {r}")
    c.txn.put([{"KV": {"Verb": "delete-tree", "Key": f"{p}/tree/"}}])
    check(kv.get(f"{p}/tree/", recurse=True)[1] is None, "delete-tree")
    try:
        c.txn.put([{"KV": {"Verb": "set", "Key": f"{p}/typo", "Valeu": b64("x")}}])
        check(False, "an unknown field in a txn raises")
    except consul.ConsulException as err:
        check('unknown field \\"Valeu\\"' in str(err) or 'unknown field "Valeu"' in str(err), f"txn 400: {err}")
    check(kv.get(f"{p}/typo")[1] is None, "nothing applied")

    # Another datacenter: 500 "No path to datacenter", nothing written.
    for call in (lambda: kv.get(f"{p}/flagged", dc="dc2"), lambda: kv.put(f"{p}/flagged", "x", dc="dc2")):
        try:
            call()
            check(False, "a call to another datacenter raises")
        except consul.ConsulException as err:
            check("500" in str(err) and "No path to datacenter" in str(err), f"dc2: {err}")
    check(kv.get(f"{p}/flagged")[1]["Value"] == b"g", "nothing written in dc2")

    # What the dev KV does not do: consul's error shapes, no hang.
    try:
        c.session.create()
        check(False, "session create raises")
    except consul.ConsulException as err:
        check("500" in str(err), f"session: {err}")
    try:
        c.acl.policy.list()
        check(False, "acl policy list raises")
    except consul.ACLDisabled as err:
        check("ACL support disabled" in str(err), f"acl: {err}")

    if failures:
        print(f"{len(failures)} call(s) differ", file=sys.stderr)
        sys.exit(1)
    print("py-consul: every call answered as consul does")


main()
