#include "daemon/router.h"

namespace airlock::daemon {
namespace {

std::vector<std::string_view> split(std::string_view path) {
  std::vector<std::string_view> parts;
  if (path.empty() || path[0] != '/') return parts;
  path.remove_prefix(1);
  while (true) {
    auto slash = path.find('/');
    parts.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

// Matches path segments against a template; fills {id} / {exec_id}.
bool match_template(const std::vector<std::string_view>& segs, std::string_view tmpl,
                    RouteMatch& out) {
  auto t = split(tmpl);
  if (t.size() != segs.size()) return false;
  RouteMatch m;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == "{id}" || t[i] == "{exec_id}") {
      if (segs[i].empty()) return false;
      (t[i] == "{id}" ? m.id : m.exec_id) = std::string(segs[i]);
    } else if (t[i] == "{host_port}") {
      if (segs[i].empty()) return false;
      m.host_port = std::string(segs[i]);
    } else if (t[i] != segs[i]) {
      return false;
    }
  }
  out.id = std::move(m.id);
  out.exec_id = std::move(m.exec_id);
  out.host_port = std::move(m.host_port);
  return true;
}

}  // namespace

const char* to_string(Access a) {
  switch (a) {
    case Access::anyone:
      return "anyone";
    case Access::operator_only:
      return "operator";
    case Access::tenant:
      return "tenant";
    case Access::own_sandbox:
      return "own_sandbox";
    case Access::own_snapshot:
      return "own_snapshot";
  }
  return "operator";
}

RouteMatch match_route(std::string_view method, std::string_view path) {
  auto segs = split(path);
  RouteMatch result;
  // A template without parameters that matches the path wins over the
  // parameterised ones (POST /v1/images/build is not image "build"; a GET
  // there is a 405, not GET /v1/images/{id}).
  bool literal = false;
  for (const auto& spec : routes()) {
    RouteMatch m;
    if (std::string_view(spec.path).find('{') == std::string::npos &&
        match_template(segs, spec.path, m))
      literal = true;
  }
  for (const auto& spec : routes()) {
    RouteMatch m;
    if (literal && std::string_view(spec.path).find('{') != std::string::npos) continue;
    if (!match_template(segs, spec.path, m)) continue;
    if (method == spec.method) {
      m.status = RouteStatus::ok;
      m.spec = &spec;
      return m;
    }
    result.status = RouteStatus::method_not_allowed;
    if (!result.allow.empty()) result.allow += ", ";
    result.allow += spec.method;
  }
  return result;
}

std::string route_template(std::string_view method, std::string_view path) {
  auto segs = split(path);
  for (const auto& spec : routes()) {
    RouteMatch m;
    if (spec.method == method && match_template(segs, spec.path, m)) return spec.path;
  }
  return "unmatched";
}

}  // namespace airlock::daemon
