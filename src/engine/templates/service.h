// The templates room: the store of frozen guests clones start from
// (template_store.h), one build per template key at a time, and the sealed
// RAM copies clones map (docs/design.md, "Templates and clones"). Owns its
// locks; the lifecycle asks it for a create's template and its RAM.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/audit/journal.h"
#include "engine/engine.h"
#include "engine/launcher.h"
#include "engine/storage/image_store.h"
#include "engine/templates/template_store.h"
#include "engine/vmm/accel.h"
#include "engine/vmm/sealed_ram.h"

namespace airlock::templates {

class TemplateService {
 public:
  // `disk_roots`: where a disk's backing files may be (the VM's jail).
  // Templates are off (store() null) unless cfg.templates.
  TemplateService(const engine::Config& cfg, engine::Launcher& launcher,
                  engine::AuditJournal& journal,
                  std::function<std::vector<std::filesystem::path>()> disk_roots);

  // The store, or null if templates are off.
  TemplateStore* store() { return store_ ? &*store_ : nullptr; }
  const TemplateStore* store() const { return store_ ? &*store_ : nullptr; }

  // The template for a create's shape, built now if there is none (one boot
  // plus a save; creates of the same shape wait for the build and then
  // clone). Never throws: nullopt = cold boot. What happened
  // (template_invalid / template_built / template_failed) is appended to
  // sandbox `id`'s journal.
  std::optional<Template> for_create(const storage::Image& img, const engine::SandboxSpec& spec,
                                     vmm::Accel accel, const std::string& id);
  // The sealed copy of `tpl`'s RAM, made now if there is none for this
  // version of the file; Error as SealedRam::copy_of.
  std::shared_ptr<vmm::SealedRam> sealed_ram(const Template& tpl);

 private:
  Template build(const storage::Image& img, const Shape& shape, vmm::Accel accel,
                 const std::string& key);

  const engine::Config& cfg_;
  engine::Launcher& launcher_;
  engine::AuditJournal& journal_;
  std::function<std::vector<std::filesystem::path>()> disk_roots_;
  std::optional<TemplateStore> store_;
  // One build per key at a time.
  std::mutex build_mu_;
  std::map<std::string, std::shared_ptr<std::mutex>> building_;
  // Sealed memfd copies of template RAM files that clones map (one per
  // template and file version, made at its first clone in this daemon's
  // life). By RAM path: {ino:ctime:size stamp, copy}.
  std::mutex sealed_mu_;
  std::map<std::string, std::pair<std::string, std::shared_ptr<vmm::SealedRam>>> sealed_;
};

}  // namespace airlock::templates
