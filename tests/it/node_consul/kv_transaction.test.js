"use strict";
// node-consul (npm `consul`, pinned in package-lock.json: a consul client
// this project did not write) against a consul KV API. Its own acceptance
// tests (test/acceptance/kv.js, transaction.js in its repository) start a
// three-node consul cluster and are not in the npm package; these are
// written here after them (the same cases: get, raw, missing, recurse,
// blocking, keys, separator, set, null value, del, a two-key transaction)
// plus every KV txn verb and the answers tests/it/node_consul.rs names.
//
// Usage: NODE_CONSUL_ADDR=host:port NODE_CONSUL_PREFIX=p node --test
// --test-reporter=tap kv_transaction.test.js
const { EventEmitter } = require("node:events");
const assert = require("node:assert/strict");
const { describe, it, beforeEach } = require("node:test");
const Consul = require("consul");

const [host, port] = process.env.NODE_CONSUL_ADDR.split(":");
const p = process.env.NODE_CONSUL_PREFIX;
const consul = new Consul({ host, port: Number(port) });
const b64 = (s) => Buffer.from(s).toString("base64");
const kvOp = (Verb, Key, extra) => ({ KV: { Verb, Key, ...extra } });

/** The call's [response, body], for its headers. */
function full() {
  const ctx = new EventEmitter();
  ctx.includeResponse = true;
  return { ctx };
}

/** The error a call throws (node-consul throws on any non-2xx). */
async function refused(call) {
  try {
    await call;
  } catch (err) {
    return err;
  }
  assert.fail("the call succeeded");
}

const entryKeys = ["CreateIndex", "Flags", "Key", "LockIndex", "ModifyIndex", "Value"];

beforeEach(async () => {
  await consul.kv.del({ key: `${p}/`, recurse: true });
  assert.equal(await consul.kv.set(`${p}/hello`, "world"), true);
});

describe("kv", () => {
  it("get returns one pair", async () => {
    const data = await consul.kv.get(`${p}/hello`);
    assert.deepEqual(Object.keys(data).sort(), entryKeys);
    assert.equal(data.Key, `${p}/hello`);
    assert.equal(data.Flags, 0);
    assert.equal(data.Value, "world");
  });

  it("get returns the raw value", async () => {
    const data = await consul.kv.get({ key: `${p}/hello`, raw: true });
    assert.deepEqual(data, Buffer.from("world"));
  });

  it("get of a missing key is undefined", async () => {
    assert.equal(await consul.kv.get(`${p}/none`), undefined);
  });

  it("get with recurse returns the list", async () => {
    const data = await consul.kv.get({ key: `${p}/`, recurse: true });
    assert.equal(data.length, 1);
    assert.deepEqual(Object.keys(data[0]).sort(), entryKeys);
    assert.equal(data[0].Value, "world");
  });

  it("a blocking get waits for the update", async () => {
    const before = await consul.kv.get(`${p}/hello`);
    const waited = consul.kv.get({ key: `${p}/hello`, index: before.ModifyIndex, wait: "3s" });
    await new Promise((r) => setTimeout(r, 100));
    await consul.kv.set(`${p}/hello`, "new-value");
    const after = await waited;
    assert.equal(after.Value, "new-value");
    assert.ok(after.ModifyIndex > before.ModifyIndex);
  });

  it("keys, with a separator, and all of them", async () => {
    for (const k of ["a/x/1", "a/y/2", "a/z/3"]) await consul.kv.set(`${p}/${k}`, "value");
    assert.deepEqual(await consul.kv.keys(`${p}/a`), ["a/x/1", "a/y/2", "a/z/3"].map((k) => `${p}/${k}`));
    assert.deepEqual(await consul.kv.keys({ key: `${p}/a/`, separator: "/" }), ["a/x/", "a/y/", "a/z/"].map((k) => `${p}/${k}`));
    assert.equal((await consul.kv.keys(`${p}/`)).length, 4);
  });

  it("set creates, with a null value too", async () => {
    assert.equal(await consul.kv.set(`${p}/one`, "two"), true);
    assert.equal((await consul.kv.get(`${p}/one`)).Value, "two");
    assert.equal(await consul.kv.set(`${p}/none`, null), true);
    assert.equal((await consul.kv.get(`${p}/none`)).Value, null);
  });

  it("set and del with cas and flags", async () => {
    const e = await consul.kv.get(`${p}/hello`);
    // A refused cas answers `false`, which node-consul hands back as undefined.
    assert.notEqual(await consul.kv.set({ key: `${p}/hello`, value: "x", cas: e.ModifyIndex + 1 }), true);
    assert.equal((await consul.kv.get(`${p}/hello`)).Value, "world");
    assert.equal(await consul.kv.set({ key: `${p}/hello`, value: "x", cas: e.ModifyIndex, flags: 42 }), true);
    const now = await consul.kv.get(`${p}/hello`);
    assert.deepEqual([now.Value, now.Flags], ["x", 42]);
    assert.notEqual(await consul.kv.del({ key: `${p}/hello`, cas: e.ModifyIndex }), true);
    assert.equal((await consul.kv.get(`${p}/hello`)).Value, "x");
    assert.equal(await consul.kv.del({ key: `${p}/hello`, cas: now.ModifyIndex }), true);
    assert.equal(await consul.kv.get(`${p}/hello`), undefined);
  });

  it("del deletes, recursively too", async () => {
    await consul.kv.set(`${p}/d/1`, "1");
    await consul.kv.del(`${p}/hello`);
    assert.equal(await consul.kv.get(`${p}/hello`), undefined);
    await consul.kv.del({ key: `${p}/d/`, recurse: true });
    assert.equal(await consul.kv.get({ key: `${p}/`, recurse: true }), undefined);
  });

  it("another datacenter is 500 No path to datacenter, nothing written", async () => {
    for (const call of [
      () => consul.kv.get({ key: `${p}/hello`, dc: "dc2" }),
      () => consul.kv.set({ key: `${p}/hello`, value: "x", dc: "dc2" }),
      () => consul.kv.del({ key: `${p}/hello`, dc: "dc2" }),
    ]) {
      const err = await refused(call());
      assert.equal(err.statusCode, 500);
      assert.match(err.message, /No path to datacenter$/);
    }
    assert.equal((await consul.kv.get(`${p}/hello`)).Value, "world");
  });
});

describe("transaction", () => {
  it("creates two kv pairs", async () => {
    const response = await consul.transaction.create([
      kvOp("set", `${p}/key1`, { Value: b64("value1") }),
      kvOp("set", `${p}/key2`, { Value: b64("value2") }),
    ]);
    assert.equal(response.Results.length, 2);
    for (const r of response.Results) {
      assert.deepEqual(Object.keys(r.KV).sort(), entryKeys);
      assert.equal(r.KV.Value, null, "a write answers without the value");
    }
    assert.equal((await consul.kv.get(`${p}/key1`)).Value, "value1");
    assert.equal((await consul.kv.get(`${p}/key2`)).Value, "value2");
  });

  it("runs every KV verb as consul's txnKVS does", async () => {
    await consul.kv.set(`${p}/t/a`, "drain");
    await consul.kv.set(`${p}/t/b`, "maint");
    const a = await consul.kv.get(`${p}/t/a`);
    const b = await consul.kv.get(`${p}/t/b`);
    const res = await consul.transaction.create([
      kvOp("get", `${p}/t/a`),
      kvOp("get-tree", `${p}/t/`),
      kvOp("get-or-empty", `${p}/t/none`, { Flags: 7, Index: 42 }),
      kvOp("get-or-empty", `${p}/t/b`),
      kvOp("check-index", `${p}/t/b`, { Index: b.ModifyIndex }),
      kvOp("check-not-exists", `${p}/t/none`),
      kvOp("cas", `${p}/t/a`, { Value: b64("50%"), Index: a.ModifyIndex }),
      kvOp("delete-cas", `${p}/t/b`, { Index: b.ModifyIndex }),
      kvOp("set", `${p}/u/1`, { Value: b64("x") }),
      kvOp("delete-tree", `${p}/u/`),
      kvOp("delete", `${p}/hello`),
    ]);
    const got = res.Results.map((r) => [r.KV.Key, r.KV.Value && Buffer.from(r.KV.Value, "base64").toString()]);
    assert.deepEqual(got, [
      [`${p}/t/a`, "drain"],
      [`${p}/t/a`, "drain"],
      [`${p}/t/b`, "maint"],
      [`${p}/t/none`, null],
      [`${p}/t/b`, "maint"],
      [`${p}/t/b`, null],
      [`${p}/t/a`, null],
      [`${p}/u/1`, null],
    ]);
    assert.deepEqual([res.Results[3].KV.Flags, res.Results[3].KV.ModifyIndex, res.Results[3].KV.CreateIndex], [7, 42, 0]);
    assert.equal((await consul.kv.get(`${p}/t/a`)).Value, "50%");
    for (const gone of ["t/b", "u/1", "hello"]) assert.equal(await consul.kv.get(`${p}/${gone}`), undefined, gone);
  });

  it("a failed operation is 409 with every error, nothing applied", async () => {
    const err = await refused(
      consul.transaction.create(
        [kvOp("set", `${p}/x`, { Value: b64("x") }), kvOp("get", `${p}/none`), kvOp("check-not-exists", `${p}/hello`)],
        full(),
      ),
    );
    assert.equal(err.statusCode, 409);
    assert.deepEqual(err.response.body.Errors, [
      { OpIndex: 1, What: `key "${p}/none" doesn't exist` },
      { OpIndex: 2, What: `key "${p}/hello" exists` },
    ]);
    assert.equal(await consul.kv.get(`${p}/x`), undefined);
  });

  it("field names match in any case; an unknown one is 400", async () => {
    const res = await consul.transaction.create([{ kv: { verb: "set", key: `${p}/lower`, value: b64("ok") } }]);
    assert.equal(res.Results[0].KV.Key, `${p}/lower`);
    assert.equal((await consul.kv.get(`${p}/lower`)).Value, "ok");
    const err = await refused(consul.transaction.create([kvOp("set", `${p}/typo`, { Valeu: b64("x") })], full()));
    assert.equal(err.statusCode, 400);
    assert.equal(err.response.body, 'Failed to parse body: json: unknown field "Valeu"');
    assert.equal(await consul.kv.get(`${p}/typo`), undefined);
  });

  it("another datacenter is 500 No path to datacenter, nothing applied", async () => {
    for (const ops of [[kvOp("set", `${p}/dc`, { Value: b64("x") })], [kvOp("get", `${p}/hello`)]]) {
      const err = await refused(consul.transaction.create(ops, { dc: "dc2" }));
      assert.deepEqual([err.statusCode, err.message], [500, "No path to datacenter"]);
    }
    assert.equal(await consul.kv.get(`${p}/dc`), undefined);
  });

  it("a read-only transaction answers with the leader headers, a write without", async () => {
    const [res, body] = await consul.transaction.create([kvOp("get", `${p}/hello`)], full());
    assert.equal(res.headers["x-consul-knownleader"], "true");
    assert.equal(res.headers["x-consul-lastcontact"], "0");
    assert.equal(body.KnownLeader, true);
    const [wres] = await consul.transaction.create([kvOp("set", `${p}/w`, { Value: b64("x") })], full());
    assert.equal(wres.headers["x-consul-knownleader"], undefined);
  });
});
