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
// kept only when running as root; xattrs other than user.* and
// security.capability are dropped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/storage/image_store.h"

namespace airlock::storage {

struct ImportPolicy {
  bool keep_owners = true;                  // chown to the archive's uid/gid (root only)
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
};

// Unpacks `input` (file or OCI layout directory) into `root` (created; must
// not exist), using `scratch` (an existing empty directory) for the outer
// tar's contents. Throws Error naming what was wrong; the caller removes
// `root` and `scratch` on failure.
ImportResult unpack_oci(const std::filesystem::path& input, const std::filesystem::path& root,
                        const std::filesystem::path& scratch, const ImportPolicy& policy = {});

// unpack_oci into a temporary directory under the store's image directory,
// then store.install(name, ...). Nothing remains of a failed import.
Image import_oci(ImageStore& store, const std::string& name, const std::filesystem::path& input,
                 const ImportPolicy& policy = {}, bool replace = false,
                 const ProgressFn& progress = {});

}  // namespace airlock::storage
