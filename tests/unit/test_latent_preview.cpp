// The latent preview's projection against its closed form, the families'
// published factors and frame layouts, and the PNG / animated WebP files
// the preview is written as, read back through libpng and libwebp.
#include <ditrl/io/png.hpp>
#include <ditrl/io/webp.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/latent_preview.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<models::Family> meta_family(const std::string& name) {
  models::FamilyOptions options;
  options.family = name;
  options.device = c10::kMeta;
  return models::create_family(options);
}

std::string output_path(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(DITRL_TEST_OUTPUT_DIR) / "latent_preview";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

}  // namespace

TEST_CASE("latent preview: each pixel is round(clamp((latent . weights + bias + 1) / 2) x 255)", "[latent_preview]") {
  // Dyadic values keep every float operation exact, so the closed form
  // computed in double must match to the bit.
  models::LatentRgbFactors f;
  f.weights = {{0.5f, -0.25f, 0.125f}, {-0.375f, 0.75f, 0.25f}};
  f.bias = {0.125f, -0.5f, 0.0f};
  f.spatial = 1;
  const std::vector<float> values{-3.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
  at::Tensor frames = at::empty({2, 2, 2, 3});  // F = 2, C = 2, H = 2, W = 3
  auto a = frames.accessor<float, 4>();
  int64_t i = 0;
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t x = 0; x < 3; ++x) a[t][c][y][x] = values[static_cast<size_t>(i++ * 5 % 6)];
  const at::Tensor rgb = models::latent_preview(frames, f);
  REQUIRE(rgb.sizes() == at::IntArrayRef({2, 2, 3, 3}));
  REQUIRE(rgb.scalar_type() == at::kByte);
  auto p = rgb.accessor<uint8_t, 4>();
  int clamped = 0;
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t y = 0; y < 2; ++y)
      for (int64_t x = 0; x < 3; ++x)
        for (int64_t k = 0; k < 3; ++k) {
          double v = f.bias[static_cast<size_t>(k)];
          for (int64_t c = 0; c < 2; ++c)
            v += a[t][c][y][x] * f.weights[static_cast<size_t>(c)][static_cast<size_t>(k)];
          const double unit = (v + 1) / 2;
          clamped += unit < 0 || unit > 1;
          const double expected = std::nearbyint(std::clamp(unit, 0.0, 1.0) * 255);
          INFO("frame " << t << " pixel " << y << "," << x << " channel " << k);
          CHECK(static_cast<double>(p[t][y][x][k]) == expected);
        }
  CHECK(clamped > 0);  // the clamp is exercised, not only the linear part
}

TEST_CASE("latent preview: a latent cell becomes a spatial x spatial block of pixels", "[latent_preview]") {
  models::LatentRgbFactors f;
  f.weights = {{1.0f, 0.0f, 0.0f}};
  f.spatial = 4;
  const at::Tensor frames = at::linspace(-1, 1, 6).view({1, 1, 2, 3});
  const at::Tensor rgb = models::latent_preview(frames, f);
  REQUIRE(rgb.sizes() == at::IntArrayRef({1, 8, 12, 3}));
  for (int64_t y = 0; y < 8; ++y)
    for (int64_t x = 0; x < 12; ++x) CHECK(at::equal(rgb[0][y][x], rgb[0][y / 4 * 4][x / 4 * 4]));
  CHECK_FALSE(at::equal(rgb[0][0][0], rgb[0][0][4]));  // negative control: neighbouring cells differ
}

TEST_CASE("latent preview: latents without one factor row per channel are refused naming both counts",
          "[latent_preview]") {
  models::LatentRgbFactors f;
  f.weights = {{1.0f, 0.0f, 0.0f}, {0.0f, 1.0f, 0.0f}};
  f.source = "test factors";
  CHECK_THROWS_WITH(models::latent_preview(at::zeros({1, 3, 2, 2}), f),
                    Contains("3 channels") && Contains("test factors") && Contains("2 rows"));
}

TEST_CASE("latent preview: every family's published factors match its latent channels and frame layout",
          "[latent_preview]") {
  const std::vector<std::tuple<std::string, std::string, size_t, int64_t>> cases{
      {"sd3", "tiny", 16, 8}, {"wan", "tiny", 16, 8}, {"qwen_image", "tiny", 16, 8}, {"flux", "tiny", 16, 8}};
  for (const auto& [name, preset, channels, spatial] : cases) {
    INFO(name);
    const models::LatentRgbFactors f = models::latent_rgb_factors(*meta_family(name));
    CHECK(f.weights.size() == channels);
    CHECK(f.spatial == spatial);
    CHECK_FALSE(f.source.empty());
  }
  // SD3's first row and bias, as ComfyUI publishes them.
  const models::LatentRgbFactors sd3 = models::latent_rgb_factors(*meta_family("sd3"));
  CHECK(sd3.weights[0] == std::array<float, 3>{-0.0922f, -0.0175f, 0.0749f});
  CHECK(sd3.bias == std::array<float, 3>{0.2394f, 0.2135f, 0.1925f});
  // The tiny LTX has 16 latent channels: no published factors fit it.
  CHECK(models::latent_rgb_factors(*meta_family("ltx")).weights.empty());

  const models::LatentGrid grid{3, 4, 5, 24.0};
  const at::Tensor wan = at::randn({2, 16, 3, 4, 5});
  const at::Tensor wan_frames = models::latent_frames(*meta_family("wan"), wan, grid);
  REQUIRE(wan_frames.sizes() == at::IntArrayRef({2, 3, 16, 4, 5}));
  CHECK(at::equal(wan_frames[1][2][7], wan[1][7][2]));
  const at::Tensor ltx = at::randn({2, 3 * 4 * 5, 16});
  const at::Tensor ltx_frames = models::latent_frames(*meta_family("ltx"), ltx, grid);
  REQUIRE(ltx_frames.sizes() == at::IntArrayRef({2, 3, 16, 4, 5}));
  // Token (f, y, x) is f * 20 + y * 5 + x, frame-major.
  CHECK(at::equal(ltx_frames.select(0, 1).select(0, 2).select(1, 3).select(1, 4), ltx[1][2 * 20 + 3 * 5 + 4]));
  const at::Tensor sd3_frames = models::latent_frames(*meta_family("sd3"), at::zeros({2, 16, 4, 5}), {1, 4, 5, 24.0});
  CHECK(sd3_frames.sizes() == at::IntArrayRef({2, 1, 16, 4, 5}));
}

TEST_CASE("latent preview: PNG and animated WebP files read back through libpng and libwebp", "[latent_preview]") {
  at::Generator gen = at::detail::createCPUGenerator(5);
  const at::Tensor image = at::randint(0, 256, {6, 10, 3}, gen, at::kByte);
  const std::string png = output_path("grid.png");
  io::write_png(png, image, {{"Title", "a grid"}, {"Description", "0: a prompt \xc3\xa9 (reward 0.5)"}});
  const io::PngImage back = io::read_png(png);
  CHECK(at::equal(back.rgb, image));
  CHECK(back.text.at("Title") == "a grid");
  CHECK(back.text.at("Description") == "0: a prompt \xc3\xa9 (reward 0.5)");

  const at::Tensor frames = at::randint(0, 256, {3, 6, 10, 3}, gen, at::kByte);
  const std::string webp = output_path("video.webp");
  io::write_animated_webp(webp, frames, 160);
  const io::WebpAnimation anim = io::read_animated_webp(webp);
  CHECK(anim.width == 10);
  CHECK(anim.height == 6);
  CHECK(anim.frames == 3);
  // Lossless: the first frame's RGB comes back exactly, opaque.
  CHECK(at::equal(anim.first_frame.narrow(2, 0, 3), frames[0]));
  CHECK(at::all(anim.first_frame.select(2, 3) == 255).item<bool>());

  // Negative controls: a file that is not a PNG or WebP is refused naming it.
  const std::string junk = output_path("junk.png");
  std::ofstream(junk) << "not an image";
  CHECK_THROWS_WITH(io::read_png(junk), Contains(junk) && Contains("not a PNG"));
  CHECK_THROWS_WITH(io::read_animated_webp(junk), Contains(junk));
}
