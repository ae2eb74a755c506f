// The daemon's intake of a network helper's event reports (docs/network.md
// "Events"). The helper is exposed to the guest (it parses the guest's
// frames and runs libslirp), so it is treated as untrusted: it only REPORTS;
// this class decides what reaches the sandbox's audit journal.
//
// Input: the bytes of the helper's event stream, JSON objects one per line:
//   {"event":"net_dns","name":"a.example","qtype":"A","allowed":true,"rule":"allow a.example",
//    "rcode":"NOERROR","answers":["203.0.113.7"]}
//   {"event":"net_flow","proto":"tcp","dst":"203.0.113.7","src_port":40000,"port":443,
//    "name":"a.example","rule":"allow a.example (pinned)","allowed":true}
//   {"event":"net_flow_end", <net_flow's fields but allowed>, "bytes_out":1,"bytes_in":2,
//    "duration_ms":3,"reason":"fin"}
//   {"event":"net_suppressed","counts":{"net_dns":12}}   (what the helper itself held back)
// Each report is checked against a closed schema: a known event, only its
// known fields with their types and bounds (strings <= 1300 bytes, IPs that
// parse, ports 0..65535, at most 32 answers), nesting <= 4, a line <= 8 KiB.
// Anything else (another event name such as "exec", a "ts" or "sandbox"
// field, a wrong type, an over-long line) is dropped and counted as
// `invalid`. Timestamps and the sandbox id are never the helper's: the
// caller appends each accepted record with its own (AuditJournal::append).
//
// Rate limit: a token bucket per kind (net_dns, net_dns_denied, net_flow,
// net_flow_denied, net_flow_end): `burst` records at once, `per_second`
// sustained. What a bucket refuses is counted, and a summary
//   {"event":"net_suppressed","count":N,"counts":{"net_dns":N1,...},
//    "helper_counts":{...},"invalid":K}
// is produced by tick() at most every `summary_every` while something was
// held back, and by flush() at the end; over any period the records plus
// the summaries' counts are exactly what the stream carried.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/audit/limiter.h"

namespace airlock::net {

struct IntakeConfig {
  double burst = 100;      // records per kind at once
  double per_second = 10;  // sustained records per kind
  std::chrono::seconds summary_every{10};
  size_t max_line = 8192;
};

class EventIntake {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  struct Record {
    std::string event;
    nlohmann::json fields;  // an object, without ts/sandbox/event
  };

  explicit EventIntake(
      IntakeConfig config = {}, Clock clock = [] { return std::chrono::steady_clock::now(); });

  // Bytes from the stream (any split); the records to append, in order.
  std::vector<Record> feed(std::string_view bytes);
  // The net_suppressed summary if one is due; call about once a second.
  std::vector<Record> tick();
  // The summary of whatever is still uncounted (end of the stream).
  std::vector<Record> flush();

  // Totals since construction (for logs and tests).
  uint64_t accepted() const { return accepted_; }
  uint64_t invalid() const { return invalid_total_; }

 private:
  void line(std::string_view text, std::vector<Record>& out);
  std::vector<Record> summary();

  IntakeConfig config_;
  Clock clock_;
  std::string partial_;
  bool skipping_ = false;  // inside an over-long line: drop up to its newline
  engine::EventLimiter limiter_;  // per kind; counts what it suppresses
  std::map<std::string, uint64_t> helper_suppressed_;
  uint64_t invalid_ = 0, invalid_total_ = 0, accepted_ = 0;
  std::chrono::steady_clock::time_point last_summary_;
};

}  // namespace airlock::net
