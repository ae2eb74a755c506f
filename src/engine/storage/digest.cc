#include "engine/storage/digest.h"

#include <openssl/evp.h>

#include <fstream>
#include <memory>

#include "common/error.h"

namespace airlock::storage {

namespace {

using Ctx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

Ctx new_ctx() {
  Ctx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw Error(Errc::internal, "cannot initialise SHA-256");
  return ctx;
}

std::string finish(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

}  // namespace

std::string sha256_hex(const std::vector<std::string>& parts) {
  Ctx ctx = new_ctx();
  for (const auto& p : parts) {
    std::string len = std::to_string(p.size()) + ":";
    EVP_DigestUpdate(ctx.get(), len.data(), len.size());
    EVP_DigestUpdate(ctx.get(), p.data(), p.size());
  }
  return finish(ctx.get());
}

std::string sha256_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Errc::not_found, "cannot read " + path.string());
  Ctx ctx = new_ctx();
  std::string buf(1 << 16, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw Error(Errc::internal, "error reading " + path.string());
  return finish(ctx.get());
}

Sha256::Sha256() : ctx_(new_ctx().release()) {}
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::update(const void* data, size_t len) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, len);
}
std::string Sha256::hex() { return finish(static_cast<EVP_MD_CTX*>(ctx_)); }

}  // namespace airlock::storage
