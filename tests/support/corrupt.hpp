#pragma once

// Damage injected into checkpoint files by the e2e tests: one byte flipped
// in the middle of a dataset's stored bytes.

#include <ditrl/io/h5.hpp>

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

namespace ditrl::test {

inline void flip_byte(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(offset);
  f.write(&c, 1);
}

// The middle of a (contiguous) dataset's bytes in its file.
inline std::streamoff data_offset(const std::string& path, const std::string& dataset) {
  io::h5::File file = io::h5::File::open(path);
  io::h5::Dataset d = file.open_dataset(dataset);
  const haddr_t addr = H5Dget_offset(d.id());
  REQUIRE(addr != HADDR_UNDEF);
  return static_cast<std::streamoff>(addr + H5Dget_storage_size(d.id()) / 2);
}

}  // namespace ditrl::test
