#include "engine/audit/chain.h"

#include <fcntl.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "common/error.h"

namespace airlock::engine {
namespace {

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

bool from_hex(std::string_view s, std::string& out) {
  if (s.size() % 2) return false;
  out.clear();
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); i += 2) {
    int a = nib(s[i]), b = nib(s[i + 1]);
    if (a < 0 || b < 0) return false;
    out.push_back(static_cast<char>(a * 16 + b));
  }
  return true;
}

struct PkeyCtx {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~PkeyCtx() { EVP_MD_CTX_free(ctx); }
};

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
    throw Error(Errc::internal, "SHA-256 unavailable");
}
Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }
Sha256::Sha256(Sha256&& o) noexcept : ctx_(o.ctx_) { o.ctx_ = nullptr; }
void Sha256::update(std::string_view bytes) {
  if (ctx_) EVP_DigestUpdate(ctx_, bytes.data(), bytes.size());
}
std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!ctx_ || EVP_DigestFinal_ex(ctx_, md, &n) != 1) throw Error(Errc::internal, "SHA-256 failed");
  return to_hex(md, n);
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex();
}

std::string genesis_hash(const std::string& sandbox) {
  return sha256_hex("airlock-journal-v1\n" + sandbox);
}

std::string head_message(const std::string& sandbox, uint64_t seq, const std::string& hash) {
  return "airlock-journal-head-v1\n" + sandbox + "\n" + std::to_string(seq) + "\n" + hash;
}

std::shared_ptr<HostKey> HostKey::load_or_create(const std::filesystem::path& pem) {
  int fd = ::open(pem.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
    if (!key) throw Error(Errc::internal, "cannot generate an Ed25519 journal key");
    std::shared_ptr<HostKey> out(new HostKey(key));
    int w = ::open(pem.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (w < 0) {
      if (errno == EEXIST) return load_or_create(pem);  // another daemon made it first
      throw_errno("create journal key " + pem.string());
    }
    FILE* f = ::fdopen(w, "w");
    if (!f) {
      ::close(w);
      throw_errno("open journal key " + pem.string());
    }
    bool ok = PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    ok = (std::fflush(f) == 0) && ok && ::fsync(w) == 0;
    std::fclose(f);
    if (!ok) {
      ::unlink(pem.c_str());
      throw Error(Errc::internal, "cannot write journal key " + pem.string());
    }
    return out;
  }
  if (fd < 0) throw_errno("open journal key " + pem.string());
  FILE* f = ::fdopen(fd, "r");
  if (!f) {
    ::close(fd);
    throw_errno("open journal key " + pem.string());
  }
  EVP_PKEY* key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (!key || EVP_PKEY_get_base_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    throw Error(Errc::internal, "journal key " + pem.string() + " is not an Ed25519 private key");
  }
  return std::shared_ptr<HostKey>(new HostKey(key));
}

HostKey::~HostKey() { EVP_PKEY_free(key_); }

std::string HostKey::sign_hex(std::string_view message) const {
  PkeyCtx c;
  unsigned char sig[64];
  size_t n = sizeof sig;
  if (!c.ctx || EVP_DigestSignInit(c.ctx, nullptr, nullptr, nullptr, key_) != 1 ||
      EVP_DigestSign(c.ctx, sig, &n, reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1)
    throw Error(Errc::internal, "Ed25519 signing failed");
  return to_hex(sig, n);
}

bool HostKey::verify_hex(std::string_view message, std::string_view signature_hex) const {
  std::string sig;
  if (!from_hex(signature_hex, sig) || sig.size() != 64) return false;
  PkeyCtx c;
  return c.ctx && EVP_DigestVerifyInit(c.ctx, nullptr, nullptr, nullptr, key_) == 1 &&
         EVP_DigestVerify(c.ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                          reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

std::string HostKey::public_key_hex() const {
  unsigned char pub[32];
  size_t n = sizeof pub;
  if (EVP_PKEY_get_raw_public_key(key_, pub, &n) != 1) return "";
  return to_hex(pub, n);
}

nlohmann::json VerifyReport::to_json() const {
  nlohmann::json j{{"ok", ok},
                   {"records", records},
                   {"legacy_records", legacy_records},
                   {"head", {{"seq", head.seq}, {"hash", head.hash}}},
                   {"unanchored", unanchored},
                   {"signed", signed_anchor},
                   {"signature_ok", signature_ok}};
  if (anchor)
    j["anchor"] = {{"seq", anchor->seq}, {"hash", anchor->hash}, {"bytes", anchor->bytes}};
  else
    j["anchor"] = nullptr;
  if (!public_key.empty()) j["public_key"] = public_key;
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& b : breaks) {
    nlohmann::json e{{"line", b.line}, {"kind", b.kind}, {"message", b.message}};
    e["seq"] = b.seq >= 0 ? nlohmann::json(b.seq) : nlohmann::json(nullptr);
    arr.push_back(std::move(e));
  }
  j["breaks"] = arr;
  j["first_break"] = arr.empty() ? nlohmann::json(nullptr) : arr[0];
  return j;
}

namespace {

struct Entry {
  uint64_t line;
  int64_t seq = -1;   // -1: no integer seq
  bool json = false;  // a JSON object
  std::string sandbox;
  std::string prev;
  std::string hash;
};

// The journal's lines as read (pass 1).
struct Lines {
  std::vector<Entry> es;
  std::map<int64_t, uint64_t> first_line_of;  // seq -> first line holding it
  uint64_t n = 0;                             // lines read
  bool torn = false;                          // the last line has no newline
};

void add_break(VerifyReport& rep, uint64_t line, int64_t seq, std::string kind, std::string msg) {
  rep.ok = false;
  if (rep.breaks.size() < VerifyReport::kMaxBreaks)
    rep.breaks.push_back({line, seq, std::move(kind), std::move(msg)});
}

// Pass 1: every line's seq, prev and hash (the canonical bytes: the line
// without its newline).
Lines read_lines(std::istream& in) {
  Lines ls;
  std::string line;
  while (std::getline(in, line)) {
    ++ls.n;
    if (in.eof()) ls.torn = true;  // no newline after the last line: a write cut short
    Entry e;
    e.line = ls.n;
    e.hash = sha256_hex(line);
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) {
      e.json = true;
      auto s = j.find("seq");
      if (s != j.end() && s->is_number_unsigned()) e.seq = s->get<int64_t>();
      auto p = j.find("prev");
      if (p != j.end() && p->is_string()) e.prev = p->get<std::string>();
      auto sb = j.find("sandbox");
      if (sb != j.end() && sb->is_string()) e.sandbox = sb->get<std::string>();
    }
    if (e.seq >= 0) ls.first_line_of.emplace(e.seq, ls.n);
    ls.es.push_back(std::move(e));
  }
  return ls;
}

// Pass 2: the chain from the first record with a seq, each break named.
// Returns the last record in it (nullptr: none).
const Entry* walk_chain(Lines& ls, const std::string& sandbox, VerifyReport& rep) {
  const std::vector<Entry>& es = ls.es;
  auto brk = [&](uint64_t line, int64_t seq, std::string kind, std::string msg) {
    add_break(rep, line, seq, std::move(kind), std::move(msg));
  };
  size_t i = 0;
  while (i < es.size() && es[i].seq < 0) ++i;
  rep.legacy_records = i;
  std::string prev_hash = i == 0 ? genesis_hash(sandbox) : es[i - 1].hash;
  int64_t expected = 1;
  std::set<int64_t> seen;
  const Entry* last = nullptr;
  for (; i < es.size(); ++i) {
    const Entry& e = es[i];
    std::string at = "line " + std::to_string(e.line);
    if (e.seq < 0) {
      brk(e.line, -1, e.json ? "inserted" : "not_a_record",
          at + (e.json ? " is a record without seq inside the chain: inserted"
                       : " is not a JSON record: edited or inserted"));
      prev_hash = e.hash;
      continue;
    }
    std::string here = at + " (seq " + std::to_string(e.seq) + ")";
    if (e.sandbox != sandbox)
      brk(e.line, e.seq, "wrong_sandbox", here + " belongs to sandbox '" + e.sandbox + "'");
    if (e.seq == expected) {
      if (e.prev != prev_hash) {
        const Entry* p = i > 0 ? &es[i - 1] : nullptr;
        if (p && p->seq == e.seq - 1)
          brk(p->line, p->seq, "edited",
              "line " + std::to_string(p->line) + " (seq " + std::to_string(p->seq) +
                  ") was edited: its SHA-256 is " + p->hash.substr(0, 16) + "..., but " + here +
                  " records prev " + e.prev.substr(0, 16) + "...");
        else
          brk(e.line, e.seq, "edited", here + " does not link to the record before it (prev)");
      }
      ++expected;
    } else if (e.seq > expected) {
      auto later = ls.first_line_of.find(expected);
      if (later != ls.first_line_of.end() && later->second > e.line)
        brk(e.line, e.seq, "reordered",
            here + " comes where seq " + std::to_string(expected) + " was expected (seq " +
                std::to_string(expected) + " is at line " + std::to_string(later->second) +
                "): records were reordered");
      else
        brk(e.line, e.seq, "deleted",
            e.seq - 1 == expected
                ? "record seq " + std::to_string(expected) + " is missing before " + here +
                      ": deleted"
                : "records seq " + std::to_string(expected) + ".." + std::to_string(e.seq - 1) +
                      " are missing before " + here + ": deleted");
      expected = e.seq + 1;
    } else if (seen.count(e.seq)) {
      brk(e.line, e.seq, "inserted",
          here + " repeats seq " + std::to_string(e.seq) + " of line " +
              std::to_string(ls.first_line_of[e.seq]) + ": a record was inserted");
    } else {
      brk(e.line, e.seq, "reordered",
          here + " comes after seq " + std::to_string(expected - 1) + ": records were reordered");
    }
    seen.insert(e.seq);
    prev_hash = e.hash;
    last = &e;
  }
  return last;
}

// The tail against the registry's anchored head, and its signature.
void check_anchor(const Lines& ls, const Entry* last, const JournalHead& anchor,
                  const std::string& sandbox, const HostKey* key, VerifyReport& rep) {
  auto brk = [&](uint64_t line, int64_t seq, std::string kind, std::string msg) {
    add_break(rep, line, seq, std::move(kind), std::move(msg));
  };
  // The anchored record must still be in the file, with the anchored hash.
  int64_t aseq = static_cast<int64_t>(anchor.seq);
  const Entry* anchored = nullptr;
  for (const auto& e : ls.es)
    if (e.seq == aseq && e.hash == anchor.hash) anchored = &e;
  if (!anchored) {
    auto it = ls.first_line_of.find(aseq);
    int64_t max_seq = ls.first_line_of.empty() ? 0 : ls.first_line_of.rbegin()->first;
    if (aseq > max_seq)
      brk(ls.n + (ls.torn ? 0 : 1), aseq, "truncated",
          "the file ends at seq " + std::to_string(max_seq) +
              " but the registry's anchor names seq " + std::to_string(aseq) + ": the last " +
              std::to_string(aseq - max_seq) + " record(s) were removed");
    else if (it != ls.first_line_of.end())
      brk(it->second, aseq, "edited",
          "line " + std::to_string(it->second) + " (seq " + std::to_string(aseq) +
              ") does not hash to the head anchored in the registry: edited");
    else
      brk(0, aseq, "anchor_mismatch",
          "the anchored record seq " + std::to_string(aseq) + " is not in the file");
  } else if (last && last->seq > aseq) {
    rep.unanchored = static_cast<uint64_t>(last->seq - aseq);
  }
  if (!anchor.signature.empty()) {
    rep.signed_anchor = true;
    if (key) {
      rep.signature_ok =
          key->verify_hex(head_message(sandbox, anchor.seq, anchor.hash), anchor.signature);
      if (!rep.signature_ok)
        brk(0, aseq, "bad_signature",
            "the anchored head's signature does not verify with the host key");
    }
  } else if (key) {
    brk(0, aseq, "bad_signature", "the anchored head is not signed, but this host signs heads");
  }
}

}  // namespace

VerifyReport verify_journal(const std::filesystem::path& path, const std::string& sandbox,
                            const std::optional<JournalHead>& anchor, const HostKey* key) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw Error(Errc::not_found, "no audit journal for sandbox " + sandbox, "id");
  ::close(fd);
  std::ifstream in(path, std::ios::binary);
  VerifyReport rep;
  rep.anchor = anchor;
  if (key) rep.public_key = key->public_key_hex();

  Lines ls = read_lines(in);
  rep.records = ls.n;
  if (ls.torn && !ls.es.empty() && !ls.es.back().json) {
    // A crash mid-append leaves a partial last line; the next append cuts it
    // off and records that (journal_torn_tail). Not evidence of tampering.
    ls.es.pop_back();
  }
  const Entry* last = walk_chain(ls, sandbox, rep);
  if (last) rep.head = {static_cast<uint64_t>(last->seq), last->hash, 0, {}};

  if (!anchor) {
    if (last)
      add_break(rep, 0, -1, "no_anchor",
                "the registry has no anchored head for this journal: its tail cannot be checked");
    return rep;
  }
  check_anchor(ls, last, *anchor, sandbox, key, rep);
  return rep;
}

}  // namespace airlock::engine
