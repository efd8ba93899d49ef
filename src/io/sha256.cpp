#include <ditrl/error.hpp>
#include <ditrl/io/sha256.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fstream>
#include <vector>

namespace ditrl::io {

namespace {

// Fetched once: EVP_sha256() would look the algorithm up again at every
// digest's start, and a checkpoint starts one per slab.
const EVP_MD* sha256_algorithm() {
  static EVP_MD* const algorithm = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (!algorithm) fail("OpenSSL has no SHA-256 (EVP_MD_fetch failed)");
  return algorithm;
}

void check(int ok, const char* call) {
  if (ok != 1) fail("OpenSSL's SHA-256 failed in {}", call);
}

}  // namespace

void Sha256::FreeContext::operator()(evp_md_ctx_st* context) const {
  EVP_MD_CTX_free(context);
}

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
  if (!context_) fail("OpenSSL's SHA-256: EVP_MD_CTX_new failed");
  check(EVP_DigestInit_ex(context_.get(), sha256_algorithm(), nullptr), "EVP_DigestInit_ex");
}

void Sha256::update(const void* data, size_t size) {
  check(EVP_DigestUpdate(context_.get(), data, size), "EVP_DigestUpdate");
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  check(EVP_DigestFinal_ex(context_.get(), digest, &length), "EVP_DigestFinal_ex");
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 0xf];
  }
  return out;
}

std::string sha256(const std::string& bytes) {
  return sha256(bytes.data(), bytes.size());
}

std::string sha256(const void* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.hex();
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open for reading", path);
  Sha256 h;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    h.update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) fail("{}: read error", path);
  return h.hex();
}

std::string sha256_library_version() {
  return OpenSSL_version(OPENSSL_VERSION_STRING);
}

}  // namespace ditrl::io
