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
  std::string tenant;    // "" = the operator (unix socket): every tenant
  std::string token_id;  // the token's public id, for the audit log; "" = unix socket

  bool is_operator() const { return tenant.empty(); }
  // May this principal see an object owned by `owner` ("" = the operator's)?
  bool can_see(const std::string& owner) const { return is_operator() || owner == tenant; }
};

}  // namespace airlock::daemon
