// E2B's published JavaScript SDK, unmodified, against airlockd's
// E2B-compatible API (docs/e2b.md). Run by test_e2b.py with
//   node sdk_test.mjs <package>     (package: "e2b" = 2.51.0, "e2b-2.10" = 2.10.1)
// and E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (tenant A), E2B_API_KEY_B
// (tenant B) set. One section per area: a section is an async function of
// the shared context; add filesystem sections the same way.
// Prints "ok: <what>" per check and "SANDBOX <id>" for every sandbox made;
// any failure throws and exits 1.
import assert from "node:assert/strict";
import { files as filesSection } from "./files_section.mjs";

const pkg = process.argv[2] ?? "e2b";
const e2b = await import(pkg);
const { Sandbox, CommandExitError, NotFoundError, TimeoutError, AuthenticationError } = e2b;
const RUN = `${pkg}-${process.pid}`;

function ok(what) {
  console.log(`ok: [${pkg}] ${what}`);
}

async function rejects(promise, Klass, what) {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof Klass, `${what}: wanted ${Klass.name}, got ${err?.constructor?.name}: ${err?.message}`);
    ok(what);
    return err;
  }
  assert.fail(`${what}: no error`);
}

async function until(cond, what, ms = 30000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`timed out waiting for ${what}`);
}

// --- sections --------------------------------------------------------------

async function create(ctx) {
  const sbx = await Sandbox.create("base", {
    metadata: { suite: "e2b-sdk", run: RUN },
    envs: { FROM_CREATE: "yes" },
    timeoutMs: 600_000,
  });
  console.log(`SANDBOX ${sbx.sandboxId}`);
  ctx.sbx = sbx;
  ok("Sandbox.create from base with metadata and envs");
}

async function commands(ctx) {
  const { sbx } = ctx;
  const r = await sbx.commands.run("echo hello; echo oops >&2");
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, "hello\n");
  assert.equal(r.stderr, "oops\n");
  ok("commands.run: stdout, stderr, exit code 0");

  const err = await rejects(sbx.commands.run("echo partial; exit 3"), CommandExitError, "commands.run: exit 3 is CommandExitError");
  assert.equal(err.exitCode, 3);
  assert.equal(err.stdout, "partial\n");

  assert.equal((await sbx.commands.run("pwd")).stdout, "/home/user\n");
  assert.equal((await sbx.commands.run("pwd", { cwd: "/tmp" })).stdout, "/tmp\n");
  ok("commands.run: cwd defaults to the user's home, cwd option");

  assert.equal((await sbx.commands.run("echo $FOO-$FROM_CREATE", { envs: { FOO: "bar" } })).stdout, "bar-yes\n");
  ok("commands.run: envs, and the sandbox's envs from create");

  assert.equal((await sbx.commands.run("whoami")).stdout, "user\n");
  assert.equal((await sbx.commands.run("whoami", { user: "root" })).stdout, "root\n");
  ok("commands.run: default user `user`, user root");

  for (const tool of ["bash", "curl", "git", "python3"])
    await sbx.commands.run(`command -v ${tool}`);
  ok("template base has bash, curl, git, python3");

  await rejects(sbx.commands.run("sleep 30", { timeoutMs: 1500 }), TimeoutError, "commands.run: timeoutMs is TimeoutError");

  let streamed = "";
  await sbx.commands.run("for i in 1 2 3; do echo line$i; done", { onStdout: (d) => (streamed += d) });
  assert.equal(streamed, "line1\nline2\nline3\n");
  ok("commands.run: onStdout streams");
}

async function background(ctx) {
  const { sbx } = ctx;
  let out = "";
  const h = await sbx.commands.run("cat", { background: true, stdin: true, onStdout: (d) => (out += d), timeoutMs: 0 });
  assert.ok(h.pid > 0);
  await sbx.commands.sendStdin(h.pid, "ping\n");
  await until(() => out.includes("ping\n"), "the echo of stdin");
  ok("background command: sendStdin reaches it, output streams back");

  const procs = await sbx.commands.list();
  const mine = procs.find((p) => p.pid === h.pid);
  assert.ok(mine, `commands.list has pid ${h.pid}: ${JSON.stringify(procs)}`);
  assert.equal(mine.cmd, "/bin/bash");
  assert.deepEqual(mine.args, ["-l", "-c", "cat"]);
  ok("commands.list shows the running command");

  // A second stream onto the same process, then the first one leaves:
  // the process lives on (envd: a process does not belong to its stream).
  let out2 = "";
  const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => (out2 += d), timeoutMs: 0 });
  await h.disconnect();
  await sbx.commands.sendStdin(h.pid, "pong\n");
  await until(() => out2.includes("pong\n"), "output on the connected stream");
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid));
  ok("commands.connect: a second stream; the first one's disconnect leaves it running");

  assert.equal(await h2.kill(), true);
  await rejects(h2.wait(), CommandExitError, "killed background command ends (CommandExitError)");
  await until(async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid), "the killed command to leave the list");
  assert.equal(await sbx.commands.kill(h.pid), false);
  ok("kill: gone from commands.list; killing it again is false");
  await rejects(sbx.commands.sendStdin(h.pid, "x"), NotFoundError, "sendStdin to an ended pid is NotFoundError");
}

async function pty(ctx) {
  const { sbx } = ctx;
  let out = "";
  const dec = new TextDecoder();
  const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += dec.decode(d, { stream: true })), timeoutMs: 0 });
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode("echo $((6*7)); tty\n"));
  await until(() => out.includes("42") && out.includes("/dev/pts/"), "the terminal's answer");
  ok("pty.create + sendInput: a shell on a terminal");
  await sbx.pty.resize(t.pid, { cols: 100, rows: 30 });
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode("stty size\n"));
  await until(() => out.includes("30 100"), "the new size");
  ok("pty.resize: the program sees the new size");
  assert.equal(await sbx.pty.kill(t.pid), true);
  const r = await t.wait().catch((e) => e);
  assert.ok(r instanceof CommandExitError || r?.exitCode !== undefined, `pty wait: ${r}`);
  ok("pty.kill ends the session");
}

async function listing(ctx) {
  const mine = await Sandbox.list({ query: { metadata: { run: RUN } } }).nextItems();
  assert.deepEqual(mine.map((s) => s.sandboxId), [ctx.sbx.sandboxId]);
  assert.equal(mine[0].metadata.run, RUN);
  const none = await Sandbox.list({ query: { metadata: { run: "no-such-run" } } }).nextItems();
  assert.equal(none.length, 0);
  ok("Sandbox.list with a metadata filter");
}

async function tenants(ctx) {
  const other = { apiKey: process.env.E2B_API_KEY_B };
  await rejects(Sandbox.connect(ctx.sbx.sandboxId, other), NotFoundError, "tenant B: connect to A's sandbox is NotFoundError");
  await rejects(Sandbox.getInfo(ctx.sbx.sandboxId, other), NotFoundError, "tenant B: getInfo of A's sandbox is NotFoundError");
  assert.equal(await Sandbox.kill(ctx.sbx.sandboxId, other), false);
  assert.equal((await Sandbox.list(other).nextItems()).some((s) => s.sandboxId === ctx.sbx.sandboxId), false);
  ok("tenant B: kill is false, list does not show A's sandbox");
  assert.equal((await ctx.sbx.commands.run("echo still mine")).stdout, "still mine\n");
}

async function errors(ctx) {
  await rejects(Sandbox.list({ apiKey: "e2b_" + "0".repeat(40) }).nextItems(), AuthenticationError, "a wrong API key is AuthenticationError");
  await rejects(Sandbox.connect("sb-000000000000"), NotFoundError, "connect to an unknown id is NotFoundError");
}

async function lifetime(ctx) {
  const { sbx } = ctx;
  await sbx.setTimeout(3000);
  await until(async () => !(await sbx.isRunning()), "expiry after setTimeout", 60000);
  await rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError, "after setTimeout the sandbox expires: getInfo is NotFoundError");
  await rejects(sbx.commands.run("true"), Error, "after expiry commands fail");

  const k = await Sandbox.create("base", { metadata: { run: RUN }, timeoutMs: 300_000 });
  console.log(`SANDBOX ${k.sandboxId}`);
  assert.equal((await k.commands.run("echo alive")).stdout, "alive\n");
  await k.kill();
  assert.equal(await Sandbox.kill(k.sandboxId), false);
  await rejects(Sandbox.getInfo(k.sandboxId), NotFoundError, "kill: then getInfo is NotFoundError");
  assert.equal(await k.isRunning(), false);
  ok("kill: the sandbox is gone, envd answers as for a dead sandbox");
}

// --- run -------------------------------------------------------------------

const files = (ctx) => filesSection(ctx, { e2b, ok, rejects, until });
const sections = { create, commands, background, pty, listing, tenants, errors, files, lifetime };
const only = process.env.E2B_SECTIONS ? process.env.E2B_SECTIONS.split(",") : Object.keys(sections);
const ctx = {};
for (const name of ["create", ...only.filter((n) => n !== "create" && n !== "lifetime"), "lifetime"]) {
  if (!only.includes(name) && name !== "create") continue;
  const t0 = Date.now();
  await sections[name](ctx);
  console.log(`section ${name}: ${Date.now() - t0} ms`);
}
console.log(`ok: [${pkg}] all sections passed`);
