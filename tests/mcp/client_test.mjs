// `airlock mcp` driven by the official MCP TypeScript SDK over stdio, against
// a real airlockd (started by test_mcp.py) and real VMs of the minimal image.
// Every tool is called; its structuredContent is validated by the SDK against
// the tool's outputSchema. Exits non-zero on the first failed check.
//
// Env: AIRLOCK_BIN (dir of `airlock`), AIRLOCK_SOCKET, AIRLOCK_DATA_DIR,
// AIRLOCK_IMAGE_DIR. Prints "KEPT <id>" for the keep: true sandbox it leaves.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import readline from "node:readline";

import { api } from "./daemon_api.mjs";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { EmptyResultSchema, McpError } from "@modelcontextprotocol/sdk/types.js";

const BIN = process.env.AIRLOCK_BIN;
const SOCKET = process.env.AIRLOCK_SOCKET;
const AIRLOCK = path.join(BIN, "airlock");
const TAG = `mcp-${process.pid}`;

async function running(id) {
  const r = await api("GET", `/v1/sandboxes/${id}`);
  return r.status === 200 && r.body.state === "running";
}

function serverEnv() {
  return { ...process.env, AIRLOCK_SOCKET: SOCKET };
}

async function connect() {
  const client = new Client({ name: "airlock-test", version: "1.0.0" });
  const transport = new StdioClientTransport({
    command: AIRLOCK, args: ["mcp"], env: serverEnv(), stderr: "inherit",
  });
  await client.connect(transport);
  return { client, transport };
}

// One raw session, for what the SDK does not let us choose (the version it
// asks for): newline-delimited JSON-RPC on the child's stdin/stdout.
async function rawSession(messages) {
  const child = spawn(AIRLOCK, ["mcp"], { env: serverEnv(), stdio: ["pipe", "pipe", "inherit"] });
  const replies = [];
  const lines = readline.createInterface({ input: child.stdout });
  const want = messages.filter((m) => m.id !== undefined).length;
  const done = new Promise((resolve) => {
    lines.on("line", (l) => {
      replies.push(JSON.parse(l));
      if (replies.length === want) resolve();
    });
  });
  for (const m of messages) child.stdin.write(JSON.stringify(m) + "\n");
  await done;
  child.stdin.end();
  const code = await new Promise((resolve) => child.on("close", resolve));
  assert.equal(code, 0, "airlock mcp exits 0 at EOF");
  return replies;
}

const init = (id, version) => ({
  jsonrpc: "2.0", id, method: "initialize",
  params: { protocolVersion: version, capabilities: {}, clientInfo: { name: "raw", version: "1" } },
});

async function checkNegotiation() {
  for (const [asked, answered] of [["2025-11-25", "2025-11-25"], ["2025-06-18", "2025-06-18"],
                                   ["2025-03-26", "2025-03-26"], ["2024-11-05", "2025-11-25"]]) {
    const [r] = await rawSession([init(1, asked)]);
    assert.equal(r.result.protocolVersion, answered, `asked ${asked}`);
    assert.ok(r.result.capabilities.tools, "tools capability");
  }
  const r = await rawSession([
    init(1, "2025-06-18"),
    { jsonrpc: "2.0", method: "notifications/initialized" },
    { jsonrpc: "2.0", id: 2, method: "tools/call", params: { arguments: {} } },
    { jsonrpc: "2.0", id: 3, method: "no/such/method" },
  ]);
  const legacy = await rawSession([init(1, "2025-03-26"), { jsonrpc: "2.0", id: 2, method: "tools/list" }]);
  const legacyTools = legacy.find((x) => x.id === 2).result.tools;
  assert.equal(legacyTools.length, 9);
  assert.ok(legacyTools.every((t) => t.inputSchema && !t.outputSchema), "2025-03-26 has no outputSchema");
  const byId = Object.fromEntries(r.map((x) => [x.id, x]));
  assert.equal(byId[2].error.code, -32602);
  assert.equal(byId[3].error.code, -32601);
  console.log("ok: version negotiation and protocol errors");
}

async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.ok(!r.isError, `${name} failed: ${JSON.stringify(r.content)}`);
  assert.equal(r.content[0].type, "text");
  return r.structuredContent;
}

async function checkTools() {
  const { client } = await connect();
  assert.equal(client.getServerVersion().name, "airlock");
  assert.ok(client.getServerCapabilities().tools);
  await client.ping();

  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, ["sandbox_create", "sandbox_destroy", "sandbox_exec", "sandbox_list",
    "sandbox_list_files", "sandbox_logs", "sandbox_read_file", "sandbox_set_network",
    "sandbox_write_file"]);
  for (const t of tools) assert.equal(t.inputSchema.type, "object", t.name);

  const sb = await call(client, "sandbox_create", {
    image: "minimal", metadata: { mcp_test: TAG },
    network: { mode: "allowlist", allow: ["203.0.113.0/24"] },
  });
  assert.match(sb.id, /^[A-Za-z0-9_-]+$/);
  assert.equal(sb.keep, false);
  assert.ok(await running(sb.id));
  const id = sb.id;

  let r = await call(client, "sandbox_exec", { sandbox_id: id, argv: ["echo", "hello", "mcp"] });
  assert.equal(r.exit_code, 0);
  assert.equal(r.stdout, "hello mcp\n");
  assert.equal(r.reason, "exited");
  r = await call(client, "sandbox_exec", {
    sandbox_id: id, command: "cd /tmp && pwd && echo $WHO >&2; exit 3", env: { WHO: "agent" },
  });
  assert.equal(r.exit_code, 3);
  assert.equal(r.stdout, "/tmp\n");
  assert.equal(r.stderr, "agent\n");
  r = await call(client, "sandbox_exec", { sandbox_id: id, argv: ["pwd"], cwd: "/etc" });
  assert.equal(r.stdout, "/etc\n");
  r = await call(client, "sandbox_exec", { sandbox_id: id, argv: ["sleep", "30"], timeout: 1 });
  assert.equal(r.timed_out, true);
  assert.equal(r.reason, "timeout");
  r = await call(client, "sandbox_exec", {
    sandbox_id: id, command: "head -c 5000 /dev/zero | tr '\\0' a", max_output_bytes: 100,
  });
  assert.equal(r.stdout, "a".repeat(100));
  assert.equal(r.stdout_truncated, true);
  assert.equal(r.stdout_dropped, 4900);
  assert.equal(r.stderr_truncated, false);
  console.log("ok: sandbox_exec (argv, shell string, env, cwd, timeout, truncation)");

  // A cancelled call (AbortSignal: notifications/cancelled) kills its command.
  const abort = new AbortController();
  const cancelled = client.callTool({ name: "sandbox_exec", arguments: { sandbox_id: id, argv: ["sleep", "31"] } },
    undefined, { signal: abort.signal });
  const sleeping = async () => (await call(client, "sandbox_exec", { sandbox_id: id, command: "ps -o args" })).stdout
    .split("\n").some((l) => l.trim() === "sleep 31");
  for (let i = 0; !(await sleeping()); i++) assert.ok(i < 50, "sleep 31 started");
  abort.abort("test");
  await assert.rejects(cancelled);
  for (let i = 0; await sleeping(); i++) {
    assert.ok(i < 50, "the cancelled command was killed");
    await new Promise((res) => setTimeout(res, 100));
  }
  console.log("ok: cancellation kills the command");

  let w = await call(client, "sandbox_write_file", { sandbox_id: id, path: "/tmp/note.txt", content: "from mcp\n" });
  assert.equal(w.bytes, 9);
  const bin = Buffer.from([0, 1, 2, 255, 254, 10]);
  await call(client, "sandbox_write_file", {
    sandbox_id: id, path: "/tmp/blob.bin", content: bin.toString("base64"), encoding: "base64", mode: "0600",
  });
  r = await call(client, "sandbox_exec", { sandbox_id: id, command: "cat /tmp/note.txt; stat -c %a /tmp/blob.bin" });
  assert.equal(r.stdout, "from mcp\n600\n");
  let f = await call(client, "sandbox_read_file", { sandbox_id: id, path: "/tmp/note.txt" });
  assert.deepEqual([f.content, f.encoding, f.truncated], ["from mcp\n", "utf8", false]);
  f = await call(client, "sandbox_read_file", { sandbox_id: id, path: "/tmp/blob.bin" });
  assert.equal(f.encoding, "base64");
  assert.deepEqual(Buffer.from(f.content, "base64"), bin);
  f = await call(client, "sandbox_read_file", { sandbox_id: id, path: "/tmp/note.txt", max_bytes: 4 });
  assert.deepEqual([f.content, f.truncated], ["from", true]);
  const ls = await call(client, "sandbox_list_files", { sandbox_id: id, path: "/tmp" });
  const entries = ls.entries.map((e) => e.name);
  assert.ok(entries.includes("note.txt") && entries.includes("blob.bin"), JSON.stringify(ls));
  console.log("ok: files (write text and base64, read, truncate, list)");

  const net = await call(client, "sandbox_set_network", {
    sandbox_id: id, mode: "allowlist", allow: ["198.51.100.0/24"],
  });
  assert.deepEqual(net.policy.allow, ["198.51.100.0/24"]);
  const info = await api("GET", `/v1/sandboxes/${id}`);
  assert.deepEqual(info.body.network.allow, ["198.51.100.0/24"]);

  const logs = await call(client, "sandbox_logs", { sandbox_id: id });
  assert.ok(logs.records.some((rec) => rec.event === "exec"), JSON.stringify(logs.records.map((x) => x.event)));
  const netlogs = await call(client, "sandbox_logs", { sandbox_id: id, network: true });
  assert.ok(netlogs.records.some((rec) => rec.event === "net_policy"), JSON.stringify(netlogs));

  const listed = await call(client, "sandbox_list", { metadata: { mcp_test: TAG } });
  assert.deepEqual(listed.sandboxes.map((s) => s.id), [id]);
  console.log("ok: set_network, logs, list");

  // Failures are tool results with isError, naming the daemon's code and field.
  let e = await client.callTool({ name: "sandbox_exec", arguments: { sandbox_id: "sb-nosuchthing", argv: ["true"] } });
  assert.equal(e.isError, true);
  assert.match(e.content[0].text, /not_found/);
  e = await client.callTool({ name: "sandbox_set_network", arguments: { sandbox_id: id, mode: "allowlist", allow: ["127.0.0.1"] } });
  assert.equal(e.isError, true);
  assert.match(e.content[0].text, /invalid_argument.*field network\.allow\[0\]|allow\[0\]/);
  e = await client.callTool({ name: "sandbox_exec", arguments: { sandbox_id: id, argv: "ls" } });
  assert.equal(e.isError, true);
  assert.match(e.content[0].text, /argv must be an array/);
  e = await client.callTool({ name: "sandbox_read_file", arguments: { sandbox_id: id, path: "/no/such/file" } });
  assert.equal(e.isError, true);
  assert.match(e.content[0].text, /not_found/);
  // Unknown tools and methods are protocol errors.
  await assert.rejects(client.callTool({ name: "sandbox_teleport", arguments: {} }),
    (err) => err instanceof McpError && err.code === -32602);
  await assert.rejects(client.request({ method: "resources/list", params: {} }, EmptyResultSchema),
    (err) => err instanceof McpError && err.code === -32601);
  console.log("ok: errors (isError results; -32602, -32601 protocol errors)");

  const d = await call(client, "sandbox_destroy", { sandbox_id: id });
  assert.equal(d.destroyed, true);
  assert.ok(!(await running(id)));
  await client.close();
  console.log("ok: sandbox_destroy");
}

async function checkDisconnect() {
  const { client } = await connect();
  const owned = await call(client, "sandbox_create", { metadata: { mcp_test: TAG } });
  const kept = await call(client, "sandbox_create", { keep: true, metadata: { mcp_test: TAG } });
  assert.equal(kept.keep, true);
  // A command still running at disconnect must not hold the clean-up up.
  const pending = client.callTool({ name: "sandbox_exec", arguments: { sandbox_id: owned.id, argv: ["sleep", "60"] } })
    .catch(() => null);
  await new Promise((res) => setTimeout(res, 500));
  const started = Date.now();
  await client.close();  // stdin EOF; the SDK waits for the exit
  const waited = Date.now() - started;
  await pending;
  assert.ok(!(await running(owned.id)), "the session's sandbox is gone after the disconnect");
  const live = (await api("GET", "/v1/sandboxes")).body.map((s) => s.id);
  assert.ok(!live.includes(owned.id));
  assert.ok(live.includes(kept.id), "keep: true survives the session");
  assert.ok(waited < 2000, `airlock mcp exited within the SDK's grace period (${waited} ms)`);
  console.log("ok: disconnect destroys the session's sandbox, keeps the kept one");

  // SIGTERM ends a session the same way.
  const child = spawn(AIRLOCK, ["mcp"], { env: serverEnv(), stdio: ["pipe", "pipe", "inherit"] });
  const lines = readline.createInterface({ input: child.stdout });
  const next = () => new Promise((res) => lines.once("line", (l) => res(JSON.parse(l))));
  child.stdin.write(JSON.stringify(init(1, "2025-11-25")) + "\n");
  await next();
  child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/call",
    params: { name: "sandbox_create", arguments: { metadata: { mcp_test: TAG } } } }) + "\n");
  const created = (await next()).result.structuredContent.id;
  assert.ok(await running(created));
  child.kill("SIGTERM");
  await new Promise((res) => child.on("close", res));
  assert.ok(!(await running(created)), "SIGTERM destroys the session's sandbox");
  console.log("ok: SIGTERM destroys the session's sandbox");

  // SIGKILL leaves the server no chance: its guardian process does it.
  const victim = spawn(AIRLOCK, ["mcp"], { env: serverEnv(), stdio: ["pipe", "pipe", "inherit"] });
  const vlines = readline.createInterface({ input: victim.stdout });
  const vnext = () => new Promise((res) => vlines.once("line", (l) => res(JSON.parse(l))));
  victim.stdin.write(JSON.stringify(init(1, "2025-11-25")) + "\n");
  await vnext();
  victim.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/call",
    params: { name: "sandbox_create", arguments: { metadata: { mcp_test: TAG } } } }) + "\n");
  const orphan = (await vnext()).result.structuredContent.id;
  assert.ok(await running(orphan));
  victim.kill("SIGKILL");
  await new Promise((res) => victim.on("exit", res));
  const deadline = Date.now() + 30000;
  while (await running(orphan)) {
    assert.ok(Date.now() < deadline, "the guardian destroyed the killed server's sandbox");
    await new Promise((res) => setTimeout(res, 200));
  }
  console.log("ok: SIGKILL of the server: its guardian destroys the sandbox");

  // SIGKILL while a create is still running: the guardian finds the sandbox
  // by the session's label once the create is done, and destroys it.
  const racer = spawn(AIRLOCK, ["mcp"], { env: serverEnv(), stdio: ["pipe", "pipe", "inherit"] });
  const rlines = readline.createInterface({ input: racer.stdout });
  const rnext = () => new Promise((res) => rlines.once("line", (l) => res(JSON.parse(l))));
  racer.stdin.write(JSON.stringify(init(1, "2025-11-25")) + "\n");
  await rnext();
  const label = `${TAG}-race`;
  racer.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/call",
    params: { name: "sandbox_create", arguments: { metadata: { mcp_test: label } } } }) + "\n");
  const labelled = async () => (await api("GET", `/v1/sandboxes?metadata.mcp_test=${label}`)).body;
  for (let i = 0; (await labelled()).length === 0; i++) {
    assert.ok(i < 3000, "the create reached the daemon");
    await new Promise((res) => setTimeout(res, 10));
  }
  racer.kill("SIGKILL");
  const raceDeadline = Date.now() + 60000;
  while ((await labelled()).length > 0) {
    assert.ok(Date.now() < raceDeadline, "the guardian destroyed the sandbox of the create in flight");
    await new Promise((res) => setTimeout(res, 200));
  }
  console.log("ok: SIGKILL during a create: its guardian destroys that sandbox too");
  return kept.id;
}

try {
  await checkNegotiation();
  await checkTools();
  const kept = await checkDisconnect();
  console.log(`KEPT ${kept}`);
} catch (err) {
  console.error(err);
  process.exit(1);
}
