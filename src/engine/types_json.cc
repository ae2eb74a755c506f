#include "engine/types_json.h"

#include "common/error.h"

namespace airlock::engine {

const char* to_string(State state) {
  switch (state) {
    case State::starting:
      return "starting";
    case State::running:
      return "running";
    case State::pausing:
      return "pausing";
    case State::paused:
      return "paused";
    case State::snapshotting:
      return "snapshotting";
    case State::stopping:
      return "stopping";
    case State::deleted:
      return "deleted";
    case State::timed_out:
      return "timed_out";
    case State::failed:
      return "failed";
  }
  return "unknown";
}

State state_from_string(std::string_view name) {
  for (State s :
       {State::starting, State::running, State::pausing, State::paused, State::snapshotting,
        State::stopping, State::deleted, State::timed_out, State::failed}) {
    if (name == to_string(s)) return s;
  }
  throw Error(Errc::internal, "unknown sandbox state '" + std::string(name) + "' in registry");
}

bool holds_resources(State state) {
  switch (state) {
    case State::starting:
    case State::running:
    case State::pausing:
    case State::paused:
    case State::snapshotting:
    case State::stopping:
      return true;
    case State::deleted:
    case State::timed_out:
    case State::failed:
      return false;
  }
  return false;
}

bool is_terminal(State state) { return !holds_resources(state); }

nlohmann::json spec_to_json(const SandboxSpec& spec) {
  nlohmann::json j = {{"image", spec.image},
                      {"cpus", spec.cpus},
                      {"memory_mb", spec.memory_mb},
                      {"disk_mb", spec.disk_mb},
                      {"timeout", spec.timeout_s},
                      {"env", spec.env},
                      {"metadata", spec.metadata},
                      {"network", spec.network},
                      {"idle_timeout", spec.idle_timeout_s}};
  if (!spec.tenant.empty()) j["tenant"] = spec.tenant;
  if (!spec.from.empty()) j["from"] = spec.from;
  if (spec.on_idle != "destroy") j["on_idle"] = spec.on_idle;
  return j;
}

SandboxSpec spec_from_json(const nlohmann::json& j) {
  SandboxSpec spec;
  if (!j.is_object()) throw Error(Errc::internal, "stored sandbox spec is not a JSON object");
  try {
    spec.image = j.value("image", spec.image);
    spec.cpus = j.value("cpus", spec.cpus);
    spec.memory_mb = j.value("memory_mb", spec.memory_mb);
    spec.disk_mb = j.value("disk_mb", spec.disk_mb);
    spec.timeout_s = j.value("timeout", spec.timeout_s);
    spec.idle_timeout_s = j.value("idle_timeout", spec.idle_timeout_s);
    spec.tenant = j.value("tenant", spec.tenant);
    spec.from = j.value("from", spec.from);
    spec.on_idle = j.value("on_idle", spec.on_idle);
    if (j.contains("env")) spec.env = j.at("env").get<std::map<std::string, std::string>>();
    if (j.contains("network") && j.at("network").is_object()) spec.network = j.at("network");
    if (j.contains("metadata"))
      spec.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::internal, std::string("stored sandbox spec is malformed: ") + e.what());
  }
  return spec;
}

nlohmann::json to_json(const SandboxInfo& info) {
  nlohmann::json j = spec_to_json(info.spec);
  j["id"] = info.id;
  j["state"] = to_string(info.state);
  if (!info.reason.empty()) j["reason"] = info.reason;
  // Always present so clients can test it without a key check: "" unless failed.
  j["failure"] = info.failure;
  j["accel"] = info.accel;
  // The isolation boundary the API promises: TCG is not a security boundary
  // by itself, so callers are told which one they got.
  j["isolation"] = info.accel;
  j["start"] = info.start;
  j["created_at_ms"] = info.created_at_ms;
  j["expires_at_ms"] = info.expires_at_ms;
  j["boot_ms"] = info.boot_ms;
  if (info.pid > 0) j["pid"] = info.pid;
  return j;
}

nlohmann::json to_json(const ExecResult& r) {
  nlohmann::json j{{"exec_id", r.exec_id},
                   {"exit_code", nullptr},
                   {"signal", nullptr},
                   {"timed_out", r.timed_out},
                   {"duration_ms", r.duration_ms},
                   {"stdin_bytes", r.stdin_bytes},
                   {"stdout_bytes", r.stdout_bytes},
                   {"stderr_bytes", r.stderr_bytes}};
  if (r.exit_code) j["exit_code"] = *r.exit_code;
  if (r.signal) j["signal"] = *r.signal;
  j["reason"] = r.reason;
  j["truncated"] = r.truncated;
  j["stdout_dropped"] = r.stdout_dropped;
  j["stderr_dropped"] = r.stderr_dropped;
  return j;
}

nlohmann::json to_json(const ExecStatus& s) {
  nlohmann::json j{{"exec_id", s.exec_id}, {"argv", s.argv},
                   {"pid", s.pid},         {"background", true},
                   {"running", s.running}, {"started_at_ms", s.started_at_ms}};
  if (!s.running) {
    j["exit_code"] = s.result.exit_code ? nlohmann::json(*s.result.exit_code) : nullptr;
    j["signal"] = s.result.signal ? nlohmann::json(*s.result.signal) : nullptr;
    j["reason"] = s.result.reason;
    j["timed_out"] = s.result.timed_out;
    j["duration_ms"] = s.result.duration_ms;
  }
  return j;
}

}  // namespace airlock::engine
