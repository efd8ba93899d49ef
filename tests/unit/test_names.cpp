#include <ditrl/precision/names.hpp>

#include <catch2/catch.hpp>

using namespace ditrl::precision;

TEST_CASE("names: glob matching over dotted parameter names", "[precision][names]") {
  CHECK(glob_match("*.norm2.*", "blocks.3.norm2.weight"));
  CHECK_FALSE(glob_match("*.norm2.*", "blocks.3.norm3.weight"));
  CHECK(glob_match("transformer_blocks.?.attn.*", "transformer_blocks.7.attn.to_q.weight"));
  CHECK_FALSE(glob_match("transformer_blocks.?.attn.*", "transformer_blocks.17.attn.to_q.weight"));
  CHECK(glob_match("blocks.[0-2].*", "blocks.1.ffn.net.2.bias"));
  CHECK_FALSE(glob_match("blocks.[!0-2].*", "blocks.1.ffn.net.2.bias"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("a*b*c", "a.x.b.y.c"));
  CHECK_FALSE(glob_match("a*b*c", "a.x.b.y.d"));
  CHECK(glob_match("scale_shift_table", "scale_shift_table"));
  CHECK_FALSE(glob_match("scale_shift_table", "blocks.0.scale_shift_table"));
}

TEST_CASE("names: PEFT and wrapped names resolve to canonical names and back", "[precision][names]") {
  CHECK(canonical_name("base_model.model.transformer_blocks.0.attn.to_q.base_layer.weight") ==
        "transformer_blocks.0.attn.to_q.weight");
  CHECK(canonical_name("base_model.model.transformer_blocks.0.attn.to_q.lora_A.default.weight") ==
        "transformer_blocks.0.attn.to_q.lora_A.weight");
  CHECK(canonical_name("transformer_blocks.0.attn.to_q.lora_B.weight") ==
        "transformer_blocks.0.attn.to_q.lora_B.weight");
  CHECK(canonical_name("proj_out.bias") == "proj_out.bias");
  for (const std::string name : {"blocks.1.attn1.to_k.lora_A.weight", "blocks.1.attn1.to_k.lora_B.weight"})
    CHECK(canonical_name(peft_name(name)) == name);
  CHECK(peft_name("blocks.1.attn1.to_k.weight", true) == "base_model.model.blocks.1.attn1.to_k.base_layer.weight");
  CHECK(canonical_name(peft_name("blocks.1.attn1.to_k.weight", true)) == "blocks.1.attn1.to_k.weight");
  CHECK(lora_base_name("blocks.1.attn1.to_k.lora_A.weight") == "blocks.1.attn1.to_k.weight");
  CHECK(lora_base_name("blocks.1.attn1.to_k.weight") == "blocks.1.attn1.to_k.weight");
}
