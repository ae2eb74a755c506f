// /etc/passwd and /etc/group lookups without NSS (the agent is static).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace airlock::guest {

struct User {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string name = "root";
  std::string home = "/root";
  std::string shell = "/bin/sh";
  std::vector<gid_t> groups;  // supplementary groups from /etc/group
};

// `spec` is a user name or a decimal uid. A uid without a passwd entry is
// allowed (gid = uid, home "/"); an unknown name returns nullopt.
std::optional<User> lookup_user(const std::string& spec, const std::string& passwd = "/etc/passwd",
                                const std::string& group = "/etc/group");

// The name of a uid (passwd) or gid (group) for listings; the decimal id
// when there is no entry, as `ls -l` shows it.
std::string user_name(uid_t uid, const std::string& passwd = "/etc/passwd");
std::string group_name(gid_t gid, const std::string& group = "/etc/group");

}  // namespace airlock::guest
