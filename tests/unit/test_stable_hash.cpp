#include <ditrl/rl/stable_hash.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <rl_reference_values.hpp>

using namespace ditrl::rl;

namespace {

std::string hex(const std::vector<uint8_t>& bytes) {
  std::string out;
  for (uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

}  // namespace

TEST_CASE("blake2b: RFC 7693 and hashlib test vectors", "[rl][hash]") {
  // RFC 7693 Appendix A: BLAKE2b-512("abc")
  CHECK(hex(blake2b("abc", 3, 64)) ==
        "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
        "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923");
  for (const auto& ref : ditrl::test::blake2b_references()) {
    INFO(ref.input.size() << " bytes, digest " << ref.digest_size);
    CHECK(hex(blake2b(ref.input.data(), ref.input.size(), ref.digest_size)) == ref.hex);
  }
  CHECK_THROWS(blake2b("", 0, 65));
}

TEST_CASE("stable_hash: miles' hash of ':'-joined parts", "[rl][hash]") {
  for (const auto& ref : ditrl::test::stable_hash_references()) {
    INFO(fmt::format("{}", fmt::join(ref.parts, ":")));
    CHECK(stable_hash_of(ref.parts) == ref.value);
  }
  const auto& refs = ditrl::test::stable_hash_references();
  CHECK(stable_hash("nft_sigma_shuffle", 42, 7) == refs[1].value);
  CHECK(stable_hash(std::string("nft_corrupt"), int64_t{42}, 3, uint32_t{5}, 1) == refs[2].value);
  CHECK(stable_hash(-5, "neg") == refs.back().value);
  CHECK(stable_hash("x") < (uint64_t{1} << 63));
}
