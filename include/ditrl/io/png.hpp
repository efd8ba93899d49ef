#pragma once

// PNG images through libpng: 8-bit RGB, with iTXt (UTF-8 text) chunks for the captions
// (prompt, reward, rollout) a viewer shows beside the picture. Written to a
// temporary name and renamed (io/text_file.hpp), so a reader that watches
// the folder never opens half an image.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace ditrl::io {

// `rgb`: [H, W, 3] uint8 on the CPU; `text`: keyword -> UTF-8 value, one iTXt chunk each.
void write_png(const std::string& path, const at::Tensor& rgb, const std::map<std::string, std::string>& text);

struct PngImage {
  at::Tensor rgb;  // [H, W, 3] uint8
  std::map<std::string, std::string> text;
};

// Reads an 8-bit RGB PNG back (the tests' check of what a run wrote); errors name the file.
PngImage read_png(const std::string& path);

}  // namespace ditrl::io
