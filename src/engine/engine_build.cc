// Engine entry points for image recipes (src/recipes/builder.cc): a sandbox on a
// given image (a build layer), and the path of its disk.
#include "common/error.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/validate.h"

namespace airlock::engine {

SandboxInfo Engine::create_on_image(const SandboxSpec& spec, const storage::Image& image) {
  auto& impl = *impl_;
  validate_spec(spec);
  SandboxSpec checked = spec;
  checked.network = nethost::normalize(spec.network);
  validate_disk_fits(checked, image.rootfs_bytes);
  vmm::AccelVerdict accel = impl.resolve_accel(image);
  // launch() skips templates for a *.qcow2 rootfs (engine_templates.cc).
  return impl.launch(checked, image, accel, false)->info();
}

std::filesystem::path Engine::disk_path(const std::string& id) {
  // not_found / conflict unless running
  return impl_->table.running(id)->run_dir() / "disk.qcow2";
}

}  // namespace airlock::engine
