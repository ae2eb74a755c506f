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
// allowed (gid = uid, home "/"); an unknown name returns nullopt. Every exec
// asks (root, most often), and reading and splitting both files is ~0.45 ms
// of an exec of `true` under TCG, so answers are remembered while both
// files keep their identity (device, inode, size, mtime, ctime: an edit in
// place or a replacement by rename, as useradd does, changes it; a rewrite
// to the same size within one timestamp tick, a few ms on kernels without
// multigrain timestamps, is the one change it can miss).
std::optional<User> lookup_user(const std::string& spec, const std::string& passwd = "/etc/passwd",
                                const std::string& group = "/etc/group");

// The name of a uid (passwd) or gid (group) for listings; the decimal id
// when there is no entry, as `ls -l` shows it.
std::string user_name(uid_t uid, const std::string& passwd = "/etc/passwd");
std::string group_name(gid_t gid, const std::string& group = "/etc/group");

}  // namespace airlock::guest
