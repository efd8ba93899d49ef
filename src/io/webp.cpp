#include <ditrl/error.hpp>
#include <ditrl/io/text_file.hpp>
#include <ditrl/io/webp.hpp>

#include <ATen/ATen.h>
#include <webp/demux.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include <cstring>
#include <memory>

namespace ditrl::io {

namespace {

struct EncoderDeleter {
  void operator()(WebPAnimEncoder* e) const { WebPAnimEncoderDelete(e); }
};
struct DecoderDeleter {
  void operator()(WebPAnimDecoder* d) const { WebPAnimDecoderDelete(d); }
};
struct PictureGuard {
  WebPPicture picture{};
  PictureGuard() {
    if (!WebPPictureInit(&picture)) fail("libwebp: version mismatch between its headers and library");
  }
  ~PictureGuard() { WebPPictureFree(&picture); }
};
struct DataGuard {
  WebPData data{};
  DataGuard() { WebPDataInit(&data); }
  ~DataGuard() { WebPDataClear(&data); }
};

}  // namespace

void write_animated_webp(const std::string& path, const at::Tensor& frames, int frame_ms) {
  if (frames.dim() != 4 || frames.size(3) != 3 || frames.scalar_type() != at::kByte || !frames.device().is_cpu() ||
      frames.size(0) < 1)
    fail("write_animated_webp: expected [F >= 1, H, W, 3] uint8 CPU frames, got {} {}", c10::str(frames.sizes()),
         c10::toString(frames.scalar_type()));
  const int width = static_cast<int>(frames.size(2)), height = static_cast<int>(frames.size(1));
  WebPAnimEncoderOptions options;
  if (!WebPAnimEncoderOptionsInit(&options)) fail("libwebp: version mismatch between its headers and library");
  const std::unique_ptr<WebPAnimEncoder, EncoderDeleter> encoder(WebPAnimEncoderNew(width, height, &options));
  if (!encoder) fail("{}: libwebp could not start an animation of {}x{}", path, width, height);
  WebPConfig config;
  if (!WebPConfigInit(&config)) fail("libwebp: version mismatch between its headers and library");
  config.lossless = 1;
  const at::Tensor pixels = frames.contiguous();
  int timestamp = 0;
  for (int64_t f = 0; f < pixels.size(0); ++f) {
    PictureGuard frame;
    frame.picture.use_argb = 1;
    frame.picture.width = width;
    frame.picture.height = height;
    const at::Tensor rgb = pixels[f];
    if (!WebPPictureImportRGB(&frame.picture, rgb.data_ptr<uint8_t>(), width * 3))
      fail("{}: libwebp could not import frame {}", path, f);
    if (!WebPAnimEncoderAdd(encoder.get(), &frame.picture, timestamp, &config))
      fail("{}: libwebp: frame {}: {}", path, f, WebPAnimEncoderGetError(encoder.get()));
    timestamp += frame_ms;
  }
  // A last, empty frame ends the animation at the final frame's end time.
  if (!WebPAnimEncoderAdd(encoder.get(), nullptr, timestamp, nullptr))
    fail("{}: libwebp: {}", path, WebPAnimEncoderGetError(encoder.get()));
  DataGuard out;
  if (!WebPAnimEncoderAssemble(encoder.get(), &out.data))
    fail("{}: libwebp: {}", path, WebPAnimEncoderGetError(encoder.get()));
  write_text_file(path, std::string(reinterpret_cast<const char*>(out.data.bytes), out.data.size));
}

WebpAnimation read_animated_webp(const std::string& path) {
  const std::string bytes = read_text_file(path);
  WebPData data{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) fail("libwebp: version mismatch between its headers and library");
  options.color_mode = MODE_RGBA;
  const std::unique_ptr<WebPAnimDecoder, DecoderDeleter> decoder(WebPAnimDecoderNew(&data, &options));
  if (!decoder) fail("{}: not a WebP file libwebp can decode", path);
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(decoder.get(), &info)) fail("{}: libwebp could not read the animation's header", path);
  WebpAnimation out;
  out.width = info.canvas_width;
  out.height = info.canvas_height;
  while (WebPAnimDecoderHasMoreFrames(decoder.get())) {
    uint8_t* rgba = nullptr;
    int timestamp = 0;
    if (!WebPAnimDecoderGetNext(decoder.get(), &rgba, &timestamp))
      fail("{}: libwebp could not decode frame {}", path, out.frames);
    if (out.frames == 0) {
      out.first_frame = at::empty({out.height, out.width, 4}, at::kByte);
      std::memcpy(out.first_frame.data_ptr<uint8_t>(), rgba, static_cast<size_t>(out.width * out.height * 4));
    }
    ++out.frames;
  }
  return out;
}

}  // namespace ditrl::io
