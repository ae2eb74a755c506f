#include "e2b/access.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"

namespace airlock::e2b {
namespace {

constexpr size_t kKeyBytes = 32;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string read_key(const std::filesystem::path& file) {
  Fd f{::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (f.fd < 0) throw_errno("open " + file.string());
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw_errno("fstat " + file.string());
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 || st.st_size != kKeyBytes)
    throw Error(Errc::internal, file.string() + " must be a regular file of " +
                                    std::to_string(kKeyBytes) +
                                    " bytes readable by its owner only; remove it to make a "
                                    "new key (every E2B access token then changes)");
  std::string key(kKeyBytes, '\0');
  size_t got = 0;
  while (got < key.size()) {
    ssize_t n = ::read(f.fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_errno("read " + file.string());
    got += static_cast<size_t>(n);
  }
  return key;
}

}  // namespace

AccessTokens::AccessTokens(const std::filesystem::path& key_file) {
  // O_EXCL: two daemons racing on a fresh data dir cannot both write one.
  Fd f{::open(key_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (f.fd >= 0) {
    std::string key(kKeyBytes, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), int(key.size())) != 1)
      throw Error(Errc::internal, "no random bytes for " + key_file.string());
    if (::write(f.fd, key.data(), key.size()) != ssize_t(key.size()) || ::fsync(f.fd) != 0) {
      ::unlink(key_file.c_str());
      throw_errno("write " + key_file.string());
    }
    key_ = std::move(key);
    return;
  }
  if (errno != EEXIST) throw_errno("create " + key_file.string());
  key_ = read_key(key_file);
}

AccessTokens AccessTokens::from_key(std::string key) {
  AccessTokens t;
  t.key_ = std::move(key);
  return t;
}

std::string AccessTokens::token_for(std::string_view sandbox_id) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key_.data(), int(key_.size()),
            reinterpret_cast<const unsigned char*>(sandbox_id.data()), sandbox_id.size(), mac,
            &len))
    throw Error(Errc::internal, "HMAC-SHA256 failed");
  static const char* digits = "0123456789abcdef";
  std::string hex;
  hex.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(digits[mac[i] >> 4]);
    hex.push_back(digits[mac[i] & 15]);
  }
  return hex;
}

bool AccessTokens::check(std::string_view sandbox_id, std::string_view presented) const {
  std::string want = token_for(sandbox_id);
  return presented.size() == want.size() &&
         CRYPTO_memcmp(want.data(), presented.data(), want.size()) == 0;
}

}  // namespace airlock::e2b
