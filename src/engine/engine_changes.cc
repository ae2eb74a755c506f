// GET .../changes: the sandbox's filesystem diff since it started, read on
// the host from its disk layers (fsdiff/fsdiff.h).
#include <sys/stat.h>

#include <chrono>
#include <optional>

#include "common/error.h"
#include "common/subprocess.h"
#include "engine/channel/guest_client.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/fsdiff/fsdiff.h"
#include "engine/storage/disk_chain.h"

namespace airlock::engine {
namespace fs = std::filesystem;

namespace {

// One `changes` call per sandbox at a time. A second one is refused at once
// (409) rather than queued: each call may convert both disks to raw
// scratch files and walk them for minutes, so a queue would hold request
// threads and the caller learns nothing a retry would not tell it.
template <typename Impl>
class ChangesSlot {
 public:
  ChangesSlot(Impl& impl, const std::string& id) : impl_(impl), id_(id) {
    std::lock_guard lock(impl_.changes_mu);
    if (!impl_.changes_running.insert(id_).second)
      throw Error(Errc::conflict, "a changes call on sandbox " + id_ +
                                      " is already running; one runs per sandbox at a time: "
                                      "retry when it has finished");
  }
  ~ChangesSlot() {
    std::lock_guard lock(impl_.changes_mu);
    impl_.changes_running.erase(id_);
  }
  ChangesSlot(const ChangesSlot&) = delete;
  ChangesSlot& operator=(const ChangesSlot&) = delete;

 private:
  Impl& impl_;
  std::string id_;
};

// MiB that materializing `chain` may write: its top's virtual size (qemu-img
// convert -O raw into a sparse file writes at most that), or nothing for a
// lone raw file (opened as is).
int64_t scratch_mb(const std::vector<storage::ChainLink>& chain) {
  if (chain.empty() || (chain.size() == 1 && chain[0].format == "raw")) return 0;
  return static_cast<int64_t>((chain[0].virtual_size + (1 << 20) - 1) >> 20);
}

}  // namespace

nlohmann::json Engine::changes(const std::string& id, const std::string& since, bool content) {
  // "start", or a snapshot's name: its disk (a read-only layer the host
  // wrote, engine_snapshots.cc) is the "before".
  std::optional<snapshots::Snapshot> snap;
  if (since != "start") {
    snapshots::check_name(since, "since");
    snap = impl_->snaps->store().find(since);
    // A tenant's sandbox is compared only with that tenant's snapshots;
    // another's is answered exactly like a name that does not exist.
    if (snap) {
      const std::string owner = get(id).spec.tenant;
      if (!owner.empty() && snap->tenant != owner) snap.reset();
    }
    if (!snap)
      throw Error(
          Errc::invalid_argument,
          "since must be \"start\" or a snapshot's name; there is no snapshot '" + since + "'",
          "since");
  }
  auto sb = impl_->table.running(id);
  ChangesSlot one_at_a_time(*impl_, id);
  ActivityGuard active(*sb);
  auto t0 = std::chrono::steady_clock::now();
  // Ask the guest to flush what it wrote, so the layers hold it. Only a
  // request: what it reports is not used, and a guest that ignores it only
  // makes its own diff stale.
  try {
    channel::sync(*sb->channel, channel::Clock::now() + std::chrono::seconds(30));
  } catch (const Error&) {
  }
  int64_t sync_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  // Both chains are read from their headers by airlock (the sandbox's QEMU
  // can write its disk's header) and given to qemu-img file by file.
  const auto roots = impl_->disk_roots();
  fs::path disk = sb->run_dir() / "disk.qcow2";
  auto after = storage::disk_chain(disk, roots, "sandbox " + id + "'s disk");
  std::vector<storage::ChainLink> before;
  if (snap) {
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(snap->layer(), ec)))
      throw Error(Errc::unavailable, "snapshot " + since + " has no disk layer");
    before = storage::disk_chain(snap->layer(), roots, "snapshot " + since + "'s disk layer");
  } else {
    // The overlay's backing chain is the sandbox's start (the image, or its
    // template's disk).
    if (after.size() < 2)
      throw Error(Errc::internal, "sandbox " + id + "'s disk has no backing file");
    before.assign(after.begin() + 1, after.end());
  }
  // -U (force-share): QEMU holds the running sandbox's disk locked.
  auto layers = [](const std::vector<storage::ChainLink>& c) {
    if (c.size() == 1 && c[0].format == "raw") return fsdiff::LayerChain{c[0].path, "raw", ""};
    return fsdiff::LayerChain{c[0].path, "qcow2", storage::image_opts(c, true)};
  };
  // The scratch files count against disk admission like sandboxes' disks,
  // so parallel calls on full disks cannot fill the host: reserved before
  // any conversion starts, released when the call ends however it ends.
  const int64_t scratch = scratch_mb(before) + scratch_mb(after);
  const std::string key = "changes/" + id;
  impl_->admission.reserve(key, scratch,
                           "this changes call's scratch space (" + std::to_string(scratch) +
                               " MiB: raw copies of the disk layers it compares)",
                           "");
  ScopeGuard release([&] { impl_->admission.release(key); });
  fs::path tmp = impl_->cfg.data_dir / "tmp";
  std::error_code ec;
  fs::create_directories(tmp, ec);
  ::chmod(tmp.c_str(), 0700);
  fsdiff::Options opt;
  opt.content = content;
  auto out = fsdiff::diff(layers(before), layers(after), tmp, opt);
  out["sandbox"] = id;
  out["since"] = since;
  out["timing_ms"]["sync"] = sync_ms;
  return out;
}

}  // namespace airlock::engine
