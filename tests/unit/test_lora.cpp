#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/sd3/sd3.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <catch2/catch.hpp>

#include "model_fixtures.hpp"
#include "process.hpp"

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::max_abs_diff;

namespace {

FamilyOptions tiny_sd3(bool lora, int64_t lora_seed = 0) {
  FamilyOptions o;
  o.family = "sd3";
  o.init_seed = 11;
  o.lora.enabled = lora;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.seed = lora_seed;
  return o;
}

struct Batch {
  at::Tensor x = at::randn({2, 16, 8, 8});
  at::Tensor t = at::tensor({250.0f, 750.0f});
  Cond cond{{{"encoder_hidden_states", at::randn({2, 8, 48})}, {"pooled_projections", at::randn({2, 32})}}};
  at::Tensor run(Family& f) const { return f.noise_pred(x, t, t / 1000, cond, {}); }
};

void randomize_lora_b(Family& f) {
  torch::NoGradGuard no_grad;
  for (const auto& p : f.named_parameters())
    if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0, 0.05);
}

}  // namespace

TEST_CASE("lora: a Linear adds (x A^T) B^T alpha/r after the base", "[models][lora]") {
  Linear linear(6, 4, true, at::TensorOptions());
  init_parameters(linear, 1);
  const at::Tensor x = at::randn({3, 6});
  const at::Tensor base = linear.forward(x);
  linear.attach_lora(2, 6.0);
  CHECK(linear.lora_scale() == 3.0);
  CHECK_FALSE(linear.weight.requires_grad());
  CHECK_FALSE(linear.bias.requires_grad());
  CHECK(linear.lora_A->weight.requires_grad());
  CHECK(linear.named_parameters()["lora_B.weight"].sizes() == at::IntArrayRef{4, 2});
  {
    torch::NoGradGuard no_grad;
    linear.lora_A->weight.normal_();
    linear.lora_B->weight.normal_();
  }
  const at::Tensor a = linear.lora_A->weight, b = linear.lora_B->weight;
  CHECK(at::equal(linear.forward(x), base + at::matmul(at::matmul(x, a.t()), b.t()) * 3.0));
  CHECK(max_abs_diff(at::linear(x, linear.merged_weight(), linear.bias), linear.forward(x)) < 1e-5);
  CHECK_THROWS_WITH(linear.attach_lora(2, 1.0), Contains("already attached"));
}

TEST_CASE("lora: B = 0 leaves the base output bit for bit / only adapters train", "[models][lora]") {
  auto base = create_family(tiny_sd3(false));
  auto adapted = create_family(tiny_sd3(true));
  const Batch batch;
  const at::Tensor expected = batch.run(*base);
  const at::Tensor got = batch.run(*adapted);
  CHECK(at::equal(got, expected));
  // Default targets (docs/families.md §1.8): 8 per block, 7 in the context_pre_only
  // last block (no to_add_out); attn2 is not targeted.
  int64_t adapters = 0;
  for (const auto& p : adapted->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().requires_grad() == precision::is_lora_name(p.key()));
    if (p.key().find(".lora_A.") != std::string::npos) ++adapters;
  }
  CHECK(adapters == 3 * 8 + 7);
  const auto names = adapted->named_parameters();
  CHECK(names.contains("transformer_blocks.0.attn.to_out.0.lora_B.weight"));
  CHECK(names["transformer_blocks.0.attn.to_q.lora_A.weight"].sizes() == at::IntArrayRef{4, 64});
  CHECK_FALSE(names.contains("transformer_blocks.0.attn2.to_q.lora_A.weight"));
  // With B = 0, dL/dA = 0 and dL/dB carries the signal.
  got.square().mean().backward();
  CHECK(names["transformer_blocks.1.attn.to_v.lora_A.weight"].grad().abs().sum().item<double>() == 0);
  CHECK(names["transformer_blocks.1.attn.to_v.lora_B.weight"].grad().abs().sum().item<double>() > 0);
  CHECK_FALSE(names["transformer_blocks.1.attn.to_v.weight"].grad().defined());
}

TEST_CASE("lora: merged weights equal the adapter forward", "[models][lora]") {
  auto adapted = create_family(tiny_sd3(true, 3));
  randomize_lora_b(*adapted);
  auto merged = create_family(tiny_sd3(false));
  const std::string path = test::fresh_output_dir("lora_merge") + "/merged.safetensors";
  io::write_safetensors(path, merged_state(*adapted));
  load_weights(*merged, io::Checkpoint(path));  // a full checkpoint without LoRA names
  const Batch batch;
  torch::NoGradGuard no_grad;
  const at::Tensor a = batch.run(*adapted), b = batch.run(*merged);
  CHECK_FALSE(at::equal(a, batch.run(*create_family(tiny_sd3(false)))));  // the adapters matter
  INFO("max diff " << max_abs_diff(a, b));
  CHECK(max_abs_diff(a, b) <= 1e-5 * a.abs().max().item<double>());
}

TEST_CASE("lora: PEFT names on export and on load", "[models][lora]") {
  auto trained = create_family(tiny_sd3(true, 5));
  randomize_lora_b(*trained);
  const io::NamedTensors peft = lora_state(*trained, /*peft_names=*/true);
  REQUIRE(peft.size() == 2 * 31);
  for (const auto& [name, tensor] : peft) {
    INFO(name);
    CHECK(name.rfind("base_model.model.transformer_blocks.", 0) == 0);
    CHECK((name.find(".lora_A.default.weight") != std::string::npos ||
           name.find(".lora_B.default.weight") != std::string::npos));
  }
  const std::string dir = test::fresh_output_dir("lora_peft");
  io::write_safetensors(dir + "/adapter_model.safetensors", peft);
  auto fresh = create_family(tiny_sd3(true, 99));
  load_lora(*fresh, io::Checkpoint(dir + "/adapter_model.safetensors"));
  const auto want = trained->named_parameters(), got = fresh->named_parameters();
  for (const auto& [name, tensor] : lora_state(*trained, false)) CHECK(at::equal(got[name], want[name]));
  const Batch batch;
  torch::NoGradGuard no_grad;
  CHECK(at::equal(batch.run(*fresh), batch.run(*trained)));

  // A full PEFT state (wrapped base layers + adapters) loads into the LoRA model.
  io::NamedTensors full;
  for (const auto& [name, tensor] : state_tensors(*trained)) {
    const bool wrapped = name.find(".attn.") != std::string::npos && !precision::is_lora_name(name) &&
                         trained->named_parameters().contains(name.substr(0, name.rfind('.')) + ".lora_A.weight");
    full.emplace_back(precision::peft_name(name, wrapped), tensor);
  }
  io::write_safetensors(dir + "/peft_full.safetensors", full);
  auto other = create_family(tiny_sd3(true, 42));
  load_weights(*other, io::Checkpoint(dir + "/peft_full.safetensors"));
  CHECK(at::equal(batch.run(*other), batch.run(*trained)));

  // Adapter files that do not fit are rejected with every offending name.
  io::write_safetensors(dir + "/bad.safetensors", {{"transformer_blocks.0.attn.to_q.lora_A.weight", at::zeros({8, 64})},
                                                   {"transformer_blocks.0.attn.to_q.weight", at::zeros({64, 64})}});
  CHECK_THROWS_WITH(load_lora(*fresh, io::Checkpoint(dir + "/bad.safetensors")),
                    Contains("bad.safetensors") && Contains("to_q.lora_A.weight (shape [8, 64], adapter [4, 64])") &&
                        Contains("to_q.weight (not a LoRA adapter"));
}

TEST_CASE("lora: targets are globs with PEFT's suffix rule", "[models][lora]") {
  CHECK(lora_target_matches("attn.to_q", "transformer_blocks.3.attn.to_q"));
  CHECK_FALSE(lora_target_matches("attn.to_q", "transformer_blocks.3.attn2.to_q"));
  CHECK(lora_target_matches("to_q", "transformer_blocks.3.attn2.to_q"));
  CHECK(lora_target_matches("transformer_blocks.[01].*.to_out.0", "transformer_blocks.1.attn2.to_out.0"));
  CHECK_FALSE(lora_target_matches("to_out", "transformer_blocks.1.attn.to_out.0"));
  FamilyOptions o = tiny_sd3(true);
  o.lora.targets = {"transformer_blocks.0.attn2.*", "proj_out"};
  auto f = create_family(o);
  int64_t adapters = 0;
  for (const auto& p : f->named_parameters())
    if (p.key().find(".lora_A.") != std::string::npos) ++adapters;
  CHECK(adapters == 4 + 1);  // attn2 to_q/to_k/to_v/to_out.0 (norms are not Linear) + proj_out
  o.lora.targets = {"attn.to_qq"};
  CHECK_THROWS_WITH(create_family(o), Contains("LoRA target 'attn.to_qq' matches no linear layer"));
  o.lora.targets = {};
  o.lora.init = "orthogonal";
  CHECK_THROWS_WITH(create_family(o), Contains("unknown LoRA init 'orthogonal'"));
  o.lora.init = "kaiming";
  auto k = create_family(o);
  const at::Tensor a = k->named_parameters()["transformer_blocks.0.attn.to_q.lora_A.weight"];
  CHECK(a.abs().max().item<double>() <= 1.0 / 8.0);  // U(-1/sqrt(64), 1/sqrt(64))
  o.device = c10::kMeta;
  auto meta = create_family(o);
  CHECK(meta->named_parameters()["transformer_blocks.0.attn.to_q.lora_A.weight"].is_meta());
}
