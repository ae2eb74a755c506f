// Templates: finding, checking and building the frozen guest a clone is
// made from (docs/design.md, "Templates and clones").
#include "engine/templates/service.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "engine/channel/guest_channel.h"
#include "engine/channel/guest_client.h"
#include "engine/channel/warmup.h"
#include "engine/net/host/helper.h"
#include "engine/storage/disk_chain.h"

namespace airlock::templates {

namespace fs = std::filesystem;

namespace {

// The template VM's NIC needs a peer at start (QEMU connects its stream
// netdev once); the template never sends traffic (its hello configures no
// network), so a listening socket nobody accepts on is enough. The clone
// gets the real helper.
int listen_unix(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_errno("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    throw_errno("listen on " + path.string());
  }
  return fd;
}

}  // namespace

TemplateService::TemplateService(const engine::Config& cfg, engine::Launcher& launcher,
                                 engine::AuditJournal& journal,
                                 std::function<std::vector<fs::path>()> disk_roots)
    : cfg_(cfg), launcher_(launcher), journal_(journal), disk_roots_(std::move(disk_roots)) {
  if (cfg_.templates) store_.emplace(cfg_.template_dir, cfg_.template_ram_dir);
}

Template TemplateService::build(const storage::Image& img, const Shape& shape, vmm::Accel accel,
                                const std::string& key) {
  auto t0 = std::chrono::steady_clock::now();
  Staging st = store_->stage(key);
  std::unique_ptr<engine::VmHandle> vm;
  int net_fd = -1;
  auto cleanup = [&] {
    if (vm) {
      try {
        vm->kill();
      } catch (const std::exception& e) {
        spdlog::error("template {}: kill: {}", key, e.what());
      }
    }
    if (net_fd >= 0) ::close(net_fd);
    net_fd = -1;
  };
  try {
    storage::create_overlay(img.rootfs, st.disk, static_cast<uint64_t>(shape.disk_mb));
    vmm::VmConfig vc;
    vc.id = "template-" + key;
    vc.run_dir = st.dir;
    vc.kernel = img.kernel;
    vc.initrd = img.initrd;
    vc.disk = st.disk;
    vc.disk_roots = disk_roots_();
    vc.cpus = shape.cpus;
    vc.memory_mb = shape.memory_mb;
    vc.accel = accel;
    vc.tcg_tb_size_mb = cfg_.tcg_tb_size_mb;
    vc.memory_file = st.ram;
    vc.memory_shared = true;
    if (shape.nic) {
      vc.net_socket = st.dir / "net.sock";
      net_fd = listen_unix(vc.net_socket);
    }
    auto deadline = channel::Clock::now() + std::chrono::seconds(cfg_.boot_timeout_s);
    vm = launcher_.start(vc);
    {
      auto ch = channel::GuestChannel::connect(vm->agent_socket(), deadline);
      channel::HelloParams hello;
      hello.hostname = "airlock-template";
      ch->hello(hello, deadline);
      // The image's warm-up, before the save: every clone starts with its
      // files in the page cache. A failing command fails the template (the
      // create then cold-boots and says why in template_failed).
      channel::run_warmup(*ch, img.config.warmup, "template " + key);
    }  // closed: the saved guest waits for a host, as after a daemon restart
    uint64_t bytes = vm->save_state(st.state, std::chrono::seconds(30));
    vm->kill();
    vm.reset();
    cleanup();
    std::error_code ec;
    for (const char* f : {"net.sock", "console.log", "console.log.old", "qemu.log"})
      fs::remove(st.dir / f, ec);
    Template meta;
    meta.image = img.name;
    meta.image_key = img.key;
    meta.accel = vmm::to_string(accel);
    meta.shape = shape;
    meta.build_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    Template t = store_->commit(st, meta);
    spdlog::info("template {} for {} {} built in {} ms ({} bytes of device state)", key, img.name,
                 to_json(shape).dump(), meta.build_ms, bytes);
    return t;
  } catch (...) {
    cleanup();
    store_->abandon(st);
    throw;
  }
}

std::optional<Template> TemplateService::for_create(const storage::Image& img,
                                                    const engine::SandboxSpec& spec,
                                                    vmm::Accel accel, const std::string& id) {
  if (!cfg_.templates || !store_) return std::nullopt;
  // A recipe build step's layer (a *.qcow2 rootfs) boots once: no template.
  if (img.rootfs.extension() == ".qcow2") return std::nullopt;
  auto note = [&](const char* event, const nlohmann::json& fields) {
    try {
      journal_.append(id, event, fields);
    } catch (const std::exception& e) {
      spdlog::error("sandbox {}: audit: {}", id, e.what());
    }
  };
  Shape shape{spec.cpus, spec.memory_mb, spec.disk_mb, engine::nethost::enabled(spec.network)};
  std::string key;
  try {
    // The warm-up is part of what was saved: another list, another template.
    std::string image_key = img.key;
    if (!img.config.warmup.empty())
      image_key += "+warmup:" + nlohmann::json(img.config.warmup).dump();
    key = TemplateStore::key_for(image_key, shape, vmm::to_string(accel),
                                 TemplateStore::qemu_identity(vmm::VmConfig{}.qemu_binary));
  } catch (const std::exception& e) {
    note("template_failed", {{"reason", e.what()}});
    return std::nullopt;
  }
  std::shared_ptr<std::mutex> building;
  {
    std::lock_guard lock(build_mu_);
    auto& m = building_[key];
    if (!m) m = std::make_shared<std::mutex>();
    building = m;
  }
  std::lock_guard build_lock(*building);
  std::string why;
  std::optional<Template> t = store_->find(key, &why);
  if (!why.empty()) {
    spdlog::warn("{}; rebuilding it", why);
    note("template_invalid", {{"template", key}, {"reason", why}});
  }
  if (t) {
    store_->touch(key);
    return t;
  }
  try {
    t = build(img, shape, accel, key);
    note("template_built", {{"template", key},
                            {"shape", to_json(shape)},
                            {"build_ms", t->build_ms},
                            {"state_bytes", t->state_bytes}});
    for (const std::string& old : store_->prune(cfg_.max_templates))
      spdlog::info("template {} pruned (least recently used)", old);
    return t;
  } catch (const std::exception& e) {
    spdlog::warn("template {} could not be built, cold boot instead: {}", key, e.what());
    note("template_failed", {{"template", key}, {"reason", e.what()}});
    return std::nullopt;
  }
}

std::shared_ptr<vmm::SealedRam> TemplateService::sealed_ram(const Template& tpl) {
  auto stamp_of = [](const fs::path& p) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return std::string();
    return std::to_string(st.st_ino) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
           std::to_string(st.st_ctim.tv_nsec) + ":" + std::to_string(st.st_size);
  };
  std::lock_guard lock(sealed_mu_);
  // Copies of files that were rebuilt or removed since are nobody's.
  for (auto it = sealed_.begin(); it != sealed_.end();)
    it = stamp_of(it->first) != it->second.first ? sealed_.erase(it) : std::next(it);
  std::string stamp = stamp_of(tpl.ram);
  auto it = sealed_.find(tpl.ram.string());
  if (it != sealed_.end() && it->second.first == stamp) return it->second.second;
  auto t0 = std::chrono::steady_clock::now();
  auto ram = vmm::SealedRam::copy_of(tpl.ram);
  spdlog::info(
      "template {}: sealed RAM copy for clones ({} MiB) in {} ms", tpl.ram.string(),
      ram->size() >> 20,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  sealed_[tpl.ram.string()] = {stamp, ram};
  return ram;
}

}  // namespace airlock::templates
