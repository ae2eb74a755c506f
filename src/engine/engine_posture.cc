// Engine::posture: the jail of a sandbox's QEMU as it is, read back from
// /proc (not as it was meant to be), with the accelerator's caveat.
#include <algorithm>

#include "common/error.h"
#include "common/process.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/vmm/jail.h"
#include "engine/vmm/posture.h"

namespace airlock::engine {

namespace {

// A clone maps its template's RAM privately (share=off in its argv); that
// RAM must then be the write-sealed memfd (checked by the caller).
bool maps_template_ram(const std::vector<std::string>& argv) {
  return std::any_of(argv.begin(), argv.end(), [](const std::string& a) {
    return a.rfind("memory-backend-file,", 0) == 0 && a.find(",share=off") != std::string::npos;
  });
}

}  // namespace

nlohmann::json Engine::posture(const std::string& id) {
  auto sb = impl_->table.running(id);
  pid_t pid = sb->vm ? sb->vm->pid() : -1;
  nlohmann::json p;
  try {
    p = vmm::read_posture(pid);
  } catch (const Error&) {
    throw Error(Errc::conflict, "sandbox " + id + " has no running QEMU");
  }
  // Pid reuse: what was read must still be this sandbox's QEMU.
  if (!sb->vm->alive()) throw Error(Errc::conflict, "sandbox " + id + " has no running QEMU");
  const std::string accel = sb->rec.info.accel.empty() ? "tcg" : sb->rec.info.accel;
  nlohmann::json out{{"id", id}, {"isolation", accel}, {"jail", vmm::to_string(vmm::jail_mode())}};
  out["note"] =
      accel == "tcg"
          ? "TCG: QEMU's own security policy does not treat TCG as a security boundary; the "
            "jail below is what protects the host"
          : "KVM: the guest is isolated by hardware virtualisation; the jail below is the "
            "second layer around QEMU";
  auto missing = p["missing"];
  // A clone: its template RAM must be the write-sealed memfd, read back
  // from the QEMU process itself (vmm/sealed_ram.h).
  if (maps_template_ram(proc_cmdline(pid)) && !vmm::template_ram_sealed(pid, vmm::kInheritedFd))
    missing.push_back("template_ram_read_only");
  p.erase("missing");
  out["process"] = p;
  out["missing"] = missing;
  return out;
}

}  // namespace airlock::engine
