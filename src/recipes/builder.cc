#include "recipes/builder.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/scope_guard.h"
#include "common/subprocess.h"
#include "engine/api/service.h"
#include "recipes/install.h"
#include "engine/storage/digest.h"
#include "engine/storage/image_name.h"
#include "engine/storage/image_store.h"
#include "engine/storage/layer_cache.h"

namespace airlock::recipes {
namespace fs = std::filesystem;

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxSteps = 14;

// Guest output as valid UTF-8 (invalid bytes become U+FFFD): it goes into
// JSON events and error messages.
std::string utf8(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t allocated_bytes(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Serialises events from the exec's output thread and the progress poller,
// and turns "the client left" into an error that stops the build.
class Events {
 public:
  explicit Events(const EventFn& fn) : fn_(fn) {}
  void operator()(const json& e) {
    std::lock_guard lock(mu_);
    if (gone_) return;
    if (fn_ && !fn_(e)) gone_ = true;
  }
  bool gone() {
    std::lock_guard lock(mu_);
    return gone_;
  }
  void check() {
    if (gone()) throw Error(Errc::unavailable, "the build was cancelled (the client went away)");
  }

 private:
  const EventFn& fn_;
  std::mutex mu_;
  bool gone_ = false;
};

// The guest writes nothing more to its root disk: flushed, then remounted
// read-only (sysrq 'u' works on every image, busybox or Debian, with files
// still open for writing), flushed again. After this the overlay file is
// complete and consistent as it is, whatever happens to QEMU.
constexpr const char* kFreeze =
    "sync; echo u > /proc/sysrq-trigger; i=0; "
    "while ! awk '$2 == \"/\" && $4 ~ /^ro/ {f = 1} END {exit !f}' /proc/mounts; do "
    "i=$((i + 1)); [ $i -gt 100 ] && { echo 'root did not become read-only' >&2; exit 1; }; "
    "sleep 0.1; done; sync";

struct StepRun {
  engine::SandboxService& engine;
  const storage::Image& base;
  const Recipe& recipe;
  Events& events;
};

// Runs step `i` on `prev` (a layer or the base rootfs) and keeps its disk as
// `layer`. Leaves no sandbox behind, whatever happens.
void run_step(StepRun& r, const Step& step, size_t i, size_t count, const fs::path& prev,
              const fs::path& layer, const std::string& field) {
  engine::SandboxSpec spec;
  spec.image = r.base.name;
  spec.memory_mb = r.recipe.memory_mb;
  spec.disk_mb = static_cast<int>((r.base.rootfs_bytes + (1 << 20) - 1) >> 20);
  spec.timeout_s = step.timeout_s + 600;
  spec.network = {{"mode", r.recipe.network_mode}};
  if (r.recipe.network_mode != "none") spec.network["allow"] = r.recipe.network_allow;
  spec.metadata = {
      {"airlock.build", "step " + std::to_string(i + 1) + "/" + std::to_string(count)}};
  storage::Image on = r.base;
  on.rootfs = prev;
  on.key = "build-" + step.key;
  auto t0 = Clock::now();
  engine::SandboxInfo sb = r.engine.create_on_image(spec, on);
  ScopeGuard drop([&] {
    try {
      r.engine.destroy_and_wait(sb.id);  // its disk becomes the layer: QEMU must be gone
    } catch (const std::exception& e) {
      spdlog::warn("build sandbox {}: {}", sb.id, e.what());
    }
  });
  fs::path disk = r.engine.disk_path(sb.id);

  // Bytes: the overlay's allocated size, about every second.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread poller([&] {
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, std::chrono::seconds(1), [&] { return done; }))
      r.events({{"type", "progress"},
                {"index", i},
                {"bytes", allocated_bytes(disk)},
                {"elapsed_s", since(t0)}});
  });
  ScopeGuard stop_poller([&] {
    {
      std::lock_guard lock(mu);
      done = true;
    }
    cv.notify_all();
    poller.join();
  });

  for (const auto& f : step.files) {
    std::string parent = fs::path(f.guest_path).parent_path().string();
    if (!parent.empty() && parent != "/") r.engine.make_dir(sb.id, parent, true);
    bool sent = false;
    r.engine.write_file(sb.id, f.guest_path, f.mode, [&]() -> std::optional<std::string> {
      if (sent) return std::nullopt;
      sent = true;
      return f.file->data;
    });
    r.events.check();
  }
  std::string tail;
  auto exec = [&](const std::string& cmd, int timeout_s, bool show) {
    engine::ExecRequest req;
    req.cmd = cmd;
    // Steps run as root from / whatever the base image's exec defaults say.
    req.user = "root";
    req.cwd = "/";
    req.timeout_s = timeout_s;
    return r.engine.exec(
        sb.id, req,
        {.on_start = {}, .on_output = [&](int, std::string_view b) {
           tail.append(b);
           if (tail.size() > 8192) tail.erase(0, tail.size() - 8192);
           if (show) r.events({{"type", "output"}, {"index", i}, {"data", utf8(std::string(b))}});
           return !r.events.gone();
         }});
  };
  if (!step.script.empty()) {
    engine::ExecResult res = exec(step.script, step.timeout_s, true);
    r.events.check();
    if (res.exit_code != std::optional<int>(0)) {
      std::string how = res.timed_out   ? "timed out after " + std::to_string(step.timeout_s) + " s"
                        : res.exit_code ? "failed with exit code " + std::to_string(*res.exit_code)
                                        : "ended (" + res.reason + ")";
      throw Error(Errc::invalid_argument,
                  "step " + std::to_string(i + 1) + "/" + std::to_string(count) + " (" +
                      step.title + ") " + how + "; its output ended with:\n" + utf8(tail),
                  field);
    }
  }
  tail.clear();
  engine::ExecResult fr = exec(kFreeze, 120, false);
  if (fr.exit_code != std::optional<int>(0))
    throw Error(Errc::internal, "could not sync the build sandbox's disk: " + utf8(tail));
  // Keep the overlay: a hard link when the data and image dirs share a
  // filesystem, else a sparse copy (the backing path inside is absolute).
  fs::path tmp = layer.string() + ".tmp-" + sb.id;
  ScopeGuard drop_tmp([&] {
    std::error_code ec;
    fs::remove(tmp, ec);
  });
  if (::link(disk.c_str(), tmp.c_str()) != 0)
    run_checked({"cp", "--sparse=always", disk.string(), tmp.string()}, minutes_timeout(10));
  drop.fire();  // the sandbox goes now; its overlay lives on as the layer
  ::chown(tmp.c_str(), 0, 0);
  fs::permissions(tmp, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  fs::rename(tmp, layer);
  drop_tmp.dismiss();
  r.events({{"type", "step_done"},
            {"index", i},
            {"bytes", allocated_bytes(layer)},
            {"elapsed_s", since(t0)}});
}

std::string step_field(const Recipe& recipe, const std::vector<Step>& steps, size_t i) {
  // Copies and runs are counted among their kind: copy[k] / run[k].
  size_t k = 0;
  for (size_t j = 0; j < i; ++j) k += steps[j].kind == steps[i].kind;
  const std::string& kind = steps[i].kind;
  if (kind == "copy" || kind == "run") return kind + "[" + std::to_string(k) + "]";
  if (kind == "config") return recipe.user.empty() ? "workdir" : "user";
  return kind;
}

}  // namespace

json build(engine::SandboxService& engine, const fs::path& image_dir, const BuildRequest& req,
           const EventFn& on_event) {
  auto t0 = Clock::now();
  storage::LayerCacheUse hold_layers;
  storage::check_image_name(req.name, "name");
  auto builtin = engine.images().recipes();
  if (std::find(builtin.begin(), builtin.end(), req.name) != builtin.end())
    throw Error(Errc::conflict, "'" + req.name + "' is a built-in image; choose another name",
                "name");
  Recipe recipe =
      parse_recipe(req.recipe, req.source_name.empty() ? "recipe" : req.source_name, req.args);
  for (size_t i = 0; i < req.files.size(); ++i) {
    std::string field = "files[" + std::to_string(i) + "].path";
    if (normalize_relative(req.files[i].path, field) != req.files[i].path)
      throw Error(Errc::invalid_argument,
                  field + " '" + req.files[i].path + "' is not a normalised relative path", field);
  }
  if (recipe.base == req.name)
    throw Error(Errc::invalid_argument, "a recipe cannot use the image it builds as its base",
                "base");
  // The base: a built image, or a built-in one built now.
  std::optional<storage::Image> base;
  try {
    base = engine.images().find(recipe.base);
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
  }
  bool is_builtin = std::find(builtin.begin(), builtin.end(), recipe.base) != builtin.end();
  if (!base && !is_builtin)
    throw Error(Errc::invalid_argument, "base image '" + recipe.base + "' does not exist", "base");
  std::vector<Step> steps;
  Events events(on_event);
  if (!base) {
    events({{"type", "base"}, {"name", recipe.base}, {"building", true}});
    base = engine.images().build(recipe.base);
  }
  steps = plan_steps(recipe, base->key, req.files);
  // The jail follows a qcow2 chain 16 files deep (vmm/jail.cc): the base,
  // the layers and the running step's own overlay.
  if (steps.size() > kMaxSteps)
    throw Error(Errc::invalid_argument,
                "the recipe makes " + std::to_string(steps.size()) + " steps; at most " +
                    std::to_string(kMaxSteps) +
                    " (join [[run]] commands, or build an image and use it as the base of another)",
                "run");
  std::string key = image_key(recipe, base->key, steps);
  events({{"type", "plan"}, {"steps", steps.size()}, {"base", base->name}, {"key", key}});
  events.check();

  fs::path layers = storage::layer_dir(image_dir);
  std::error_code ec;
  fs::create_directories(layers, ec);
  fs::permissions(layers,
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                      fs::perms::others_read | fs::perms::others_exec,
                  ec);
  StepRun run{engine, *base, recipe, events};
  fs::path prev = base->rootfs;
  int cached = 0, built = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    fs::path layer = layers / (s.key + ".qcow2");
    bool hit = fs::is_regular_file(layer, ec);
    events({{"type", "step"},
            {"index", i},
            {"count", steps.size()},
            {"kind", s.kind},
            {"title", s.title},
            {"key", s.key},
            {"cached", hit}});
    events.check();
    if (hit) {
      ++cached;
    } else {
      run_step(run, s, i, steps.size(), prev, layer, step_field(recipe, steps, i));
      ++built;
    }
    prev = layer;
  }
  storage::Image img =
      install_image(engine, image_dir, req.name, *base, prev, recipe, key,
                    static_cast<int>(steps.size()) + 1, req.source_name, [&](uint64_t bytes) {
                      events({{"type", "flatten"}, {"bytes", bytes}});
                    });
  return {{"image", image_json(img)}, {"key", key},     {"steps", steps.size()},
          {"cached", cached},         {"built", built}, {"elapsed_s", since(t0)}};
}

}  // namespace airlock::recipes
