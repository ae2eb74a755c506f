// The filesystem section of sdk_test.mjs: sandbox.files of E2B's SDK
// against airlock's envd (filesystem.Filesystem over Connect, GET/POST
// /files). `t` carries the helpers of sdk_test.mjs: { e2b, ok, rejects, until }.
import assert from "node:assert/strict";

export async function files(ctx, t) {
  const { sbx } = ctx;
  const { ok, rejects, until } = t;
  const { NotFoundError, InvalidArgumentError } = t.e2b;
  const dir = "/home/user/fs";

  // write: one text file, then one binary (every byte value), then several
  // files in one multipart upload.
  const info = await sbx.files.write(`${dir}/a.txt`, "hello files\n");
  assert.equal(info.path, `${dir}/a.txt`);
  assert.equal(info.name, "a.txt");
  assert.equal(await sbx.files.read(`${dir}/a.txt`), "hello files\n");
  ok("files.write + read (text); missing parent directories are made");

  const bytes = new Uint8Array(256 * 1024);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + (i >> 8)) & 0xff;
  await sbx.files.write(`${dir}/bin/all.bin`, bytes.buffer);
  const back = await sbx.files.read(`${dir}/bin/all.bin`, { format: "bytes" });
  assert.equal(back.length, bytes.length);
  assert.ok(Buffer.from(back).equals(Buffer.from(bytes)), "binary round trip");
  ok("files.write (ArrayBuffer, 256 KiB, every byte value) + read bytes");

  const many = await sbx.files.write([
    { path: `${dir}/m/one.txt`, data: "1" },
    { path: `${dir}/m/two.txt`, data: "22" },
    { path: "fs/m/rel.txt", data: "relative to the home" },
  ]);
  assert.deepEqual(many.map((w) => w.path), [`${dir}/m/one.txt`, `${dir}/m/two.txt`, `${dir}/m/rel.txt`]);
  assert.equal(await sbx.files.read(`${dir}/m/two.txt`), "22");
  ok("files.write of several files in one upload (relative paths from the home)");

  const stream = await sbx.files.read(`${dir}/bin/all.bin`, { format: "stream" });
  let total = 0;
  for await (const chunk of stream) total += chunk.length;
  assert.equal(total, bytes.length);
  ok("files.read as a stream");

  // What the default user writes belongs to it (envd chowns).
  assert.equal((await sbx.commands.run(`stat -c %U:%G ${dir}/a.txt ${dir}/m`)).stdout, "user:user\nuser:user\n");
  ok("written files and made directories belong to the user");

  // list, with depth.
  const top = await sbx.files.list(dir);
  assert.deepEqual(top.map((e) => e.name), ["a.txt", "bin", "m"]);
  const a = top[0];
  assert.equal(a.type, "file");
  assert.equal(a.size, 12);
  assert.equal(a.permissions, "-rw-r--r--");
  assert.equal(a.owner, "user");
  assert.equal(top[1].type, "dir");
  const deep = await sbx.files.list(dir, { depth: 2 });
  assert.deepEqual(deep.map((e) => e.path), [
    `${dir}/a.txt`, `${dir}/bin`, `${dir}/bin/all.bin`, `${dir}/m`,
    `${dir}/m/one.txt`, `${dir}/m/rel.txt`, `${dir}/m/two.txt`,
  ]);
  ok("files.list: entries with type, size, permissions, owner; depth 2");

  // exists, makeDir, getInfo.
  assert.equal(await sbx.files.exists(`${dir}/a.txt`), true);
  assert.equal(await sbx.files.exists(`${dir}/nope`), false);
  assert.equal(await sbx.files.makeDir(`${dir}/new/deeper`), true);
  assert.equal(await sbx.files.makeDir(`${dir}/new/deeper`), false);
  ok("files.exists; makeDir true, then false when it exists");

  const gi = await sbx.files.getInfo(`${dir}/a.txt`);
  assert.equal(gi.type, "file");
  assert.equal(gi.mode, 0o644);
  assert.equal(gi.group, "user");
  assert.ok(gi.modifiedTime instanceof Date && Math.abs(gi.modifiedTime - Date.now()) < 3600_000, `${gi.modifiedTime}`);
  await sbx.commands.run(`ln -s ${dir}/m ${dir}/link`);
  const li = await sbx.files.getInfo(`${dir}/link`);
  assert.equal(li.symlinkTarget, `${dir}/m`);
  assert.equal(li.type, "dir");
  ok("files.getInfo: type, mode, group, modifiedTime; a symlink's target");

  // rename and remove.
  const moved = await sbx.files.rename(`${dir}/a.txt`, `${dir}/moved/b.txt`);
  assert.equal(moved.path, `${dir}/moved/b.txt`);
  assert.equal(await sbx.files.exists(`${dir}/a.txt`), false);
  assert.equal(await sbx.files.read(`${dir}/moved/b.txt`), "hello files\n");
  ok("files.rename (into a new directory)");
  await sbx.files.remove(`${dir}/moved/b.txt`);
  await sbx.files.remove(`${dir}/m`);
  assert.equal(await sbx.files.exists(`${dir}/m`), false);
  await sbx.files.remove(`${dir}/never-was`);
  ok("files.remove of a file and a whole directory (a missing path is fine, as on E2B)");

  // Errors as the SDK maps them.
  await rejects(sbx.files.read(`${dir}/nope`), NotFoundError, "files.read of a missing file is NotFoundError");
  await rejects(sbx.files.getInfo(`${dir}/nope`), NotFoundError, "files.getInfo of a missing path is NotFoundError");
  await rejects(sbx.files.list(`${dir}/nope`), NotFoundError, "files.list of a missing directory is NotFoundError");
  await rejects(sbx.files.rename(`${dir}/nope`, `${dir}/x`), NotFoundError, "files.rename of a missing path is NotFoundError");
  await rejects(sbx.files.list(`${dir}/bin/all.bin`), InvalidArgumentError, "files.list of a file is InvalidArgumentError");

  // watchDir: create, write, remove; recursive into a subdirectory.
  const events = [];
  const w = await sbx.files.watchDir(dir, (e) => events.push(e), { recursive: true, timeoutMs: 0 });
  await sbx.files.write(`${dir}/watched.txt`, "x");
  await sbx.commands.run(`echo more >> ${dir}/watched.txt && mkdir -p ${dir}/new/deeper && echo y > ${dir}/new/deeper/inner.txt`);
  await sbx.files.remove(`${dir}/watched.txt`);
  const seen = (name, type) => events.some((e) => e.name === name && e.type === type);
  await until(() => seen("watched.txt", "create") && seen("watched.txt", "write") && seen("watched.txt", "remove") &&
                    seen("new/deeper/inner.txt", "create"), `watch events (${JSON.stringify(events)})`);
  await w.stop();
  ok("files.watchDir: create, write, remove events, recursive into subdirectories");
}
