// envd's filesystem pieces: the pure mappings (paths, EntryInfo, events,
// errors), and GET/POST /files through the real Server (unix socket) with
// the fake engine, whose files live in memory. The SDK test in tests/e2b
// drives the same code against real VMs.
#include "e2b/envd_fs.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "daemon/fake_service_test_support.h"
#include "daemon/request.h"
#include "daemon/server.h"
#include "e2b/envd_files.h"

namespace airlock::e2b {
namespace {

using nlohmann::json;

TEST(EnvdFs, PathsResolveAgainstTheUsersHome) {
  int asked = 0;
  auto home = [&] {
    ++asked;
    return std::string("/srv/alice");  // whatever the guest's passwd says
  };
  EXPECT_EQ(resolve_path("/etc/hosts", home), "/etc/hosts");
  EXPECT_EQ(asked, 0);  // an absolute path needs no home
  EXPECT_EQ(resolve_path("a/b.txt", home), "/srv/alice/a/b.txt");
  EXPECT_EQ(resolve_path("~/x", home), "/srv/alice/x");
  EXPECT_EQ(resolve_path("~", home), "/srv/alice");
  EXPECT_EQ(resolve_path("", home), "/srv/alice");
  EXPECT_EQ(resolve_path("../../../etc/./passwd", home), "/etc/passwd");
  EXPECT_THROW(resolve_path("~bob/x", home), FsError);
}

TEST(EnvdFs, EntriesAsEnvdAnswersThem) {
  json file = {{"name", "a.txt"}, {"path", "/home/user/a.txt"},
               {"type", "file"},  {"size", 12},
               {"mode", 0644},    {"mtime", 1718000000.25},
               {"uid", 1000},     {"gid", 1000},
               {"owner", "user"}, {"group", "user"}};
  json e = entry_info(file);
  EXPECT_EQ(e["type"], "FILE_TYPE_FILE");
  EXPECT_EQ(e["size"], "12");
  EXPECT_EQ(e["mode"], 0644);
  EXPECT_EQ(e["permissions"], "-rw-r--r--");
  EXPECT_EQ(e["owner"], "user");
  EXPECT_EQ(e["modifiedTime"], "2024-06-10T06:13:20.250Z");
  EXPECT_FALSE(e.contains("symlinkTarget"));
  json link = {
      {"name", "l"},        {"path", "/l"}, {"type", "symlink"},      {"size", 4},
      {"mode", 0777},       {"mtime", 0.0}, {"target", "/home/user"}, {"target_type", "dir"},
      {"target_mode", 0755}};
  e = entry_info(link);
  EXPECT_EQ(e["type"], "FILE_TYPE_DIRECTORY");  // envd types a link as its target
  EXPECT_EQ(e["mode"], 0755);
  EXPECT_EQ(e["permissions"], "Lrwxrwxrwx");
  EXPECT_EQ(e["symlinkTarget"], "/home/user");
  link.erase("target_type");
  EXPECT_EQ(entry_info(link)["type"], "FILE_TYPE_UNSPECIFIED");  // dangling
  EXPECT_EQ(permissions_string("dir", 01777), "dtrwxrwxrwx");
  EXPECT_EQ(permissions_string("file", 04755), "urwxr-xr-x");
}

TEST(EnvdFs, WatchEventsAreRelativeToTheWatchedDirectory) {
  auto ev = fs_events({{"type", "created"}, {"path", "/w/sub/a"}}, "/w");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0], json::parse(R"({"name":"sub/a","type":"EVENT_TYPE_CREATE"})"));
  ev = fs_events({{"type", "renamed"}, {"path", "/w/b"}, {"old_path", "/w/a"}}, "/w");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["type"], "EVENT_TYPE_RENAME");
  EXPECT_EQ(ev[0]["name"], "a");
  EXPECT_EQ(ev[1]["type"], "EVENT_TYPE_CREATE");
  EXPECT_EQ(fs_events({{"type", "modified"}, {"path", "/x"}}, "/")[0]["name"], "x");
  EXPECT_TRUE(fs_events({{"type", "overflow"}, {"dropped", 3}}, "/w").empty());
  // The guest's temp file of an upload is not shown; its rename is a create.
  EXPECT_TRUE(fs_events({{"type", "created"}, {"path", "/w/.a.txt.airlock-123"}}, "/w").empty());
  ev = fs_events({{"type", "renamed"}, {"path", "/w/a.txt"}, {"old_path", "/w/.a.txt.airlock-9"}},
                 "/w");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0], json::parse(R"({"name":"a.txt","type":"EVENT_TYPE_CREATE"})"));
}

TEST(EnvdFs, ErrorsMapToEnvdsCodes) {
  EXPECT_EQ(fs_error(Error(Errc::not_found, "x", "path")).code(), "not_found");
  EXPECT_EQ(fs_error(Error(Errc::not_found, "no user", "user")).code(), "unauthenticated");
  EXPECT_EQ(fs_error(Error(Errc::invalid_argument, "x")).code(), "invalid_argument");
  EXPECT_EQ(fs_error(Error(Errc::guest_error, "x")).code(), "internal");
  EXPECT_EQ(files_status(Error(Errc::not_found, "x", "path")), 404);
  EXPECT_EQ(files_status(Error(Errc::unavailable, "no space")), 507);
}

// Watchers hold a thread and a guest watch each: bounded, but per tenant,
// so one tenant holding all it may does not stop another's.
TEST(EnvdFs, TheWatcherCapIsPerTenant) {
  daemon::FakeSandboxService engine;
  Filesystem fs([](engine::SandboxService&, const std::string&, const std::string&, bool,
                   const engine::WatchCallbacks& cb) {
    cb.on_start(json::object());
    while (cb.on_idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return engine::WatchEnd{"cancelled"};
  });
  FsCall a1{engine, "sb-a1", "root", "acme"}, a2{engine, "sb-a2", "root", "acme"};
  FsCall b{engine, "sb-b", "root", "rival"}, op{engine, "sb-op", "root", ""};
  const json req = {{"path", "/tmp"}};
  std::string first;
  for (size_t i = 0; i < Filesystem::kMaxWatchersPerTenant; ++i) {
    json r = fs.unary(i % 2 ? a1 : a2, "CreateWatcher", req);
    if (i == 0) first = r["watcherId"];
  }
  // acme is at its cap, whichever of its sandboxes asks...
  for (const FsCall* c : {&a1, &a2}) {
    try {
      fs.unary(*c, "CreateWatcher", req);
      ADD_FAILURE() << "over the cap";
    } catch (const FsError& e) {
      EXPECT_EQ(e.code(), "resource_exhausted");
      EXPECT_NE(std::string(e.what()).find("per tenant"), std::string::npos) << e.what();
    }
  }
  // ... and the others are not.
  json mine = fs.unary(b, "CreateWatcher", req);
  EXPECT_EQ(fs.unary(b, "GetWatcherEvents", {{"watcherId", mine["watcherId"]}})["events"],
            json::array());
  EXPECT_NO_THROW(fs.unary(op, "CreateWatcher", req));
  // A removed watcher gives its tenant the room back.
  fs.unary(a2, "RemoveWatcher", {{"watcherId", first}});
  EXPECT_NO_THROW(fs.unary(a1, "CreateWatcher", req));
  fs.stop_all();
}

// GET/POST /files through a real Server; the test extension stands in for
// the envd router (sandbox from the E2b-Sandbox-Id header, user "user").
class EnvdFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-envdfs-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    server_ = std::make_unique<daemon::Server>(dir_ / "d.sock", daemon::ServerLimits{});
    server_->bind();
    server_->add_extension(
        "/files", [](engine::SandboxService& e, daemon::Exchange& ex, const daemon::Principal&) {
          std::string id(ex.request()["E2b-Sandbox-Id"]);
          if (ex.method() == "GET")
            files_get(e, ex, id, "user");
          else
            files_post(e, ex, id, "user");
        });
    engine_ = std::make_unique<daemon::FakeSandboxService>();
    thread_ = std::thread([this] { server_->run(*engine_); });
    engine::SandboxSpec spec;
    spec.image = "minimal";
    id_ = engine_->create(spec).id;
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  std::pair<int, std::string> call(const std::string& method, const std::string& target,
                                   const std::string& type = "", const std::string& body = "") {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, (dir_ / "d.sock").c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::string req = method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                      "E2b-Sandbox-Id: " + id_ + "\r\n";
    if (!type.empty()) req += "Content-Type: " + type + "\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, size_t(n));
    }
    ::close(fd);
    int status = std::stoi(out.substr(9, 3));
    std::string rest = out.substr(out.find("\r\n\r\n") + 4);
    if (out.find("chunked") != std::string::npos) {  // de-chunk
      std::string plain;
      size_t pos = 0;
      for (;;) {
        size_t eol = rest.find("\r\n", pos);
        size_t n = std::stoul(rest.substr(pos, eol - pos), nullptr, 16);
        if (n == 0) break;
        plain += rest.substr(eol + 2, n);
        pos = eol + 2 + n + 2;
      }
      rest = plain;
    }
    return {status, rest};
  }
  std::string read(const std::string& path) {
    std::string out;
    engine_->read_file(id_, path, [&](std::string_view b) {
      out += b;
      return true;
    });
    return out;
  }

  std::filesystem::path dir_;
  std::unique_ptr<daemon::Server> server_;
  std::unique_ptr<engine::SandboxService> engine_;
  std::thread thread_;
  std::string id_;
};

std::string multipart(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string b;
  for (auto& [name, content] : files)
    b += "--B0UND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" + name +
         "\"\r\nContent-Type: application/octet-stream\r\n\r\n" + content + "\r\n";
  return b + "--B0UND--\r\n";
}

TEST_F(EnvdFilesTest, MultipartUploadOfSeveralFilesThenDownload) {
  std::string binary(300000, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>(i * 13);
  auto [status, body] = call("POST", "/files", "multipart/form-data; boundary=B0UND",
                             multipart({{"/tmp/a.txt", "hello"}, {"rel/b.bin", binary}}));
  ASSERT_EQ(status, 200) << body;
  json written = json::parse(body);
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[0], json::parse(R"({"name":"a.txt","type":"file","path":"/tmp/a.txt"})"));
  EXPECT_EQ(written[1]["path"], "/home/user/rel/b.bin");
  EXPECT_EQ(read("/tmp/a.txt"), "hello");
  EXPECT_TRUE(read("/home/user/rel/b.bin") == binary);

  auto [gs, got] = call("GET", "/files?path=rel%2Fb.bin&username=user");
  EXPECT_EQ(gs, 200);
  EXPECT_TRUE(got == binary);
  // A single file with ?path= (what the SDK sends for files.write(path, data)).
  std::tie(status, body) =
      call("POST", "/files?path=%2Ftmp%2Fc&username=root", "multipart/form-data; boundary=B0UND",
           multipart({{"/tmp/c", "cc"}}));
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(read("/tmp/c"), "cc");
  std::tie(status, body) =
      call("POST", "/files?path=%2Ftmp%2Fraw", "application/octet-stream", "raw bytes");
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(read("/tmp/raw"), "raw bytes");
}

TEST_F(EnvdFilesTest, BadUploadsAndMissingFilesAreEnvdErrors) {
  auto expect = [&](int want, const std::string& method, const std::string& target,
                    const std::string& type, const std::string& body, const std::string& words) {
    auto [status, reply] = call(method, target, type, body);
    EXPECT_EQ(status, want) << reply;
    json j = json::parse(reply, nullptr, false);
    EXPECT_EQ(j.value("code", 0), want) << reply;
    EXPECT_NE(j.value("message", "").find(words), std::string::npos) << reply;
  };
  expect(404, "GET", "/files?path=%2Fnope", "", "", "no file");
  expect(400, "GET", "/files", "", "", "path");
  expect(400, "POST", "/files", "multipart/form-data; boundary=B0UND", "garbage", "no boundary");
  expect(400, "POST", "/files", "multipart/form-data; boundary=B0UND",
         "--B0UND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/x\"\r\n\r\nabc",
         "ends inside a part");
  expect(400, "POST", "/files", "multipart/form-data; boundary=B0UND",
         "--B0UND\r\n" + std::string(17000, 'h') + "\r\n\r\nx\r\n--B0UND--", "16 KiB");
  expect(400, "POST", "/files", "multipart/form-data; boundary=B0UND",
         multipart({{"/tmp/d", "1"}, {"/tmp/d", "2"}}), "same path");
  expect(400, "POST", "/files", "multipart/form-data", multipart({{"/tmp/d", "1"}}), "boundary");
  expect(400, "POST", "/files", "text/plain", "x", "unsupported content type");
  expect(400, "POST", "/files", "application/octet-stream", "x", "path");
  expect(400, "POST", "/files?path=~bob%2Fx", "application/octet-stream", "x", "home dir");
}

}  // namespace
}  // namespace airlock::e2b
