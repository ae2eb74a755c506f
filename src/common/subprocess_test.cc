#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock {
namespace {

using namespace std::chrono_literals;

SubprocessOptions with_timeout(std::chrono::milliseconds t) {
  SubprocessOptions o;
  o.timeout = t;
  return o;
}

TEST(Subprocess, CapturesStdoutStderrAndExitCode) {
  auto r = run_command({"sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.term_signal, 0);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_NE(r.describe().find("exited with status 3"), std::string::npos);
  EXPECT_NE(r.describe().find("err"), std::string::npos);
}

TEST(Subprocess, ArgvIsNotInterpretedByAShell) {
  auto r = run_command({"printf", "%s|", "a b", "$HOME", "*"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.out, "a b|$HOME|*|");
}

TEST(Subprocess, BinarySafeOutput) {
  // All 256 byte values, through printf's octal escapes.
  std::string fmt;
  for (int i = 0; i < 256; ++i) {
    char b[8];
    std::snprintf(b, sizeof b, "\\%03o", i);
    fmt += b;
  }
  auto r = run_command({"printf", fmt});
  ASSERT_TRUE(r.ok()) << r.describe();
  ASSERT_EQ(r.out.size(), 256u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(static_cast<unsigned char>(r.out[i]), i);
}

TEST(Subprocess, MissingProgramIsNotFound) {
  try {
    run_command({"airlock-no-such-program-xyz"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("airlock-no-such-program-xyz"), std::string::npos);
  }
}

TEST(Subprocess, EmptyArgvIsInvalid) {
  try {
    run_command({});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.field(), "argv");
  }
}

TEST(Subprocess, TimeoutKillsTheWholeProcessGroup) {
  auto start = std::chrono::steady_clock::now();
  // The grandchild (sleep) keeps the pipes open; it must die too.
  auto r = run_command({"sh", "-c", "sleep 30 & sleep 30; echo never"}, with_timeout(300ms));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(took, 5s);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.describe().find("timed out"), std::string::npos);
}

TEST(Subprocess, ReturnsWhenChildExitsEvenIfGrandchildHoldsPipes) {
  auto start = std::chrono::steady_clock::now();
  auto r = run_command({"sh", "-c", "echo hi; sleep 3 & exit 0"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_EQ(r.out, "hi\n");
}

TEST(Subprocess, ReportsTerminatingSignal) {
  auto r = run_command({"sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.term_signal, SIGTERM);
  EXPECT_NE(r.describe().find("signal"), std::string::npos);
}

TEST(Subprocess, OutputIsBounded) {
  SubprocessOptions o;
  o.max_output = 1000;
  auto r = run_command({"sh", "-c", "head -c 100000 /dev/zero"}, o);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.out.size(), 1000u);
  EXPECT_TRUE(r.out_truncated);
  EXPECT_FALSE(r.err_truncated);
}

TEST(Subprocess, StreamsLinesToCallback) {
  std::vector<std::pair<OutputStream, std::string>> lines;
  SubprocessOptions o;
  o.on_line = [&](OutputStream s, std::string_view l) { lines.emplace_back(s, std::string(l)); };
  auto r = run_command({"sh", "-c", "echo one; echo two >&2; printf 'three'"}, o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(lines.size(), 3u);
  std::vector<std::string> out, err;
  for (auto& [s, l] : lines) (s == OutputStream::out ? out : err).push_back(l);
  EXPECT_EQ(out, (std::vector<std::string>{"one", "three"}));
  EXPECT_EQ(err, (std::vector<std::string>{"two"}));
}

TEST(Subprocess, StdinEnvAndCwd) {
  SubprocessOptions o;
  o.input = std::string(200000, 'x');  // larger than a pipe buffer
  o.env = {{"AIRLOCK_TEST_VAR", "v a l"}};
  o.cwd = "/tmp";
  auto r = run_command({"sh", "-c", "wc -c; echo \"$AIRLOCK_TEST_VAR\"; pwd"}, o);
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_EQ(r.out, "200000\nv a l\n/tmp\n");
}

TEST(Subprocess, ClearEnv) {
  SubprocessOptions o;
  o.clear_env = true;
  o.env = {{"PATH", "/usr/bin:/bin"}, {"ONLY", "1"}};
  auto r = run_command({"env"}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.out, "PATH=/usr/bin:/bin\nONLY=1\n");
}

// posix_spawnp would search the daemon's PATH; a PATH in options.env is
// searched instead, in its order, for a program named without a '/'.
TEST(Subprocess, PathInOptionsEnvFindsTheProgram) {
  char tmpl[] = "/tmp/airlock-subprocess-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::string tool = dir + "/airlock-only-here";
  FILE* f = std::fopen(tool.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("#!/bin/sh\necho found \"$0\"\n", f);
  std::fclose(f);
  ASSERT_EQ(::chmod(tool.c_str(), 0755), 0);

  EXPECT_THROW(run_command({"airlock-only-here"}), Error);  // not on our own PATH
  SubprocessOptions o;
  o.env = {{"PATH", dir + "/missing:" + dir + ":/usr/bin:/bin"}};
  auto r = run_command({"airlock-only-here"}, o);
  EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_EQ(r.out, "found " + tool + "\n");

  ::unlink(tool.c_str());
  ::rmdir(dir.c_str());
}

TEST(Subprocess, TickCallbackRunsAndCanAbort) {
  int ticks = 0;
  SubprocessOptions o;
  o.tick_interval = 20ms;
  o.on_tick = [&] {
    if (++ticks == 5) throw Error(Errc::internal, "stop");
  };
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_command({"sleep", "10"}, o), Error);
  EXPECT_EQ(ticks, 5);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Subprocess, RunCheckedThrowsNamingTheCommand) {
  try {
    run_checked({"sh", "-c", "echo broken >&2; exit 2"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::internal);
    std::string m = e.what();
    EXPECT_NE(m.find("`sh -c 'echo broken >&2; exit 2'`"), std::string::npos) << m;
    EXPECT_NE(m.find("broken"), std::string::npos) << m;
  }
  try {
    run_checked({"sleep", "5"}, with_timeout(50ms));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
}

TEST(Subprocess, DescribeKeepsOnlyTheTail) {
  auto r = run_command({"sh", "-c", "for i in $(seq 1 100); do echo line$i >&2; done; exit 1"});
  std::string d = r.describe();
  EXPECT_NE(d.find("line100"), std::string::npos);
  EXPECT_NE(d.find("line81"), std::string::npos);
  EXPECT_EQ(d.find("line80\n"), std::string::npos) << d;
}

}  // namespace
}  // namespace airlock
