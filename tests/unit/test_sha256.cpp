#include <ditrl/io/sha256.hpp>

#include <catch2/catch.hpp>

#include <string>

namespace io = ditrl::io;

TEST_CASE("sha256: FIPS 180-4 test vectors", "[sha256]") {
  CHECK(io::sha256("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(io::sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(io::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(io::sha256(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  std::string pattern(100003, '\0');  // not a whole number of blocks; digest from Python's hashlib
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>((i * 7 + 3) % 256);
  CHECK(io::sha256(pattern) == "b4bec991fc613fcb4d2a26eb529e493ed4e3152cc00f0a49bd39b3e48b34824e");
}

TEST_CASE("sha256: pieces fed to Sha256::update give the digest of the whole message", "[sha256]") {
  std::string message(300007, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>((i * 131 + 17) % 251);
  const std::string whole = io::sha256(message);
  // Piece sizes around the 64-byte block: empty, partial, exact and multi-block pieces.
  for (size_t piece : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4096}, size_t{100003}}) {
    io::Sha256 h;
    h.update(message.data(), 0);
    for (size_t at = 0; at < message.size(); at += piece)
      h.update(message.data() + at, std::min(piece, message.size() - at));
    INFO("piece " << piece);
    CHECK(h.hex() == whole);
  }
}
