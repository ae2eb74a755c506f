// The services of airlock's envd, one registration call per service (each
// in its own file), so adding one touches only this list.
#include "e2b/envd.h"
#include "e2b/envd_fs.h"
#include "e2b/process.h"

namespace airlock::e2b {

std::shared_ptr<Envd> make_envd(std::shared_ptr<const AccessTokens> tokens, bool allow_insecure) {
  auto envd = std::make_shared<Envd>(std::move(tokens), allow_insecure);
  register_process(*envd);
  register_filesystem(*envd);
  return envd;
}

}  // namespace airlock::e2b
