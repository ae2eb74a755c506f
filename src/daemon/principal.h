// Who is asking (internal to airlockd): the tenant an authenticated request
// acts for. The unix socket is the operator's door (root and the airlock
// group): its requests carry the empty tenant and see every tenant's
// objects. A TCP request carries the tenant of the token it presented.
//
// A tenant's view of another tenant's object is "not found", never
// "forbidden": an id that exists must be indistinguishable from one that
// does not.
#pragma once

#include <string>

namespace airlock::daemon {

struct Principal {
  // operator: the unix socket, every tenant's objects. tenant: a TCP request
  // with a valid token. anonymous: a TCP request with no credential at all,
  // which only an extension that authenticates by other means (the E2B envd
  // surface: a sandbox's access token) may serve; it sees nothing.
  enum class Kind { operator_, tenant, anonymous };
  Kind kind = Kind::operator_;
  std::string tenant;    // for Kind::tenant
  std::string token_id;  // the token's public id, for the audit log; "" = none

  bool is_operator() const { return kind == Kind::operator_; }
  // May this principal see an object owned by `owner` ("" = the operator's)?
  bool can_see(const std::string& owner) const {
    return is_operator() || (kind == Kind::tenant && owner == tenant);
  }
  // The tenant a create by this principal belongs to ("" for the operator).
  const std::string& owner() const { return tenant; }
};

}  // namespace airlock::daemon
