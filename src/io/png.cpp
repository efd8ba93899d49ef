#include <ditrl/error.hpp>
#include <ditrl/io/png.hpp>
#include <ditrl/io/text_file.hpp>

#include <ATen/ATen.h>
#include <png.h>

#include <csetjmp>
#include <cstring>
#include <vector>

namespace ditrl::io {

namespace {

// libpng reports errors by longjmp; its message is kept for the exception
// thrown once control is back in C++ frames.
struct PngError {
  std::string message;
};

void on_error(png_structp png, png_const_charp message) {
  static_cast<PngError*>(png_get_error_ptr(png))->message = message;
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}

void append_bytes(png_structp png, png_bytep data, png_size_t length) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), length);
}

void flush_nothing(png_structp) {}

struct ReadCursor {
  const std::string* bytes;
  size_t at = 0;
};

void read_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* cursor = static_cast<ReadCursor*>(png_get_io_ptr(png));
  if (cursor->at + length > cursor->bytes->size()) png_error(png, "truncated file");
  std::memcpy(data, cursor->bytes->data() + cursor->at, length);
  cursor->at += length;
}

void check_rgb(const at::Tensor& rgb) {
  if (rgb.dim() != 3 || rgb.size(2) != 3 || rgb.scalar_type() != at::kByte || !rgb.device().is_cpu())
    fail("write_png: expected a [H, W, 3] uint8 CPU tensor, got {} {} on {}", c10::str(rgb.sizes()),
         c10::toString(rgb.scalar_type()), rgb.device().str());
}

}  // namespace

void write_png(const std::string& path, const at::Tensor& rgb, const std::map<std::string, std::string>& text) {
  check_rgb(rgb);
  const at::Tensor pixels = rgb.contiguous();
  const auto height = static_cast<png_uint_32>(pixels.size(0)), width = static_cast<png_uint_32>(pixels.size(1));
  PngError error;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &error, on_error, on_warning);
  if (!png) fail("{}: libpng could not start a write", path);
  png_infop info = png_create_info_struct(png);
  std::string bytes;
  std::vector<png_bytep> rows(height);
  std::vector<png_text> chunks;
  for (const auto& [key, value] : text) {
    png_text t{};
    // iTXt: UTF-8 text (prompts need not be Latin-1, which tEXt is).
    t.compression = PNG_ITXT_COMPRESSION_NONE;
    t.key = const_cast<char*>(key.c_str());
    t.text = const_cast<char*>(value.c_str());
    t.itxt_length = value.size();
    chunks.push_back(t);
  }
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    fail("{}: libpng: {}", path, error.message.empty() ? "out of memory" : error.message);
  }
  png_set_write_fn(png, &bytes, append_bytes, flush_nothing);
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!chunks.empty()) png_set_text(png, info, chunks.data(), static_cast<int>(chunks.size()));
  auto* base = static_cast<png_bytep>(pixels.data_ptr());
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = base + static_cast<size_t>(y) * width * 3;
  png_set_rows(png, info, rows.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  write_text_file(path, bytes);
}

PngImage read_png(const std::string& path) {
  const std::string bytes = read_text_file(path);
  if (bytes.size() < 8 || png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) != 0)
    fail("{}: not a PNG file (no PNG signature)", path);
  PngError error;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &error, on_error, on_warning);
  if (!png) fail("{}: libpng could not start a read", path);
  png_infop info = png_create_info_struct(png);
  ReadCursor cursor{&bytes};
  PngImage out;
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    fail("{}: libpng: {}", path, error.message.empty() ? "out of memory" : error.message);
  }
  png_set_read_fn(png, &cursor, read_bytes);
  png_read_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  const png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  if (png_get_bit_depth(png, info) != 8 || png_get_color_type(png, info) != PNG_COLOR_TYPE_RGB) {
    png_destroy_read_struct(&png, &info, nullptr);
    fail("{}: expected an 8-bit RGB PNG", path);
  }
  out.rgb = at::empty({height, width, 3}, at::kByte);
  png_bytepp rows = png_get_rows(png, info);
  for (png_uint_32 y = 0; y < height; ++y)
    std::memcpy(out.rgb.data_ptr<uint8_t>() + static_cast<size_t>(y) * width * 3, rows[y], width * 3);
  png_textp chunks = nullptr;
  const int count = png_get_text(png, info, &chunks, nullptr);
  for (int i = 0; i < count; ++i) out.text[chunks[i].key] = chunks[i].text;
  png_destroy_read_struct(&png, &info, nullptr);
  return out;
}

}  // namespace ditrl::io
