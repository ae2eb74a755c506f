#include "cli/image_cmd.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "cli/layout_tar.h"
#include "common/error.h"

namespace airlock::cli {
using json = nlohmann::json;

std::string human_size(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {

std::string when(int64_t unix_s) {
  std::time_t t = static_cast<std::time_t>(unix_s);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::gmtime(&t));
  return buf;
}

std::string age(int64_t s) {
  char buf[32];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%lldm", static_cast<long long>(s / 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh", static_cast<long long>(s / 3600));
  return buf;
}

// Restores the terminal's mode on every exit path of `top`.
class RawTerminal {
 public:
  RawTerminal() {
    if (::tcgetattr(0, &old_) != 0) return;
    termios raw = old_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = ::tcsetattr(0, TCSANOW, &raw) == 0;
    std::fputs("\033[?25l", stdout);  // hide the cursor
  }
  ~RawTerminal() {
    std::fputs("\033[?25h\n", stdout);
    std::fflush(stdout);
    if (active_) ::tcsetattr(0, TCSANOW, &old_);
  }

 private:
  termios old_{};
  bool active_ = false;
};

// One screen of `top`: sandboxes sorted by `sort`, CPU % from the change of
// cpu_seconds since the previous screen.
std::string top_screen(const json& list, std::map<std::string, double>& last_cpu, double dt,
                       const std::string& sort) {
  struct Row {
    std::string id, image, state;
    double cpu = 0;
    uint64_t mem = 0, disk = 0, rx = 0, tx = 0;
    int64_t age = 0;
  };
  std::vector<Row> rows;
  std::map<std::string, double> now_cpu;
  for (const auto& sb : list) {
    Row r;
    r.id = sb.value("id", "?");
    r.image = sb.contains("spec") ? sb["spec"].value("image", "") : sb.value("image", "");
    r.state = sb.value("state", "");
    json st = sb.value("stats", json::object());
    double cpu_s = st.value("cpu_seconds", 0.0);
    now_cpu[r.id] = cpu_s;
    if (last_cpu.count(r.id) && dt > 0) r.cpu = std::max(0.0, (cpu_s - last_cpu[r.id]) / dt * 100);
    r.mem = st.value("memory_bytes", uint64_t(0));
    r.disk = st.value("disk_bytes", uint64_t(0));
    r.rx = st.value("net_rx_bytes", uint64_t(0));
    r.tx = st.value("net_tx_bytes", uint64_t(0));
    r.age = st.value("age_s", int64_t(0));
    rows.push_back(r);
  }
  last_cpu = now_cpu;
  std::sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (sort == "mem") return a.mem > b.mem;
    if (sort == "disk") return a.disk > b.disk;
    if (sort == "net") return a.rx + a.tx > b.rx + b.tx;
    if (sort == "age") return a.age > b.age;
    if (sort == "id") return a.id < b.id;
    return a.cpu > b.cpu;
  });
  std::string out;
  char line[256];
  std::snprintf(
      line, sizeof line,
      "airlock top - %zu sandboxes - sort: %s  [c]pu [m]em [d]isk [n]et [a]ge [i]d [q]uit\n",
      rows.size(), sort.c_str());
  out += line;
  std::snprintf(line, sizeof line, "%-20s %-12s %-9s %6s %10s %10s %10s %10s %6s\n", "ID", "IMAGE",
                "STATE", "CPU%", "MEM", "DISK", "NET RX", "NET TX", "AGE");
  out += line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-20s %-12s %-9s %6.1f %10s %10s %10s %10s %6s\n",
                  r.id.substr(0, 20).c_str(), r.image.substr(0, 12).c_str(), r.state.c_str(), r.cpu,
                  human_size(r.mem).c_str(), human_size(r.disk).c_str(), human_size(r.rx).c_str(),
                  human_size(r.tx).c_str(), age(r.age).c_str());
    out += line;
  }
  return out;
}

int run_top(const ImageCommands& c, const std::function<client::Client()>& connect) {
  std::string sort = c.sort;
  std::map<std::string, double> last_cpu;
  auto prev = std::chrono::steady_clock::now();
  bool tty = ::isatty(0) && ::isatty(1) && !c.once;
  std::optional<RawTerminal> raw;
  if (tty) raw.emplace();
  for (;;) {
    json list = connect().call("GET", "/v1/sandboxes?stats=true");
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - prev).count();
    prev = now;
    std::string screen = top_screen(list, last_cpu, dt, sort);
    if (tty) std::fputs("\033[H\033[2J", stdout);
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
    if (!tty) return 0;
    // Wait for the next refresh, reacting to keys at once.
    auto until = now + std::chrono::milliseconds(static_cast<int>(c.interval * 1000));
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      until - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) break;
      pollfd p{0, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char k = 0;
      if (::read(0, &k, 1) != 1) return 0;
      if (k == 'q') return 0;
      std::string next = k == 'c'   ? "cpu"
                         : k == 'm' ? "mem"
                         : k == 'd' ? "disk"
                         : k == 'n' ? "net"
                         : k == 'a' ? "age"
                         : k == 'i' ? "id"
                                    : "";
      if (!next.empty()) {
        sort = next;
        break;  // redraw now
      }
    }
  }
}

}  // namespace

void add_image_commands(CLI::App& app, CLI::App& image, ImageCommands& c) {
  c.import = image.add_subcommand("import", "import a docker save / OCI image archive as an image");
  c.import->add_option("name", c.name, "image name")->required();
  c.import
      ->add_option("archive", c.file, "docker save tarball, OCI layout tar or OCI layout directory")
      ->required();
  c.import->add_flag("--replace", c.replace, "replace an existing image of that name");
  c.save = image.add_subcommand(
      "save", "make a snapshot's disk an image (install in a sandbox, snapshot, save)");
  c.save->add_option("snapshot", c.snapshot, "snapshot name")->required();
  c.save->add_option("name", c.name, "new image name")->required();
  c.ls = image.add_subcommand("ls", "list images: size, layers, created, used by");
  c.ls->add_flag("--json", c.json, "print JSON");
  c.rm = image.add_subcommand("rm", "remove an image nothing uses");
  c.rm->add_option("name", c.name, "image name")->required();
  c.inspect = image.add_subcommand("inspect", "an image's config and metadata (JSON)");
  c.inspect->add_option("name", c.name, "image name")->required();
  c.df = app.add_subcommand(
      "df", "disk used by images, layers, snapshots, templates, overlays, journals");
  c.df->add_flag("--json", c.json, "print JSON");
  c.prune =
      app.add_subcommand("prune", "free what nothing uses (old image versions, orphaned layers)");
  c.prune->add_flag("--dry-run", c.dry_run, "only say what would be freed");
  c.top = app.add_subcommand("top", "live view of the sandboxes: CPU, memory, disk, network, age");
  c.top->add_option("--sort", c.sort, "cpu|mem|disk|net|age|id (keys c m d n a i switch; q quits)")
      ->check(CLI::IsMember({"cpu", "mem", "disk", "net", "age", "id"}));
  c.top->add_option("--interval", c.interval, "seconds between refreshes")
      ->check(CLI::Range(0.2, 3600.0));
  c.top->add_flag("--once", c.once, "print one screen and exit");
}

bool run_image_command(const ImageCommands& c, const std::function<client::Client()>& connect) {
  if (c.import->parsed()) {
    std::string target = "/v1/images/" + c.name + "/import" + (c.replace ? "?replace=true" : "");
    auto start = std::chrono::steady_clock::now();
    json j;
    std::error_code ec;
    if (std::filesystem::is_directory(c.file, ec)) {
      // An OCI layout directory: streamed as a tar written on the fly.
      ::signal(SIGPIPE, SIG_IGN);  // the daemon may answer (refuse) before the end
      LayoutTar tar(c.file);
      try {
        j = connect().post_stream(target, tar.fd());
      } catch (...) {
        tar.finish();  // the layout's own error, if any, says more
        throw;
      }
      tar.finish();
    } else {
      int fd = ::open(c.file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw Error(Errc::not_found, "cannot open " + c.file, "archive");
      try {
        j = connect().post_stream(target, fd);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %d layers, %s, from %s, in %.1f s\n", j.value("name", "?").c_str(),
                j.value("layers", 0), human_size(j.value("size_bytes", uint64_t(0))).c_str(),
                j.value("source", "?").c_str(), s);
    return true;
  }
  if (c.save->parsed()) {
    auto start = std::chrono::steady_clock::now();
    json j =
        connect().call("POST", "/v1/snapshots/" + c.snapshot + "/image", json{{"name", c.name}});
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %s, from %s, in %.1f s\n", j.value("name", "?").c_str(),
                human_size(j.value("size_bytes", uint64_t(0))).c_str(),
                j.value("source", "?").c_str(), s);
    return true;
  }
  if (c.ls->parsed()) {
    json list = connect().call("GET", "/v1/images");
    if (c.json) {
      std::cout << list.dump(2) << "\n";
      return true;
    }
    std::printf("%-16s %-9s %10s %6s %-16s  %s\n", "NAME", "KIND", "SIZE", "LAYERS", "CREATED",
                "USED BY");
    for (const auto& i : list) {
      std::string users;
      for (const auto& u : i.value("used_by", json::array()))
        users += (users.empty() ? "" : ",") + u.get<std::string>();
      std::printf("%-16s %-9s %10s %6d %-16s  %s\n", i.value("name", "").c_str(),
                  i.value("kind", "").c_str(),
                  human_size(i.value("size_bytes", uint64_t(0))).c_str(), i.value("layers", 0),
                  when(i.value("created_at", int64_t(0))).c_str(),
                  users.empty() ? "-" : users.c_str());
    }
    return true;
  }
  if (c.rm->parsed()) {
    connect().call("DELETE", "/v1/images/" + c.name);
    std::printf("removed %s\n", c.name.c_str());
    return true;
  }
  if (c.inspect->parsed()) {
    std::cout << connect().call("GET", "/v1/images/" + c.name).dump(2) << "\n";
    return true;
  }
  if (c.df->parsed()) {
    json j = connect().call("GET", "/v1/df");
    if (c.json) {
      std::cout << j.dump(2) << "\n";
      return true;
    }
    std::printf("%-10s %10s\n", "WHAT", "SIZE");
    for (const char* k :
         {"images", "layers", "snapshots", "templates", "overlays", "journals", "total"})
      std::printf("%-10s %10s\n", k, human_size(j["bytes"].value(k, uint64_t(0))).c_str());
    return true;
  }
  if (c.prune->parsed()) {
    json j = connect().call("POST", std::string("/v1/prune") + (c.dry_run ? "?dry_run=true" : ""));
    for (const auto& r : j.value("removed", json::array()))
      std::printf("%s %s\n", c.dry_run ? "would remove" : "removed", r.get<std::string>().c_str());
    std::printf("%s %s\n", c.dry_run ? "would free" : "freed",
                human_size(j.value("freed_bytes", uint64_t(0))).c_str());
    if (j.contains("kept")) std::printf("kept %s\n", j["kept"].get<std::string>().c_str());
    return true;
  }
  if (c.top->parsed()) {
    run_top(c, connect);
    return true;
  }
  return false;
}

}  // namespace airlock::cli
