#pragma once

// One forward of a family on a reference case (tests/fixtures/README.md
// layout): inputs stored under the reference forward's argument names in a
// safetensors file, non-tensor arguments in the JSON sidecar next to it
// (`case.json` for `case.safetensors`, key "extra"). `ditrl forward` and the
// fixture tests both run cases through here.

#include <ditrl/models/family.hpp>

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace ditrl::models {

struct ReferenceCase {
  std::string path;
  std::map<std::string, at::Tensor> inputs;
  std::string extra_json = "{}";
  // What else the file carries: reference outputs and intermediates.
  std::map<std::string, at::Tensor> stored;
};

// Inputs are the tensors listed in the file's `input_names` metadata, or
// every tensor that is not an `output*` or `intermediate.*`.
ReferenceCase load_reference_case(const std::string& path);

// The family's reference outputs, plus every tensor its taps recorded as
// `intermediate.<module>.<name>` when `intermediates` (a module recorded again
// in the same forward gets `intermediate.<module>.call<k>.<name>`): the ones
// the case stores, or all of them when it stores none.
std::map<std::string, at::Tensor> run_reference_case(Family& family, const ReferenceCase& reference_case,
                                                     bool intermediates);

}  // namespace ditrl::models
