#include "engine/net/host/control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "common/error.h"

namespace airlock::engine::nethost {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr auto kControlTimeout = std::chrono::seconds(5);

nlohmann::json request(const fs::path& run_dir, const nlohmann::json& request) {
  fs::path path = run_dir / "net-ctl.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_errno("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(Errc::unavailable, "the sandbox's network helper is not reachable: " +
                                       std::string(std::strerror(err)));
  }
  std::string msg = request.dump() + "\n";
  size_t done = 0;
  while (done < msg.size()) {
    ssize_t n = ::send(fd, msg.data() + done, msg.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw Error(Errc::unavailable, "the network helper closed its control socket");
    }
    done += static_cast<size_t>(n);
  }
  std::string reply;
  auto deadline = SteadyClock::now() + kControlTimeout;
  while (reply.find('\n') == std::string::npos) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    pollfd p{fd, POLLIN, 0};
    int rc = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      ::close(fd);
      throw Error(Errc::timeout, "the network helper did not answer within 5 s");
    }
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      ::close(fd);
      throw Error(Errc::unavailable, "the network helper closed its control socket");
    }
    reply.append(buf, static_cast<size_t>(n));
    if (reply.size() > (1 << 20)) break;
  }
  ::close(fd);
  try {
    return nlohmann::json::parse(reply.substr(0, reply.find('\n')));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::internal, std::string("the network helper's reply is not JSON: ") + e.what());
  }
}

// The helper's error reply as an Error with the same code and field.
[[noreturn]] void throw_helper_error(const nlohmann::json& e, const std::string& fallback) {
  std::string code = e.value("code", "internal");
  Errc c = Errc::internal;
  for (Errc x : {Errc::invalid_argument, Errc::not_found, Errc::conflict, Errc::unavailable})
    if (code == to_string(x)) c = x;
  throw Error(c, e.value("message", fallback), e.value("field", std::string()));
}

}  // namespace

nlohmann::json Control::call(const nlohmann::json& req) {
  nlohmann::json reply = request(run_dir_, req);
  if (reply.contains("error")) throw_helper_error(reply["error"], "the network helper refused");
  return reply;
}

uint64_t Control::set_policy(const nlohmann::json& normal) {
  nlohmann::json reply = request(run_dir_, {{"policy", normal}});
  if (reply.contains("error")) {
    const auto& e = reply["error"];
    std::string code = e.value("code", "internal");
    throw Error(code == "invalid_argument" ? Errc::invalid_argument : Errc::internal,
                e.value("message", std::string("the network helper refused the policy")),
                e.value("field", std::string()));
  }
  auto cut = reply.find("flows_cut");
  return cut != reply.end() && cut->is_number_unsigned() ? cut->get<uint64_t>() : 0;
}

int Control::add_port(int guest_port, int host_port) {
  nlohmann::json reply =
      call({{"port_add", {{"guest_port", guest_port}, {"host_port", host_port}}}});
  auto port = reply.find("host_port");
  if (port == reply.end() || !port->is_number_integer() || *port < 1024 || *port > 65535)
    throw Error(Errc::internal, "the network helper's port_add reply has no valid host_port");
  return port->get<int>();
}

nlohmann::json Control::ports() {
  return call({{"ports", true}}).value("ports", nlohmann::json::array());
}

PortRemoved Control::remove_port(int host_port) {
  nlohmann::json reply = call({{"port_remove", {{"host_port", host_port}}}});
  PortRemoved out;
  if (auto g = reply.find("guest_port"); g != reply.end() && g->is_number_unsigned() && *g <= 65535)
    out.guest_port = g->get<uint64_t>();
  if (auto c = reply.find("flows_cut"); c != reply.end() && c->is_number_unsigned())
    out.flows_cut = c->get<uint64_t>();
  return out;
}

}  // namespace airlock::engine::nethost
