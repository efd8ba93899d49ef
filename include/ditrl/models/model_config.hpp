#pragma once

// A family's architecture as the config its reference loader reads: the
// diffusers config.json of SD3Transformer2DModel, WanTransformer3DModel
// (one expert) or QwenImageTransformer2DModel, and for LTX-2 the
// checkpoint-metadata config ({"transformer": {...}}) that ltx_core's
// configurator consumes. Written next to exported weights so that
// `from_pretrained(folder)` (or ltx_core) builds the same model.

#include <ditrl/models/family.hpp>

#include <string>

namespace ditrl::models {

// JSON text (one expert's config for a two-expert Wan2.2 model).
std::string model_config_json(const Family& family);

}  // namespace ditrl::models
