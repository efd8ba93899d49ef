#pragma once

// Animated WebP through libwebp's WebPAnimEncoder (libwebpmux), lossless, so
// a video family's samples play in any browser. Written to a temporary name
// and renamed (io/text_file.hpp), so a reader never opens half a file.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace ditrl::io {

// `frames`: [F, H, W, 3] uint8 on the CPU, each shown for `frame_ms`.
void write_animated_webp(const std::string& path, const at::Tensor& frames, int frame_ms);

struct WebpAnimation {
  int64_t width = 0, height = 0, frames = 0;
  at::Tensor first_frame;  // [H, W, 4] uint8 RGBA
};

// Decodes an animated WebP (WebPAnimDecoder; the tests' check of what a run wrote).
WebpAnimation read_animated_webp(const std::string& path);

}  // namespace ditrl::io
