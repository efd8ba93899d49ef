// LoRA adapter files (PEFT folder, diffusers file, LTX-2 file, ComfyUI
// file): what ditrl writes reads back to the same adapter; files made elsewhere that ditrl
// cannot represent are refused naming the file and the key. The real
// diffusers / PEFT / ltx_core loaders read these files in
// tests/interop/lora_roundtrip.py. Also the sharded full-weight layout.
#include <ditrl/io/safetensors.hpp>
#include <ditrl/io/safetensors_shards.hpp>
#include <ditrl/io/text_file.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/lora_adapter.hpp>
#include <ditrl/models/lora_files.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <cmath>
#include <filesystem>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

models::LoraAdapter sample_adapter() {
  at::manual_seed(3);
  models::LoraAdapter a{4, 12.0, {}};
  a.modules["blocks.0.attn.to_q"] = {at::randn({4, 16}), at::randn({8, 4})};
  a.modules["blocks.1.ffn.proj"] = {at::randn({4, 8}), at::randn({16, 4})};
  return a;
}

void check_same(const models::LoraAdapter& got, const models::LoraAdapter& want, double tol = 0) {
  CHECK(got.rank == want.rank);
  CHECK(got.alpha == Approx(want.alpha));
  REQUIRE(got.module_names() == want.module_names());
  for (const auto& [name, f] : want.modules) {
    CHECK((got.modules.at(name).a - f.a).abs().max().item<double>() <= tol);
    CHECK((got.modules.at(name).b - f.b).abs().max().item<double>() <= tol * f.b.abs().max().item<double>());
  }
}

std::string file_in(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

}  // namespace

TEST_CASE("lora files: PEFT / diffusers and LTX-2 files read back as the adapter written", "[lora][lora_files]") {
  const std::string dir = test::fresh_output_dir("lora_files_roundtrip");
  const models::LoraAdapter adapter = sample_adapter();
  models::write_peft_adapter(dir + "/peft", adapter, {});
  check_same(models::read_lora_file(dir + "/peft"), adapter);
  check_same(models::read_lora_file(dir + "/peft/adapter_model.safetensors"), adapter);
  CHECK(io::Checkpoint(dir + "/peft/adapter_model.safetensors")
            .contains("base_model.model.blocks.0.attn.to_q.lora_A.weight"));
  CHECK_THAT(io::read_text_file(dir + "/peft/adapter_config.json"),
             Contains("\"lora_alpha\":12") && Contains("\"peft_type\":\"LORA\""));

  models::write_lora_file(file_in(dir, "d.safetensors"), models::LoraFormat::Diffusers, adapter, {});
  check_same(models::read_lora_file(file_in(dir, "d.safetensors")), adapter);
  CHECK(io::Checkpoint(file_in(dir, "d.safetensors")).contains("transformer.blocks.1.ffn.proj.lora_B.weight"));

  // LTX-2: ltx_core fuses W + B A at strength 1, so the file's B holds (alpha/r) B.
  models::write_lora_file(file_in(dir, "ltx.safetensors"), models::LoraFormat::Ltx, adapter, {});
  const io::Checkpoint ltx(file_in(dir, "ltx.safetensors"));
  const at::Tensor b = ltx.get("diffusion_model.blocks.0.attn.to_q.lora_B.weight");
  CHECK(at::allclose(b, adapter.modules.at("blocks.0.attn.to_q").b * 3.0));
  check_same(models::read_lora_file(file_in(dir, "ltx.safetensors")), adapter, 1e-6);

  // bf16 storage.
  models::write_lora_file(file_in(dir, "h.safetensors"), models::LoraFormat::Diffusers, adapter,
                          {c10::ScalarType::BFloat16, "", {}});
  CHECK(io::Checkpoint(file_in(dir, "h.safetensors")).info("transformer.blocks.0.attn.to_q.lora_A.weight").dtype ==
        "BF16");
}

TEST_CASE("lora files: ComfyUI files carry an alpha per module and Wan's checkpoint names", "[lora][lora_files]") {
  const std::string dir = test::fresh_output_dir("lora_files_comfyui");
  // ComfyUI scales a module by alpha/r only where `<key>.alpha` is there.
  auto check_alphas = [](const io::Checkpoint& file, const std::vector<std::string>& keys) {
    for (const std::string& key : keys) {
      INFO(key);
      REQUIRE(file.contains(key + ".alpha"));
      CHECK(file.info(key + ".alpha").shape.empty());
      CHECK(file.info(key + ".alpha").dtype == "F32");
      CHECK(file.get(key + ".alpha").item<double>() == 12.0);
      CHECK(file.contains(key + ".lora_A.weight"));
      CHECK(file.contains(key + ".lora_B.weight"));
    }
  };
  const models::LoraAdapter adapter = sample_adapter();
  models::write_comfyui_lora(file_in(dir, "sd3.safetensors"), "sd3", adapter, {c10::ScalarType::BFloat16, "", {}});
  const io::Checkpoint sd3(file_in(dir, "sd3.safetensors"));
  CHECK(sd3.names().size() == 6);
  check_alphas(sd3, {"transformer.blocks.0.attn.to_q", "transformer.blocks.1.ffn.proj"});
  CHECK(sd3.info("transformer.blocks.0.attn.to_q.lora_A.weight").dtype == "BF16");
  check_same(models::read_lora_file(file_in(dir, "sd3.safetensors")), adapter, 1e-2);

  models::write_comfyui_lora(file_in(dir, "qwen.safetensors"), "qwen_image", adapter, {});
  check_alphas(io::Checkpoint(file_in(dir, "qwen.safetensors")),
               {"diffusion_model.blocks.0.attn.to_q", "diffusion_model.blocks.1.ffn.proj"});
  check_same(models::read_lora_file(file_in(dir, "qwen.safetensors")), adapter);

  models::LoraAdapter wan{4, 12.0, {}};
  const std::map<std::string, std::string> wan_names{{"blocks.0.attn1.to_q", "blocks.0.self_attn.q"},
                                                     {"blocks.0.attn1.to_out.0", "blocks.0.self_attn.o"},
                                                     {"blocks.11.attn2.to_v", "blocks.11.cross_attn.v"},
                                                     {"blocks.1.ffn.net.0.proj", "blocks.1.ffn.0"},
                                                     {"blocks.1.ffn.net.2", "blocks.1.ffn.2"},
                                                     {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
                                                     {"condition_embedder.time_proj", "time_projection.1"},
                                                     {"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
                                                     {"proj_out", "head.head"}};
  for (const auto& [ours, theirs] : wan_names) wan.modules[ours] = adapter.modules.begin()->second;
  models::write_comfyui_lora(file_in(dir, "wan.safetensors"), "wan", wan, {});
  std::vector<std::string> keys;
  for (const auto& [ours, theirs] : wan_names) keys.push_back("diffusion_model." + theirs);
  const io::Checkpoint wan_file(file_in(dir, "wan.safetensors"));
  CHECK(wan_file.names().size() == 3 * wan_names.size());
  check_alphas(wan_file, keys);
  check_same(models::read_lora_file(file_in(dir, "wan.safetensors")), wan);

  models::LoraAdapter unnamed = wan;
  unnamed.modules["blocks.0.norm2.linear"] = adapter.modules.begin()->second;
  CHECK_THROWS_WITH(
      models::write_comfyui_lora(file_in(dir, "bad.safetensors"), "wan", unnamed, {}),
      Contains("bad.safetensors") && Contains("wan layer blocks.0.norm2.linear has no Wan checkpoint name"));
  CHECK_THROWS_WITH(models::write_comfyui_lora(file_in(dir, "ltx.safetensors"), "ltx", adapter, {}),
                    Contains("no ComfyUI LoRA layout for family 'ltx'"));
}

TEST_CASE("lora files: adapter_config.json names the base model by a hub repo id and never a local path",
          "[lora][lora_files]") {
  CHECK(models::hub_repo_id("/root/.cache/huggingface/hub/models--stabilityai--stable-diffusion-3.5-medium/"
                            "snapshots/b940f67/transformer/diffusion_pytorch_model.safetensors") ==
        "stabilityai/stable-diffusion-3.5-medium");
  CHECK(models::hub_repo_id("hub/models--Wan-AI--Wan2.1-T2V-1.3B-Diffusers/snapshots/0fad780/transformer/"
                            "diffusion_pytorch_model.safetensors.index.json") == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers");
  CHECK(models::hub_repo_id("/cache/models--gpt2/snapshots/1/model.safetensors") == "gpt2");
  CHECK(models::hub_repo_id("/data/sd3/transformer/diffusion_pytorch_model.safetensors").empty());
  CHECK(models::hub_repo_id("/data/models--a--b/weights.safetensors").empty());  // not a cache snapshot
  CHECK(models::hub_repo_id("weights.safetensors").empty());
  CHECK(models::hub_repo_id("").empty());

  const std::string dir = test::fresh_output_dir("lora_files_base_model");
  models::write_peft_adapter(dir + "/null", sample_adapter(), {});
  CHECK_THAT(io::read_text_file(dir + "/null/adapter_config.json"), Contains("\"base_model_name_or_path\":null"));
  models::write_peft_adapter(dir + "/hub", sample_adapter(), {c10::ScalarType::Float, "org/name", {}});
  CHECK_THAT(io::read_text_file(dir + "/hub/adapter_config.json"),
             Contains("\"base_model_name_or_path\":\"org/name\""));
}

TEST_CASE("lora files: alpha as other tools record it", "[lora][lora_files]") {
  const std::string dir = test::fresh_output_dir("lora_files_alpha");
  const models::LoraAdapter adapter = sample_adapter();
  io::NamedTensors plain;
  for (const auto& [name, f] : adapter.modules) {
    plain.emplace_back("transformer." + name + ".lora_A.weight", f.a);
    plain.emplace_back("transformer." + name + ".lora_B.weight", f.b);
  }
  // No alpha anywhere: diffusers and ltx_core use scale 1 (alpha = r).
  io::write_safetensors(file_in(dir, "plain.safetensors"), plain);
  CHECK(models::read_lora_file(file_in(dir, "plain.safetensors")).alpha == 4.0);
  // kohya-style per-module scalars.
  io::NamedTensors kohya = plain;
  for (const auto& [name, f] : adapter.modules) kohya.emplace_back("transformer." + name + ".alpha", at::tensor(8.0));
  io::write_safetensors(file_in(dir, "kohya.safetensors"), kohya);
  CHECK(models::read_lora_file(file_in(dir, "kohya.safetensors")).alpha == 8.0);
  kohya.back().second = at::tensor(2.0);
  io::write_safetensors(file_in(dir, "mixed.safetensors"), kohya);
  CHECK_THROWS_WITH(models::read_lora_file(file_in(dir, "mixed.safetensors")),
                    Contains("per-module alphas are not supported"));
  // rsLoRA: scale lora_alpha / sqrt(r), i.e. alpha = lora_alpha * sqrt(r) over r.
  models::write_peft_adapter(dir + "/rs", adapter, {});
  io::write_text_file(dir + "/rs/adapter_config.json",
                      R"({"peft_type": "LORA", "r": 4, "lora_alpha": 6, "use_rslora": true, "target_modules": ["x"]})");
  CHECK(models::read_lora_file(dir + "/rs").scale() == Approx(6.0 / std::sqrt(4.0)));
}

TEST_CASE("lora files: what ditrl cannot represent is refused naming the file and the key", "[lora][lora_files]") {
  const std::string dir = test::fresh_output_dir("lora_files_bad");
  const models::LoraAdapter adapter = sample_adapter();
  auto refused = [&](const io::NamedTensors& tensors, const std::string& message) {
    const std::string path = file_in(dir, "bad.safetensors");
    io::write_safetensors(path, tensors);
    CHECK_THROWS_WITH(models::read_lora_file(path), Contains(path) && Contains(message));
  };
  const at::Tensor a = at::zeros({4, 16}), b = at::zeros({8, 4});
  refused({{"lora_unet_x.lora_down.weight", a}, {"lora_unet_x.lora_up.weight", b}}, "kohya's lora_down/lora_up");
  refused({{"transformer.x.lora_A.weight", a},
           {"transformer.x.lora_B.weight", b},
           {"transformer.x.lora_magnitude_vector", at::zeros({8})}},
          "DoRA");
  refused({{"transformer.x.lora_A.weight", a}, {"diffusion_model.y.lora_B.weight", b}}, "mix the prefixes");
  refused({{"transformer.x.lora_A.weight", a},
           {"transformer.x.lora_B.weight", b},
           {"transformer.y.lora_A.weight", at::zeros({2, 16})},
           {"transformer.y.lora_B.weight", at::zeros({8, 2})}},
          "per-module ranks");
  refused({{"transformer.x.lora_A.weight", a}}, "module x has lora_A but not lora_B");
  refused({{"transformer.x.weight", a}}, "is not a LoRA factor");

  models::write_peft_adapter(dir + "/dora", adapter, {});
  io::write_text_file(dir + "/dora/adapter_config.json", R"({"peft_type": "LORA", "r": 4, "use_dora": true})");
  CHECK_THROWS_WITH(models::read_lora_file(dir + "/dora"), Contains("DoRA adapters are not supported"));
  io::write_text_file(dir + "/dora/adapter_config.json", R"({"peft_type": "LORA", "r": 8, "lora_alpha": 8})");
  CHECK_THROWS_WITH(models::read_lora_file(dir + "/dora"), Contains("r = 8 but the factors have rank 4"));
  io::write_text_file(dir + "/dora/adapter_config.json", R"({"peft_type": "LOHA", "r": 4})");
  CHECK_THROWS_WITH(models::read_lora_file(dir + "/dora"), Contains("only LORA adapters"));
  CHECK_THROWS_WITH(models::read_lora_file(dir + "/none"), Contains("no such file or folder"));
  std::filesystem::create_directories(dir + "/empty");
  CHECK_THROWS_WITH(models::read_lora_file(dir + "/empty"), Contains("no adapter_config.json"));
}

TEST_CASE("lora adapter: attaching to a model and loading into its deck adapters", "[lora][lora_files]") {
  models::FamilyOptions o;
  o.family = "sd3";
  o.preset = "tiny";
  const auto family = models::create_family(o);
  models::LoraAdapter adapter{2, 5.0, {}};
  const auto q =
      std::dynamic_pointer_cast<models::Linear>(family->named_modules("", false)["transformer_blocks.0.attn.to_q"]);
  REQUIRE(q);
  adapter.modules["transformer_blocks.0.attn.to_q"] = {at::randn({2, q->in_features()}),
                                                       at::randn({q->out_features(), 2})};
  models::attach_lora_adapter(*family, adapter, "test adapter");
  CHECK(q->has_lora());
  CHECK(q->lora_scale() == 2.5);
  CHECK(at::equal(q->lora_B->weight, adapter.modules.begin()->second.b));
  const models::LoraAdapter back = models::lora_adapter_of(*family);
  CHECK(back.module_names() == adapter.module_names());

  // A deck's LoRA with another rank, alpha and targets: every difference in one error.
  models::FamilyOptions deck = o;
  deck.lora.enabled = true;
  deck.lora.rank = 4;
  deck.lora.alpha = 8.0;
  deck.lora.targets = {"attn.to_k"};
  const auto other = models::create_family(deck);
  CHECK_THROWS_WITH(models::load_lora_adapter(*other, adapter, "file.safetensors"),
                    Contains("file.safetensors") && Contains("rank 2 in the file, model.lora.rank = 4") &&
                        Contains("alpha 5 in the file, model.lora.alpha = 8") &&
                        Contains("that model.lora.targets does not select: transformer_blocks.0.attn.to_q") &&
                        Contains("are not in the file"));
  models::LoraAdapter bad = adapter;
  bad.modules["transformer_blocks.0.norm1.nonexistent"] = bad.modules.begin()->second;
  CHECK_THROWS_WITH(models::attach_lora_adapter(*models::create_family(o), bad, "bad"),
                    Contains("transformer_blocks.0.norm1.nonexistent (not a linear layer of the model)"));
}

TEST_CASE("sharded safetensors: shards below the limit / an index / stale files removed", "[safetensors][lora_files]") {
  const std::string dir = test::fresh_output_dir("sharded_safetensors");
  io::NamedTensors tensors;
  for (int i = 0; i < 5; ++i)
    tensors.emplace_back("w" + std::to_string(i), at::full({256}, i, at::kFloat));  // 1 KiB each
  tensors.emplace_back("big", at::zeros({1024}, at::kFloat));                       // 4 KiB: a shard of its own
  auto single = io::write_sharded_safetensors(dir, "model", tensors, 1'000'000);
  CHECK(single == std::vector<std::string>{dir + "/model.safetensors"});
  const auto sharded = io::write_sharded_safetensors(dir, "model", tensors, 2100);
  CHECK_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
  CHECK(std::filesystem::exists(dir + "/model-00001-of-00004.safetensors"));
  CHECK(std::filesystem::exists(dir + "/model-00004-of-00004.safetensors"));
  const io::Checkpoint index(dir + "/model.safetensors.index.json");
  CHECK(index.names().size() == 6);
  CHECK(at::equal(index.get("w3"), at::full({256}, 3, at::kFloat)));
  CHECK_THAT(io::read_text_file(dir + "/model.safetensors.index.json"), Contains("\"total_size\":9216"));
  io::write_sharded_safetensors(dir, "model", tensors, 1'000'000);
  CHECK_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  CHECK_FALSE(std::filesystem::exists(dir + "/model-00001-of-00004.safetensors"));

  CHECK(io::parse_byte_size("10GB", "x") == 10'000'000'000ULL);
  CHECK(io::parse_byte_size("2GiB", "x") == 2147483648ULL);
  CHECK(io::parse_byte_size("500kb", "x") == 500'000ULL);
  CHECK(io::parse_byte_size("123", "x") == 123ULL);
  CHECK_THROWS_WITH(io::parse_byte_size("ten", "--max-shard-size"), Contains("--max-shard-size: 'ten' is not a size"));
  CHECK_THROWS_WITH(io::parse_byte_size("-5MB", "x"), Contains("not a positive size"));
}
