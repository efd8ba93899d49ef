// ditrl-mpi-ranks: 1 2 4
//
// Sliced loading (models::FamilyOptions::sliced, app::sliced_deck_model)
// against the old full path (app::deck_model: the whole fp32 model on every
// rank, then sliced): at every rank count each rank's master and compute
// slices must be bitwise the same, for the seeded init, bf16, fp32, fp16 and
// fp64 weights files, a sharded checkpoint with its index, LoRA (frozen bf16 base)
// and Wan2.2 A14B's two expert checkpoints. Wrong or partial weights fail on
// every rank before any slice is read, naming the tensor.

#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/io/safetensors_shards.hpp>
#include <ditrl/models/sd3/sd3.hpp>
#include <ditrl/precision/names.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>

#include "mpi_world.hpp"
#include "same_bits.hpp"
#include "sliced_loading.hpp"

namespace ditrl {
namespace {

using Catch::Matchers::Contains;
using test::same_bits;
using test::seeded_state;
using test::seeded_weights;
using test::shared_dir;
using test::sliced_deck;

std::unique_ptr<shard::ShardedParams> shard_model(const config::Config& c, models::Family& family,
                                                  dist::Communicator& comm, models::ParameterSource* source) {
  return std::make_unique<shard::ShardedParams>(family, family.wrap_units(), app::compiled_plan(c, family), comm,
                                                app::shard_options(c, c10::kCPU), source);
}

// Builds the deck's model both ways and compares this rank's pieces.
void check_same_slices(const config::Config& c, dist::Communicator& comm) {
  std::shared_ptr<models::Family> full = app::deck_model(c, c10::kCPU);
  auto old_path = shard_model(c, *full, comm, nullptr);
  app::SlicedModel sliced = app::sliced_deck_model(c, c10::kCPU);
  for (const auto& p : sliced.family->named_parameters())
    if (!precision::is_lora_name(p.key())) REQUIRE(p.value().is_meta());
  auto new_path = shard_model(c, *sliced.family, comm, sliced.source.get());
  const std::vector<shard::ShardPiece> a = old_path->pieces(), b = new_path->pieces();
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].name << " on rank " << comm.rank());
    REQUIRE(a[i].name == b[i].name);
    CHECK(a[i].begin == b[i].begin);
    CHECK(a[i].end == b[i].end);
    CHECK(a[i].trainable == b[i].trainable);
    CHECK(same_bits(a[i].master, b[i].master));
    CHECK(same_bits(a[i].compute, b[i].compute));
  }
  // The model's buffers (SD3's pos_embed) too.
  std::map<std::string, at::Tensor> buffers;
  for (const auto& buf : full->named_buffers()) buffers[buf.key()] = buf.value();
  for (const auto& buf : sliced.family->named_buffers()) {
    INFO(buf.key());
    REQUIRE(buffers.count(buf.key()));
    CHECK(same_bits(buffers.at(buf.key()), buf.value()));
  }
}

}  // namespace

TEST_CASE("sliced loading: seeded init equals the full path bitwise (sd3 tiny)", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  check_same_slices(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 5"), *comm);
}

TEST_CASE("sliced loading: seeded init with LoRA (frozen bf16 base) equals the full path bitwise", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  check_same_slices(
      sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 3\n[model.lora]\nenabled = true\nrank = 4"), *comm);
  check_same_slices(sliced_deck("family = \"wan\"\npreset = \"tiny\"\n[model.lora]\nenabled = true\nrank = 2\n"),
                    *comm);
}

TEST_CASE("sliced loading: bf16 / fp32 / fp16 / fp64 weights files equal the full path bitwise", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  const config::Config seeded = sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 11");
  const std::string dir = shared_dir(*comm, "single");
  // bf16 and fp16 convert to fp32 exactly and are cast once; fp64 rounds
  // through fp32 as the unsliced path's fp32 parameter does.
  for (const auto& [dtype, file] : {std::pair{at::kBFloat16, "bf16.safetensors"},
                                    {at::kFloat, "fp32.safetensors"},
                                    {at::kHalf, "fp16.safetensors"},
                                    {at::kDouble, "fp64.safetensors"}}) {
    const std::string path = seeded_weights(*comm, dir, file, seeded, dtype);
    check_same_slices(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + path + "\""), *comm);
    check_same_slices(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + path +
                                  "\"\n[model.lora]\nenabled = true\nrank = 4"),
                      *comm);
  }
}

// A frozen group whose tensors one file stores back to back in the group's
// dtype is mapped, not read (its slices are bitwise the full path's: above);
// one whose file dtype differs is read and cast.
TEST_CASE("sliced loading: a frozen bf16 base is mapped from its file / an fp32 file's is read", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  const std::string dir = shared_dir(*comm, "mapped");
  const config::Config seeded = sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 12");
  for (const auto& [dtype, file] : {std::pair{at::kBFloat16, "bf16.safetensors"}, {at::kFloat, "fp32.safetensors"}}) {
    const std::string path = seeded_weights(*comm, dir, file, seeded, dtype);
    const config::Config c = sliced_deck("family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + path +
                                         "\"\n[model.lora]\nenabled = true\nrank = 4");
    app::SlicedModel sliced = app::sliced_deck_model(c, c10::kCPU);
    auto params = shard_model(c, *sliced.family, *comm, sliced.source.get());
    const models::LoadStats& stats = sliced.source->stats;
    INFO(file << " on rank " << comm->rank() << ": " << stats.mapped_bytes << " of " << stats.bytes << " bytes mapped");
    if (dtype == at::kBFloat16 && comm->rank() == 0) CHECK(stats.mapped_bytes > stats.bytes / 2);
    if (dtype == at::kFloat) CHECK(stats.mapped_bytes == 0);
    CHECK(stats.bytes > 0);
  }
}

TEST_CASE("sliced loading: a sharded checkpoint with its index equals the full path bitwise", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  const config::Config seeded = sliced_deck("family = \"wan\"\npreset = \"tiny\"\ninit_seed = 2");
  const std::string dir = shared_dir(*comm, "sharded");
  if (comm->rank() == 0) {
    const auto written =
        io::write_sharded_safetensors(dir, "diffusion_pytorch_model", seeded_state(seeded, at::kBFloat16), 20'000);
    REQUIRE(written.size() > 3);  // several shards and the index
  }
  comm->barrier();
  const config::Config sharded = sliced_deck("family = \"wan\"\npreset = \"tiny\"\nweights = \"" + dir +
                                             "/diffusion_pytorch_model.safetensors.index.json\"");
  check_same_slices(sharded, *comm);
  // Read by three threads at once (shard::take_slices reads a checkpoint with the intra-op threads).
  const int threads = at::get_num_threads();
  at::set_num_threads(3);
  check_same_slices(sharded, *comm);
  check_same_slices(
      sliced_deck("family = \"wan\"\npreset = \"tiny\"\nweights = \"" + dir +
                  "/diffusion_pytorch_model.safetensors.index.json\"\n[model.lora]\nenabled = true\nrank = 2\n"),
      *comm);
  at::set_num_threads(threads);
}

TEST_CASE("sliced loading: Wan2.2 A14B's two expert checkpoints equal the full path bitwise", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  const std::string dir = shared_dir(*comm, "experts");
  const config::Config one = sliced_deck("family = \"wan\"\npreset = \"tiny\"\ninit_seed = 8");
  const config::Config other = sliced_deck("family = \"wan\"\npreset = \"tiny\"\ninit_seed = 9");
  if (comm->rank() == 0) {
    io::write_safetensors(dir + "/high.safetensors", seeded_state(one, at::kBFloat16));
    io::write_safetensors(dir + "/low.safetensors", seeded_state(other, at::kFloat));
  }
  comm->barrier();
  check_same_slices(sliced_deck("family = \"wan\"\npreset = \"tiny-a14b\"\nweights = \"" + dir +
                                "/high.safetensors\"\nweights_2 = \"" + dir + "/low.safetensors\""),
                    *comm);
}

// The training model's pos_embed window (GridTables::DeckCrop) against the
// whole model's crop at the deck's grid, and the sliced parameters over it.
void check_pos_embed_window(const config::Config& c, dist::Communicator& comm) {
  std::shared_ptr<models::Family> full = app::deck_model(c, c10::kCPU);
  app::SlicedModel sliced = app::sliced_deck_model(c, c10::kCPU, app::GridTables::DeckCrop);
  const models::PatchEmbed& held = *dynamic_cast<models::SD3&>(*sliced.family).pos_embed;
  const models::PatchEmbed& whole = *dynamic_cast<models::SD3&>(*full).pos_embed;
  REQUIRE(held.windowed());
  CHECK(held.pos_embed.is_meta());  // nothing of the whole table is held
  CHECK(held.pos_embed.sizes() == whole.pos_embed.sizes());
  const int64_t h = c.rollout.height / 2, w = c.rollout.width / 2;  // patch 2
  CHECK(held.window_values().numel() == h * w * whole.pos_embed.size(-1));
  CHECK(same_bits(held.cropped_pos_embed(h, w), whole.cropped_pos_embed(h, w)));
  CHECK_THROWS_WITH(held.cropped_pos_embed(h + 2, w), Contains("holds only the centre crop"));
  // The parameters are sliced over it as over the whole table.
  auto params = shard_model(c, *sliced.family, comm, sliced.source.get());
  auto reference = shard_model(c, *full, comm, nullptr);
  const std::vector<shard::ShardPiece> a = reference->pieces(), b = params->pieces();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i].compute, b[i].compute));
}

TEST_CASE("sliced loading: training holds only SD3's pos_embed crop - bitwise the whole table's", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  // Seeded: the window is computed.
  check_pos_embed_window(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 5"), *comm);
  // A bf16 weights file whose table is not the formula: the window is read from it.
  const std::string dir = shared_dir(*comm, "pos-embed");
  const std::string path = dir + "/bf16.safetensors";
  if (comm->rank() == 0) {
    io::NamedTensors tensors =
        seeded_state(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 4"), at::kBFloat16);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
    for (auto& [name, t] : tensors)
      if (name == "pos_embed.pos_embed") t = at::randn(t.sizes(), gen, at::TensorOptions()).to(at::kBFloat16);
    io::write_safetensors(path, tensors);
  }
  comm->barrier();
  const std::string weights = "family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + path + "\"";
  check_pos_embed_window(sliced_deck(weights), *comm);
  check_pos_embed_window(sliced_deck(weights, "[model.lora]\nenabled = true\nrank = 4\n"), *comm);
  // Another grid: 12x8 latents, a 6x4-patch window.
  check_pos_embed_window(config::parse_deck("[model]\n" + weights +
                                                "\n[rollout]\nbatch = 4\nsamples_per_prompt = 4\nheight = 12\n"
                                                "width = 8\n[train]\nglobal_batch = 16\nmicro_batch = 4\n",
                                            "pos-embed deck"),
                         *comm);
}

TEST_CASE("sliced loading: wrong or partial weights fail on every rank naming the tensor", "[sliced]") {
  auto comm = dist::make_mpi_communicator();
  const config::Config seeded = sliced_deck("family = \"sd3\"\npreset = \"tiny\"");
  const std::string dir = shared_dir(*comm, "wrong");
  const io::NamedTensors good = seeded_state(seeded, at::kFloat);
  const auto write = [&](const std::string& file, const std::function<void(io::NamedTensors&)>& edit) {
    if (comm->rank() == 0) {
      io::NamedTensors tensors = good;
      edit(tensors);
      io::write_safetensors(dir + "/" + file, tensors);
    }
  };
  const auto find = [](io::NamedTensors& tensors, const std::string& name) -> at::Tensor& {
    for (auto& [key, value] : tensors)
      if (key == name) return value;
    FAIL("no tensor " << name);
    throw Error("unreachable");
  };
  write("missing.safetensors", [](io::NamedTensors& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](const auto& x) { return x.first == "proj_out.bias"; }), t.end());
  });
  write("unexpected.safetensors", [](io::NamedTensors& t) { t.emplace_back("extra.weight", at::zeros({3})); });
  write("shape.safetensors", [&](io::NamedTensors& t) {
    find(t, "context_embedder.weight") = at::zeros({2, 2}, at::kFloat);
  });
  write("dtype.safetensors", [&](io::NamedTensors& t) {
    at::Tensor& v = find(t, "norm_out.linear.weight");
    v = v.to(at::kLong);
  });
  comm->barrier();
  const auto load = [&](const std::string& file) {
    return app::sliced_deck_model(
        sliced_deck("family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + dir + "/" + file + "\""), c10::kCPU);
  };
  CHECK_THROWS_WITH(load("missing.safetensors"), Contains("missing (1): proj_out.bias"));
  CHECK_THROWS_WITH(load("unexpected.safetensors"), Contains("unexpected (1): extra.weight"));
  CHECK_THROWS_WITH(load("shape.safetensors"), Contains("wrong shape (1): context_embedder.weight (checkpoint [2, 2]"));
  CHECK_THROWS_WITH(load("dtype.safetensors"), Contains("wrong dtype (1, expected F32, BF16, F16 or F64): "
                                                        "norm_out.linear.weight (I64)"));
  CHECK_THROWS_WITH(load("dtype.safetensors"), Contains(dir + "/dtype.safetensors"));
}

}  // namespace ditrl
