// `airlock mcp` under protocol revision 2026-07-28 (stateless: no initialize,
// each request names its revision in _meta), driven by the official MCP
// TypeScript SDK v2 (@modelcontextprotocol/client) over stdio, against a real
// airlockd (started by test_mcp.py) and a real VM of the minimal image.
// Exits non-zero on the first failed check.
//
// Env: AIRLOCK_BIN (dir of `airlock`), AIRLOCK_SOCKET. Prints "CREATED <id>" for
// the sandbox it creates (and its session destroys).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import readline from "node:readline";

import { api } from "./daemon_api.mjs";

import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const SOCKET = process.env.AIRLOCK_SOCKET;
const AIRLOCK = path.join(process.env.AIRLOCK_BIN, "airlock");
const MODERN = "2026-07-28";


async function connect(versionNegotiation) {
  const client = new Client({ name: "airlock-test-2026", version: "1.0.0" }, { versionNegotiation });
  const transport = new StdioClientTransport({
    command: AIRLOCK, args: ["mcp"], env: { ...process.env, AIRLOCK_SOCKET: SOCKET }, stderr: "inherit",
  });
  await client.connect(transport);
  return client;
}

async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.equal(r.isError, false, `${name}: ${JSON.stringify(r.content)}`);
  return r.structuredContent;
}

// Newline-delimited JSON-RPC on a fresh `airlock mcp`, for what the SDK would
// never send: a revision the server does not speak, a missing envelope key.
async function rawSession(messages) {
  const child = spawn(AIRLOCK, ["mcp"], {
    env: { ...process.env, AIRLOCK_SOCKET: SOCKET }, stdio: ["pipe", "pipe", "inherit"],
  });
  const replies = [];
  const lines = readline.createInterface({ input: child.stdout });
  const done = new Promise((resolve) => lines.on("line", (l) => {
    replies.push(JSON.parse(l));
    if (replies.length === messages.length) resolve();
  }));
  for (const m of messages) child.stdin.write(JSON.stringify(m) + "\n");
  await done;
  child.stdin.end();
  assert.equal(await new Promise((resolve) => child.on("close", resolve)), 0);
  return replies;
}

// Pinned to 2026-07-28: the SDK sends server/discover, then every request
// with the _meta envelope, and fails loudly if the server is not modern.
const pinned = await connect({ mode: { pin: MODERN } });
assert.equal(pinned.getNegotiatedProtocolVersion(), MODERN);
const discovered = pinned.getDiscoverResult();
assert.ok(discovered.supportedVersions.includes(MODERN), JSON.stringify(discovered));
assert.ok(discovered.capabilities.tools, "tools capability");
assert.match(pinned.getInstructions() ?? "", /sandbox_create/);
const again = await pinned.discover();
assert.deepEqual(again.supportedVersions, [MODERN]);
console.log("ok: server/discover (pinned 2026-07-28)");

const { tools } = await pinned.listTools();
assert.equal(tools.length, 9);
assert.ok(tools.every((t) => t.outputSchema), "2026-07-28 tools carry outputSchema");
console.log("ok: tools/list");

const created = await call(pinned, "sandbox_create", { image: "minimal" });
const id = created.id;
console.log(`CREATED ${id}`);
assert.equal((await api("GET", `/v1/sandboxes/${id}`)).body.state, "running");
const r = await call(pinned, "sandbox_exec", { sandbox_id: id, command: "echo stateless; uname -s" });
assert.equal(r.exit_code, 0);
assert.equal(r.stdout, "stateless\nLinux\n");
console.log("ok: sandbox_create + sandbox_exec in a real VM");

// No session state on the server, but the process still owns what it made:
// closing the client (EOF) destroys the sandbox.
await pinned.close();
for (let i = 0; i < 100; i++) {
  const s = await api("GET", `/v1/sandboxes/${id}`);
  if (s.status === 404 || s.body.state === "deleted") break;
  await new Promise((res) => setTimeout(res, 100));
}
const after = await api("GET", `/v1/sandboxes/${id}`);
assert.ok(after.status === 404 || after.body.state === "deleted", JSON.stringify(after));
console.log("ok: the sandbox is destroyed when the client goes away");

// Auto negotiation: the discover probe must count as modern evidence (a
// legacy-looking reply would make the SDK fall back to initialize).
const auto = await connect({ mode: "auto" });
assert.equal(auto.getNegotiatedProtocolVersion(), MODERN);
assert.equal((await auto.listTools()).tools.length, 9);
await auto.close();
console.log("ok: auto negotiation picks 2026-07-28");

// The errors the SDK's own client never provokes.
const meta = (v) => ({
  "io.modelcontextprotocol/protocolVersion": v, "io.modelcontextprotocol/clientCapabilities": {},
});
const [bad, noCaps, ping] = await rawSession([
  { jsonrpc: "2.0", id: 1, method: "tools/list", params: { _meta: meta("2031-01-01") } },
  { jsonrpc: "2.0", id: 2, method: "tools/list",
    params: { _meta: { "io.modelcontextprotocol/protocolVersion": MODERN } } },
  { jsonrpc: "2.0", id: 3, method: "ping", params: { _meta: meta(MODERN) } },
]);
assert.equal(bad.error.code, -32022);
assert.equal(bad.error.data.requested, "2031-01-01");
assert.ok(bad.error.data.supported.includes(MODERN) && bad.error.data.supported.includes("2025-06-18"));
assert.equal(noCaps.error.code, -32602);
assert.match(noCaps.error.message, /clientCapabilities/);
assert.equal(ping.error.code, -32601, "2026-07-28 removed ping");
console.log("ok: unsupported revision -32022, missing capabilities -32602, no ping");
