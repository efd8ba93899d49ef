#pragma once

// SHA-256 (FIPS 180-4) of files, for provenance attributes users compare with
// `sha256sum` (which encoder produced a prompt dataset, which prompts), and
// checkpoint integrity. OpenSSL's libcrypto computes it (its EVP interface,
// which uses the CPU's SHA extensions where it has them).

#include <cstddef>
#include <memory>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX: its header stays out of ditrl's

namespace ditrl::io {

// Incremental SHA-256: update() with consecutive pieces of a message, then
// hex() once; the same digest as sha256() of the concatenation.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::string hex();

 private:
  struct FreeContext {
    void operator()(evp_md_ctx_st* context) const;
  };
  std::unique_ptr<evp_md_ctx_st, FreeContext> context_;
};

// Lower-case hex digest of the file's bytes (error naming the file if it cannot be read).
std::string sha256_file(const std::string& path);

// Lower-case hex digest of `bytes`.
std::string sha256(const std::string& bytes);
std::string sha256(const void* data, size_t size);

// The version of the libcrypto that computes them (`ditrl --version`).
std::string sha256_library_version();

}  // namespace ditrl::io
