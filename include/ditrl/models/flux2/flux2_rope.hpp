#pragma once

// FLUX.2's rotary positions (docs/families.md §10): each token carries integer
// ids (t, h, w, l), image tokens at (0, row, col, 0), text token j at
// (0, 0, 0, j) (the pipeline's _prepare_latent_ids / _prepare_text_ids). The
// tables and the rotation are FLUX.1's (models/flux/flux_rope.hpp) over four
// axes.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::models {

// The pipeline's ids: image tokens of an h x w grid, row-major (h*w, 4), and
// `text_len` text tokens (text_len, 4); int64.
at::Tensor flux2_image_ids(int64_t height, int64_t width);
at::Tensor flux2_text_ids(int64_t text_len);

}  // namespace ditrl::models
