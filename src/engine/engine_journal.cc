// The journal's chain verification and its whole-journal follower
// (GET .../journal/verify, GET .../events).
#include "engine/engine.h"
#include "engine/engine_impl.h"

namespace airlock::engine {

nlohmann::json Engine::verify_journal(const std::string& id) {
  // Unknown id and no journal are the same not_found (verify_journal).
  return impl_->journal.verify(id).to_json();
}

std::unique_ptr<RecordFollower> Engine::follow_journal(const std::string& id) {
  auto reader = std::make_unique<JournalReader>(impl_->journal.reader(id));
  if (!reader->exists() && !impl_->registry.get(id))
    throw Error(Errc::not_found, "no audit journal for sandbox " + id, "id");
  return reader;
}

}  // namespace airlock::engine
