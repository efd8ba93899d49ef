#pragma once

// What the sliced-loading suites (tests/mpi/test_sliced_loading.cpp and its
// CUDA twin) share: a small deck around a [model] table, a deck's seeded model
// state as a weights file would hold it (and that file written), and a folder
// every rank sees.

#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/weights.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <string>

namespace ditrl::test {

// `model`: the [model] table's lines; `extra`: more tables.
inline config::Config sliced_deck(const std::string& model, const std::string& extra = "") {
  const std::string text = "[model]\n" + model +
                           "\n[precision]\nmaster = \"fp32\"\nforward = \"bf16\"\n"
                           "[rollout]\nbatch = 4\nsamples_per_prompt = 4\nheight = 8\nwidth = 8\n"
                           "[train]\nglobal_batch = 16\nmicro_batch = 4\n" +
                           extra;
  return config::parse_deck(text, "sliced-loading deck");
}

// The deck's seeded model state (what `ditrl train` draws without weights) in
// `dtype`; every rank computes the same, rank 0 writes it.
inline io::NamedTensors seeded_state(const config::Config& c, c10::ScalarType dtype) {
  io::NamedTensors out;
  for (auto& [name, t] : models::state_tensors(*app::deck_model(c, c10::kCPU))) out.emplace_back(name, t.to(dtype));
  return out;
}

// `dir`/`file` holding the deck's seeded state in `dtype`: rank 0 writes
// it, and every rank sees it once this returns.
inline std::string seeded_weights(dist::Communicator& comm, const std::string& dir, const std::string& file,
                                  const config::Config& c, c10::ScalarType dtype) {
  const std::string path = dir + "/" + file;
  if (comm.rank() == 0) io::write_safetensors(path, seeded_state(c, dtype));
  comm.barrier();
  return path;
}

// A fresh folder shared by the ranks (rank 0 makes it; every rank reads it).
inline std::string shared_dir(dist::Communicator& comm, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("ditrl-sliced-{}-{}", name, comm.size());
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  comm.barrier();
  return dir.string();
}

}  // namespace ditrl::test
