#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/sha256.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "corrupt.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

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

namespace {

// A 2-rank LoRA checkpoint whose manifest the hand-written SHA-256 that
// OpenSSL's replaced wrote: old checkpoints must keep loading.
const std::string kOldCheckpoint = ditrl::test::fixture_path("checkpoint/step-1.h5");

struct ManifestLine {
  std::string dataset, digest;
  int64_t begin = 0, end = 0;
};

std::vector<ManifestLine> manifest_lines(const io::h5::File& file) {
  std::vector<ManifestLine> out;
  std::istringstream lines(file.string_attr("sha256_manifest"));
  for (ManifestLine m; lines >> m.dataset >> m.begin >> m.end >> m.digest;) out.push_back(m);
  return out;
}

}  // namespace

TEST_CASE("sha256: every slab of a checkpoint written before OpenSSL hashed it has the digest its manifest lists",
          "[sha256]") {
  const io::h5::File file = io::h5::File::open(kOldCheckpoint);
  const std::vector<ManifestLine> lines = manifest_lines(file);
  REQUIRE(lines.size() > 10);  // two ranks' slabs of the model and of both AdamW moments
  for (const ManifestLine& m : lines) {
    INFO(m.dataset << " [" << m.begin << ", " << m.end << ")");
    const at::Tensor slab = file.open_dataset(m.dataset).read_flat_range(m.begin, m.end - m.begin, false);
    CHECK(io::sha256(slab.data_ptr(), static_cast<size_t>(slab.nbytes())) == m.digest);
  }
}

TEST_CASE("sha256: a checkpoint written before OpenSSL loads verified / a flipped byte in it is refused", "[sha256]") {
  CHECK_FALSE(io::read_checkpoint_weights(kOldCheckpoint).empty());
  const std::string damaged = ditrl::test::fresh_output_dir("sha256_old_checkpoint") + "/step-1.h5";
  std::filesystem::copy_file(kOldCheckpoint, damaged);
  const std::vector<ManifestLine> lines = manifest_lines(io::h5::File::open(damaged));
  const auto trained = std::find_if(lines.begin(), lines.end(),
                                    [](const ManifestLine& m) { return m.dataset.rfind("/model/", 0) == 0; });
  REQUIRE(trained != lines.end());
  ditrl::test::flip_byte(damaged, ditrl::test::data_offset(damaged, trained->dataset));
  CHECK_THROWS_WITH(io::read_checkpoint_weights(damaged), Catch::Matchers::Contains("do not match their SHA-256"));
}
