#include "engine/validate.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace airlock::engine {
namespace {

// Runs `f`, expecting Error(invalid_argument) about `field`.
template <typename F>
void expect_bad(F f, const std::string& field) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error about " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

TEST(ValidateSpec, DefaultsAreValid) { EXPECT_NO_THROW(validate_spec(SandboxSpec{})); }

TEST(ValidateSpec, RangesNameTheirField) {
  auto with = [](auto mutate) {
    SandboxSpec s;
    mutate(s);
    return [s] { validate_spec(s); };
  };
  expect_bad(with([](SandboxSpec& s) { s.cpus = 0; }), "cpus");
  expect_bad(with([](SandboxSpec& s) { s.cpus = 17; }), "cpus");
  expect_bad(with([](SandboxSpec& s) { s.memory_mb = 63; }), "memory_mb");
  expect_bad(with([](SandboxSpec& s) { s.memory_mb = 65537; }), "memory_mb");
  expect_bad(with([](SandboxSpec& s) { s.disk_mb = -5; }), "disk_mb");
  expect_bad(with([](SandboxSpec& s) { s.disk_mb = 1048577; }), "disk_mb");
  expect_bad(with([](SandboxSpec& s) { s.timeout_s = 0; }), "timeout");
  expect_bad(with([](SandboxSpec& s) { s.timeout_s = 604801; }), "timeout");
  expect_bad(with([](SandboxSpec& s) { s.idle_timeout_s = -1; }), "idle_timeout");
  expect_bad(with([](SandboxSpec& s) { s.idle_timeout_s = 604801; }), "idle_timeout");
  EXPECT_NO_THROW(with([](SandboxSpec& s) { s.idle_timeout_s = 1; })());
  expect_bad(with([](SandboxSpec& s) { s.image = ""; }), "image");
  expect_bad(with([](SandboxSpec& s) { s.image = "../etc"; }), "image");
  expect_bad(with([](SandboxSpec& s) { s.image = "a/b"; }), "image");
  // One rule with the store: a name the store could never hold is refused here.
  expect_bad(with([](SandboxSpec& s) { s.image = "Foo.x"; }), "image");
  expect_bad(with([](SandboxSpec& s) { s.image = "Minimal"; }), "image");
  expect_bad(with([](SandboxSpec& s) { s.env[""] = "x"; }), "env");
  expect_bad(with([](SandboxSpec& s) { s.env["A=B"] = "x"; }), "env.A=B");
  expect_bad(with([](SandboxSpec& s) { s.metadata[""] = "x"; }), "metadata");
  expect_bad(with([](SandboxSpec& s) { s.metadata["k"] = std::string(2000, 'v'); }), "metadata.k");
  expect_bad(with([](SandboxSpec& s) {
               for (int i = 0; i < 200; ++i) s.metadata["k" + std::to_string(i)] = "v";
             }),
             "metadata");
  EXPECT_NO_THROW(validate_spec(SandboxSpec{.cpus = 16, .memory_mb = 65536, .timeout_s = 1}));
}

TEST(ValidateSpec, DiskMustHoldTheImage) {
  EXPECT_EQ(min_disk_mb(1), 1);
  EXPECT_EQ(min_disk_mb(1 << 20), 1);
  EXPECT_EQ(min_disk_mb((1 << 20) + 1), 2);
  SandboxSpec s{.disk_mb = 100};
  EXPECT_NO_THROW(validate_disk_fits(s, 100ull << 20));
  expect_bad([&] { validate_disk_fits(s, (100ull << 20) + 1); }, "disk_mb");
}

TEST(ValidateExec, ArgvXorCmd) {
  EXPECT_NO_THROW(validate_exec({.argv = {"true"}}));
  EXPECT_NO_THROW(validate_exec({.cmd = "true"}));
  expect_bad([] { validate_exec({}); }, "argv");
  expect_bad([] { validate_exec({.argv = {"a"}, .cmd = "b"}); }, "cmd");
  expect_bad([] { validate_exec({.argv = {""}}); }, "argv");
  expect_bad([] { validate_exec({.argv = {std::string("a\0b", 3)}}); }, "argv");
  expect_bad([] { validate_exec({.argv = {std::string(300000, 'a')}}); }, "argv");
}

TEST(ValidateExec, CwdEnvTimeoutUser) {
  expect_bad([] { validate_exec({.argv = {"x"}, .cwd = "relative"}); }, "cwd");
  expect_bad([] { validate_exec({.argv = {"x"}, .env = {{"A=", "1"}}}); }, "env.A=");
  expect_bad([] { validate_exec({.argv = {"x"}, .timeout_s = -1}); }, "timeout");
  expect_bad([] { validate_exec({.argv = {"x"}, .timeout_s = 1e9}); }, "timeout");
  expect_bad([] { validate_exec({.argv = {"x"}, .user = std::string(100, 'u')}); }, "user");
  EXPECT_NO_THROW(
      validate_exec({.argv = {"x"}, .env = {{"A", "1"}}, .cwd = "/tmp", .user = "nobody"}));
}

TEST(ValidateGuestPath, AbsoluteBoundedNoNul) {
  EXPECT_NO_THROW(validate_guest_path("/etc/hostname"));
  expect_bad([] { validate_guest_path(""); }, "path");
  expect_bad([] { validate_guest_path("etc"); }, "path");
  expect_bad([] { validate_guest_path(std::string("/a\0b", 4)); }, "path");
  expect_bad([] { validate_guest_path("/" + std::string(5000, 'a')); }, "path");
}

}  // namespace
}  // namespace airlock::engine
