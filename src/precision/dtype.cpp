#include <ditrl/error.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>

namespace ditrl::precision {

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  if (name == "fp64" || name == "float64") return at::kDouble;
  fail("unknown dtype '{}': expected fp32, bf16, fp16 or fp64", name);
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: return c10::toString(dtype);
  }
}

int64_t dtype_bytes(c10::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

at::Tensor to_fp32(const at::Tensor& t) {
  return t.defined() ? t.to(at::kFloat) : t;
}

bool is_half(c10::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf;
}

InputPolicy InputPolicy::resolve(const std::string& latents, const std::string& cond, const std::string& timestep,
                                 c10::ScalarType forward) {
  auto one = [forward](const std::string& word) -> std::optional<c10::ScalarType> {
    if (word == "passthrough") return std::nullopt;
    if (word == "default") return forward;
    return parse_dtype(word);
  };
  return InputPolicy{one(latents), one(cond), one(timestep)};
}

at::Tensor InputPolicy::cast(const at::Tensor& t, const std::optional<c10::ScalarType>& dtype) {
  if (!t.defined() || !dtype || !t.is_floating_point() || t.scalar_type() == *dtype) return t;
  return t.to(*dtype);
}

}  // namespace ditrl::precision
