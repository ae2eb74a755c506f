// OCI / `docker save` image import: reads an image archive with libarchive
// and writes its root filesystem into a directory, which ImageStore::install
// then turns into an airlock image.
//
//   ImportResult r = unpack_oci(input, scratch / "root", scratch, {});
//   store.install(name, scratch / "root", r.config, {.source = r.source, .layers = r.layers});
//
// or, in one call with a scratch directory of its own, import_oci() below.
//
// Accepted inputs: a `docker save` tarball (manifest.json + <config>.json +
// layer tars), an OCI image layout as a directory or as a tar (oci-layout,
// index.json, blobs/<alg>/<hex>); the outer tar and the layers may be
// gzip/zstd/xz compressed (libarchive detects it). Layers are applied in
// order: `.wh.NAME` removes NAME of the lower layers, `.wh..wh..opq` empties
// its directory of what lower layers put there.
//
// Everything in the archive is hostile (docs/design.md, "Image import"):
// every entry is written with *at() calls through directory descriptors
// opened with O_NOFOLLOW from the new root, so nothing is ever written
// outside it. Refused, with Error(invalid_argument) naming the layer and the
// entry: absolute paths, `..` components, paths through a symlink (a
// symlinked parent directory), relative symlinks that climb above the root,
// hard links to anything outside the tree or to a directory, duplicate
// entries in one layer, paths or link targets longer than 4096 bytes,
// headers libarchive cannot read (giant pax headers), a layer that expands
// to more than max(max_ratio × its blob size, min_layer_budget), an image
// beyond max_bytes, blobs whose sha256 differs from their digest, docker
// save layers whose uncompressed sha256 differs from the image config's
// rootfs.diff_ids (or a config without them, or one whose sha256 differs
// from the id in its file name), an outer archive of more than
// max_archive_entries entries or that expands to more than
// max(max_ratio × its size, min_layer_budget).
// Neutralised: absolute symlinks are kept as they are (they resolve inside
// the guest; the host never follows them); device nodes and sockets are
// dropped unless keep_devices (counted in ImportResult::dropped); owners are
// kept only when running as root (or deferred: ImportPolicy::defer); xattrs
// other than user.* and security.capability are dropped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/storage/image_store.h"

namespace airlock::storage {

// An entry's owner, mode and xattrs, as an importer that may not set them
// (ImportPolicy::defer) leaves them for root to apply (settle_import).
struct EntryMeta {
  char kind = 'f';  // 'f' file, 'd' directory, 'l' symlink, 'p' fifo
  uint32_t uid = 0, gid = 0;
  uint32_t mode = 0;  // permission bits, set-id and sticky included
  std::vector<std::pair<std::string, std::string>> xattrs;  // user.*, security.capability
};
// By path below the root, "a/b"; paths a later layer removed are gone.
using Manifest = std::map<std::string, EntryMeta>;

struct ImportPolicy {
  bool keep_owners = true;  // chown to the archive's uid/gid (root only)
  // Write contents only (files 0600, directories 0700, as the caller):
  // owners, modes and xattrs go to ImportResult::manifest. What
  // airlock-confine's importer runs, as an unprivileged uid.
  bool defer = false;
  bool keep_devices = false;                // char/block device nodes (root only)
  uint64_t max_bytes = uint64_t{64} << 30;  // bytes written for the whole image
  uint64_t max_entries = 2'000'000;         // entries over all layers
  uint64_t max_archive_entries = 10'000;    // of the outer archive (docker save: 4 per layer)
  uint64_t max_ratio = 100;                 // layer (or outer archive) bytes / its file
  uint64_t min_layer_budget = uint64_t{32} << 20;  // a small layer may still expand to this
};

struct ImportResult {
  ImageConfig config;  // Env, WorkingDir, User, Entrypoint, Cmd, Labels of the image config
  std::string source;  // "oci:<manifest digest>" or "docker-save:<config digest>"
  int layers = 0;
  uint64_t bytes = 0;    // file bytes written
  uint64_t entries = 0;  // entries applied
  uint64_t dropped = 0;  // device nodes, sockets, xattrs not kept
  Manifest manifest;     // ImportPolicy::defer only
};

// Unpacks `input` (file or OCI layout directory) into `root` (created; must
// not exist), using `scratch` (an existing empty directory) for the outer
// tar's contents. Throws Error naming what was wrong; the caller removes
// `root` and `scratch` on failure.
ImportResult unpack_oci(const std::filesystem::path& input, const std::filesystem::path& root,
                        const std::filesystem::path& scratch, const ImportPolicy& policy = {});

// The daemon's import: unpack_oci runs in airlock-confine (mode "import":
// an unprivileged leased uid, no inherited descriptors, seccomp without
// exec or sockets, Landlock to its scratch directory, memory/CPU/file-size
// limits and a deadline), with `defer`; root then applies the manifest it
// left (settle_import) and store.install(name, ...) takes the tree. Nothing
// remains of a failed import. (oci_confined.cc)
Image import_oci(ImageStore& store, const std::string& name, const std::filesystem::path& input,
                 const ImportPolicy& policy = {}, bool replace = false,
                 const ProgressFn& progress = {});

// Applies `m` to the tree below `root` that an importer running as `uid`
// (-1: as this process) left, through descriptors, never following a
// symlink: owners (as root), then modes, then xattrs; anything it left
// without an entry becomes root's with its mode. Refused (Error naming the
// path): an inode the importer did not create (owned by another uid), a
// node of another kind than its entry or than file/directory/symlink/fifo,
// a tree deeper than 1024 directories. Returns the xattrs it could not set.
uint64_t settle_import(const std::filesystem::path& root, const Manifest& m, int64_t uid);

// The manifest as the importer hands it over (one line per entry, paths and
// xattrs hex-encoded), and back; read_manifest refuses anything malformed,
// a line over 8 MiB or more than `max_entries` entries, naming the line.
void write_manifest(const Manifest& m, int fd);
Manifest read_manifest(int fd, uint64_t max_entries);

}  // namespace airlock::storage
