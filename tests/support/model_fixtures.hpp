#pragma once

// Helpers for tests that run families on the reference fixtures
// (tests/fixtures/<family>/: config.json, weights.safetensors, case_*).

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ditrl::test {

inline std::string fixture_path(const std::string& relative) {
  return std::string(DITRL_FIXTURES_DIR) + "/" + relative;
}

// The fixture's architecture (its config.json) with the seeded init.
inline std::shared_ptr<models::Family> fixture_architecture(const std::string& family, c10::Device device = c10::kCPU) {
  models::FamilyOptions o;
  o.family = family;
  o.config_json = fixture_path(family + "/config.json");
  o.device = device;
  return models::create_family(o);
}

// The fixture's model with its weights loaded.
inline std::shared_ptr<models::Family> fixture_family(const std::string& family, models::FamilyOptions options = {}) {
  options.family = family;
  options.config_json = fixture_path(family + "/config.json");
  auto model = models::create_family(options);
  models::load_weights(*model, io::Checkpoint(fixture_path(family + "/weights.safetensors")));
  return model;
}

inline boost::json::value read_json(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return boost::json::parse(text.str());
}

inline int64_t parameter_count(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const at::Tensor& p : params) n += p.numel();
  return n;
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace ditrl::test
