// Snapshots on disk (docs/design.md, "Snapshots, fork, pause"): what
// `create --from` and fork start new sandboxes from.
//
//   <root>/<name>/layer.qcow2     the sandbox's disk at the snapshot: a copy of
//                                 its overlay, read-only; backing: the parent
//                                 snapshot's layer, base.qcow2 or the image
//   <root>/<name>/base.qcow2      a template clone's frozen disk, hard-linked
//                                 (or copied) so pruning the template cannot
//                                 pull it away; only for clone sources
//   <root>/<name>/mem.state       memory snapshots: the VM's whole state
//   <root>/<name>/snapshot.json   what it is, sizes and SHA-256 of every file
//
// A snapshot is written into <root>/.staging-<name>-<random> and renamed
// into place only once every file is complete and fsynced, so a failure (a
// full disk) leaves no half-written snapshot and never touches another one;
// staging leftovers of a crash are removed at start. verify() re-reads
// every file before a restore: a missing, truncated or altered one is
// refused with Error naming the file, before anything is created.
//
//   SnapshotStore store(data / "snapshots");
//   Staging st = store.stage("base-env");     // Error(conflict) if it exists
//   ... copy the overlay to st.dir / "layer.qcow2" ...
//   Snapshot s = store.commit(st, meta);      // hashes, read-only, rename
//   store.verify(s);                          // before each restore
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace airlock::snapshots {

struct Snapshot {
  std::string name;
  std::string source;  // the sandbox it was taken of
  std::string parent;  // the snapshot the source was created from ("" = an image)
  std::string image;   // the image name underneath
  // Its owner: the tenant whose sandbox it was taken of ("" = the
  // operator's). Only the owner restores it, forks from it, diffs against it
  // or saves it as an image (daemon/tenancy.h).
  std::string tenant;
  bool memory = false;
  // Set by fork: removed with the last sandbox that uses it.
  bool internal = false;
  int cpus = 1, memory_mb = 256, disk_mb = 1024;
  std::string ram_block;  // vmm::VmConfig::ram_block of the saved VM
  std::string accel;
  bool networked = false;  // the saved VM has a NIC (restores must too)
  int64_t created_at_ms = 0;
  int64_t took_ms = 0;
  int64_t paused_ms = 0;  // how long the source's vCPUs stood still for it
  uint64_t bytes = 0;     // sum of the files
  // file name -> {"size", "sha256"}
  nlohmann::json files = nlohmann::json::object();
  std::filesystem::path dir;
  std::filesystem::path layer() const { return dir / "layer.qcow2"; }
  std::filesystem::path mem_state() const { return dir / "mem.state"; }
};
nlohmann::json to_json(const Snapshot& s);

struct Staging {
  std::string name;
  std::filesystem::path dir;
};

// Error(invalid_argument, field) unless `name` is 1..64 of [A-Za-z0-9_-],
// not starting with '-' (the message names what is wrong: '/', "..", NUL).
void check_name(const std::string& name, const std::string& field = "name");

class SnapshotStore {
 public:
  // Creates `root` (0700) and removes staging leftovers.
  explicit SnapshotStore(std::filesystem::path root);

  // Error(conflict) if `name` exists; Error(internal/unavailable) if the
  // staging directory cannot be made.
  Staging stage(const std::string& name);
  // Hashes every regular file of the staging dir, writes snapshot.json
  // (fsynced), makes the files read-only and renames the dir into place.
  // Error(conflict) if the name was taken meanwhile; on any error the
  // staging dir is removed.
  Snapshot commit(const Staging& staging, Snapshot meta);
  void abandon(const Staging& staging) noexcept;

  // The snapshot, or Error(not_found, field). Unchecked (verify() checks).
  Snapshot get(const std::string& name) const;
  std::optional<Snapshot> find(const std::string& name) const;
  std::vector<Snapshot> list() const;  // by name
  // Re-reads every recorded file (size, then SHA-256) of `s` and of every
  // parent: Error(unavailable) naming the snapshot and the file that is
  // missing, truncated or altered (the snapshot is unusable, the caller did
  // nothing wrong). Also checks that the chain's backing files exist.
  void verify(const Snapshot& s) const;
  // Removes it (no reference check here: the engine decides). Never throws.
  void remove(const std::string& name) noexcept;

  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
  mutable std::mutex mu_;
};

}  // namespace airlock::snapshots
