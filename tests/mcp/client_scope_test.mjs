// What an `airlock mcp` session may reach, driven by the official MCP
// TypeScript SDK against a real airlockd (started by test_mcp.py) and real
// VMs of the minimal image:
//
// * over the unix socket (the operator's door, every tenant's sandboxes),
//   the tools act only on the sandboxes the session created: another id is
//   an isError result that reads "not_found", and sandbox_list hides it;
// * `airlock mcp --all` acts on every sandbox;
// * with AIRLOCK_URL and AIRLOCK_TOKEN the session is that token's tenant on
//   the daemon's TCP listener: what it creates is the tenant's, the
//   operator's sandbox does not exist for it even with --all, and its
//   sandboxes go when it ends.
//
// Env: AIRLOCK_BIN, AIRLOCK_SOCKET, AIRLOCK_URL_FOR_TEST (http://127.0.0.1:PORT),
// AIRLOCK_TOKEN_FOR_TEST (a token of tenant "acme"). Exits non-zero on the first failed check.
import assert from "node:assert/strict";
import path from "node:path";

import { api } from "./daemon_api.mjs";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const AIRLOCK = path.join(process.env.AIRLOCK_BIN, "airlock");
const SOCKET = process.env.AIRLOCK_SOCKET;

async function connect(args, env) {
  const client = new Client({ name: "airlock-scope-test", version: "1.0.0" });
  const transport = new StdioClientTransport({ command: AIRLOCK, args: ["mcp", ...args], env, stderr: "inherit" });
  await client.connect(transport);
  return client;
}

async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.ok(!r.isError, `${name} failed: ${JSON.stringify(r.content)}`);
  return r.structuredContent;
}

async function refused(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.equal(r.isError, true, `${name} on ${args.sandbox_id} must fail: ${JSON.stringify(r.content)}`);
  assert.match(r.content[0].text, /not_found/, name);
}

const state = async (id) => (await api("GET", `/v1/sandboxes/${id}`)).body.state;

const foreign = (await api("POST", "/v1/sandboxes", SOCKET, { image: "minimal", timeout: 600 })).body;
assert.ok(foreign.id, JSON.stringify(foreign));
try {
  const socketEnv = { ...process.env, AIRLOCK_SOCKET: SOCKET };
  delete socketEnv.AIRLOCK_URL;
  delete socketEnv.AIRLOCK_TOKEN;

  // The unix socket, default scope: only what the session created.
  let client = await connect([], socketEnv);
  const own = await call(client, "sandbox_create", { image: "minimal" });
  assert.equal((await call(client, "sandbox_exec", { sandbox_id: own.id, argv: ["echo", "mine"] })).stdout, "mine\n");
  const sid = foreign.id;
  await refused(client, "sandbox_exec", { sandbox_id: sid, argv: ["echo", "theirs"] });
  await refused(client, "sandbox_read_file", { sandbox_id: sid, path: "/etc/hostname" });
  await refused(client, "sandbox_write_file", { sandbox_id: sid, path: "/tmp/x", content: "x" });
  await refused(client, "sandbox_list_files", { sandbox_id: sid, path: "/" });
  await refused(client, "sandbox_logs", { sandbox_id: sid });
  await refused(client, "sandbox_set_network", { sandbox_id: sid, mode: "none" });
  await refused(client, "sandbox_destroy", { sandbox_id: sid });
  assert.deepEqual((await call(client, "sandbox_list", {})).sandboxes.map((s) => s.id), [own.id]);
  assert.equal(await state(sid), "running", "the other sandbox is untouched");
  await client.close();
  assert.equal(await state(own.id), "deleted");
  console.log("ok: the unix socket session acts only on its own sandboxes");

  // --all: every sandbox.
  client = await connect(["--all"], socketEnv);
  assert.equal((await call(client, "sandbox_exec", { sandbox_id: sid, argv: ["echo", "any"] })).stdout, "any\n");
  assert.ok((await call(client, "sandbox_list", {})).sandboxes.some((s) => s.id === sid));
  await client.close();
  assert.equal(await state(sid), "running", "--all does not make the session own it");
  console.log("ok: --all acts on every sandbox");

  // AIRLOCK_URL + AIRLOCK_TOKEN: a tenant on the TCP listener.
  const tcpEnv = { ...process.env, AIRLOCK_URL: process.env.AIRLOCK_URL_FOR_TEST,
                   AIRLOCK_TOKEN: process.env.AIRLOCK_TOKEN_FOR_TEST };
  delete tcpEnv.AIRLOCK_SOCKET;
  client = await connect(["--all"], tcpEnv);
  const t = await call(client, "sandbox_create", { image: "minimal" });
  assert.equal((await api("GET", `/v1/sandboxes/${t.id}`)).body.tenant, "acme");
  assert.equal((await call(client, "sandbox_exec", { sandbox_id: t.id, argv: ["echo", "tenant"] })).stdout, "tenant\n");
  // The operator's sandbox does not exist for the tenant, --all or not.
  await refused(client, "sandbox_exec", { sandbox_id: sid, argv: ["true"] });
  assert.deepEqual((await call(client, "sandbox_list", {})).sandboxes.map((s) => s.id), [t.id]);
  await client.close();
  assert.equal(await state(t.id), "deleted", "the tenant session's sandbox goes with it");
  console.log("ok: AIRLOCK_URL/AIRLOCK_TOKEN: the session is that tenant");
} finally {
  await api("DELETE", `/v1/sandboxes/${foreign.id}`);
}
console.log("ok: all scope checks passed");
