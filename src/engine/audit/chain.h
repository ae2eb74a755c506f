// The journal's hash chain (tamper evidence; docs/design.md "Tamper-evident
// journal").
//
// Canonical bytes: a record's hash is the SHA-256 of its exact line in the
// file, without the trailing newline. Every chained record carries
//   "seq":  1, 2, 3, ... (per sandbox, no gaps)
//   "prev": hex SHA-256 of the previous line; the first record's prev is
//           genesis_hash(sandbox), so a journal cannot be passed off as
//           another sandbox's.
// The head (seq, hash and the byte offset where the head's line ends) is
// anchored outside the file, in the registry (JournalAnchor), after a sync
// append or within the journal's anchor lag of a buffered one (journal.h),
// and signed with the host's Ed25519 key (HostKey) when there is one.
// Editing a line breaks the next line's prev; deleting, inserting or
// reordering lines breaks the seq sequence; cutting the tail leaves the file
// short of the anchor; rewriting the whole chain changes the head, which the
// signed anchor names.
//
//   VerifyReport r = verify_journal(path, "sb-1", anchor.load("sb-1"), &key);
//   if (!r.ok) std::cout << r.breaks[0].message;  // "line 7 (seq 7) was edited: ..."
#pragma once

#include <openssl/evp.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace airlock::engine {

// Incremental SHA-256 (OpenSSL EVP), for output hashed as it passes.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&& o) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view bytes);
  // Lower-case hex of the digest; the object is spent afterwards.
  std::string hex();

 private:
  EVP_MD_CTX* ctx_;
};

std::string sha256_hex(std::string_view bytes);

// The prev of a sandbox's first record.
std::string genesis_hash(const std::string& sandbox);

// The chain's head as anchored in the registry.
struct JournalHead {
  uint64_t seq = 0;
  std::string hash;       // of the line of record `seq`
  uint64_t bytes = 0;     // file offset just past that line's newline
  std::string signature;  // hex Ed25519 over head_message(), or "" (unsigned)
};

// Where heads are anchored (the registry implements it; tests keep them in
// memory). store() is called with the journal's per-sandbox lock held (by
// an append, or by the journal's anchoring thread for a buffered one), so a
// process's heads only move forward.
class JournalAnchor {
 public:
  virtual ~JournalAnchor() = default;
  virtual std::optional<JournalHead> load_head(const std::string& sandbox) = 0;
  virtual void store_head(const std::string& sandbox, const JournalHead& head) = 0;
};

// What a head signature covers.
std::string head_message(const std::string& sandbox, uint64_t seq, const std::string& hash);

// The host's Ed25519 key: a PEM file (PKCS#8), 0600, made on first use.
class HostKey {
 public:
  // Loads `pem`, or creates it (0600, O_EXCL, never through a symlink).
  // Error(internal) if it cannot be read, made, or is not an Ed25519 key.
  static std::shared_ptr<HostKey> load_or_create(const std::filesystem::path& pem);
  ~HostKey();
  HostKey(const HostKey&) = delete;
  HostKey& operator=(const HostKey&) = delete;

  std::string sign_hex(std::string_view message) const;
  bool verify_hex(std::string_view message, std::string_view signature_hex) const;
  std::string public_key_hex() const;  // the raw 32-byte public key

 private:
  explicit HostKey(EVP_PKEY* key) : key_(key) {}
  EVP_PKEY* key_;
};

// One broken link. kind: edited, deleted, inserted, reordered, not_a_record,
// wrong_sandbox, truncated (the file ends before the anchored head),
// anchor_mismatch, bad_signature.
struct ChainBreak {
  uint64_t line = 0;  // 1-based line in the file (0: about the file as a whole)
  int64_t seq = -1;   // the record's seq, -1 if none
  std::string kind;
  std::string message;
};

struct VerifyReport {
  bool ok = true;
  uint64_t records = 0;         // lines in the file
  uint64_t legacy_records = 0;  // lines before the first chained record (older versions)
  JournalHead head;             // the file's last record (signature unused)
  std::optional<JournalHead> anchor;
  bool signed_anchor = false;
  bool signature_ok = false;
  // Records after the anchored head: appended, then the daemon died before
  // anchoring them (the next append anchors them again). Not a break as long
  // as the anchored record itself is intact.
  uint64_t unanchored = 0;
  std::string public_key;          // hex, when verified with a key
  std::vector<ChainBreak> breaks;  // in file order, at most kMaxBreaks
  static constexpr size_t kMaxBreaks = 100;
  nlohmann::json to_json() const;
};

// Checks the chain of `path` (sandbox `sandbox`) and its anchor. Reads the
// file once; memory O(records) small entries. Error(not_found) if the file
// does not exist.
VerifyReport verify_journal(const std::filesystem::path& path, const std::string& sandbox,
                            const std::optional<JournalHead>& anchor, const HostKey* key);

}  // namespace airlock::engine
