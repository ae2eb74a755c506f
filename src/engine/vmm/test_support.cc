#include "engine/vmm/test_support.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>

#include "common/error.h"

namespace airlock::vmm::testing {

namespace fs = std::filesystem;

namespace {

std::string run(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw Error(Errc::internal, "popen failed: " + cmd);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int rc = ::pclose(p);
  if (rc != 0) throw Error(Errc::internal, "command failed (" + std::to_string(rc) + "): " + cmd);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

fs::path test_kernel() {
  static std::mutex mu;
  static fs::path cached;
  std::lock_guard lock(mu);
  if (!cached.empty()) return cached;
  if (const char* env = std::getenv("AIRLOCK_TEST_KERNEL"); env && *env) {
    cached = env;
  } else {
    cached = run(std::string("sh '") + AIRLOCK_VMM_SOURCE_DIR + "/testdata/fetch_kernel.sh' '" +
                 AIRLOCK_VMM_TEST_CACHE + "/kernels'");
  }
  if (!fs::is_regular_file(cached))
    throw Error(Errc::not_found, "test kernel not found: " + cached.string());
  return cached;
}

fs::path test_initramfs(const std::string& script) {
  std::string init =
      "#!/bin/busybox sh\n"
      "/bin/busybox --install -s /bin\n"
      "export PATH=/bin\n"
      "mount -t proc proc /proc\n" +
      script + "\n";
  fs::path out = fs::temp_directory_path() /
                 ("airlock-vmm-initrd-" + std::to_string(std::hash<std::string>{}(init)) + ".gz");
  if (fs::exists(out)) return out;
  fs::path dir = make_temp_dir("airlock-initrd");
  fs::create_directories(dir / "bin");
  fs::create_directories(dir / "proc");
  fs::copy_file("/bin/busybox", dir / "bin/busybox");
  {
    std::ofstream f(dir / "init");
    f << init;
  }
  fs::permissions(dir / "init",
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  fs::path tmp = out.string() + ".tmp" + std::to_string(::getpid());
  run("cd '" + dir.string() + "' && find . | cpio -o -H newc 2>/dev/null | gzip -1 > '" +
      tmp.string() + "'");
  fs::rename(tmp, out);  // atomic: parallel tests may build the same image
  fs::remove_all(dir);
  return out;
}

fs::path test_disk(const fs::path& dir) {
  fs::path disk = dir / "disk.qcow2";
  run("qemu-img create -q -f qcow2 '" + disk.string() + "' 64M");
  return disk;
}

fs::path make_temp_dir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw_errno("mkdtemp " + tmpl);
  return tmpl;
}

}  // namespace airlock::vmm::testing
