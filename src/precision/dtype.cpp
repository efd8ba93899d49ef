#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>

namespace ditrl::precision {

std::string dtype_name(c10::ScalarType dtype) {
  if (const std::string_view name = name_of(kDtypeNames, dtype); !name.empty()) return std::string(name);
  if (dtype == at::kDouble) return "fp64";
  return c10::toString(dtype);
}

int64_t dtype_bytes(c10::ScalarType dtype) {
  return static_cast<int64_t>(c10::elementSize(dtype));
}

at::Tensor to_fp32(const at::Tensor& t) {
  return t.defined() ? t.to(at::kFloat) : t;
}

bool is_half(c10::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf;
}

InputPolicy InputPolicy::resolve(InputDtype latents, InputDtype cond, InputDtype timestep, c10::ScalarType forward) {
  auto one = [forward](InputDtype choice) -> std::optional<c10::ScalarType> {
    switch (choice) {
      case InputDtype::Default:
        return forward;
      case InputDtype::Fp32:
        return at::kFloat;
      case InputDtype::Bf16:
        return at::kBFloat16;
      case InputDtype::Fp16:
        return at::kHalf;
      case InputDtype::Passthrough:
        break;
    }
    return std::nullopt;
  };
  return InputPolicy{one(latents), one(cond), one(timestep)};
}

at::Tensor InputPolicy::cast(const at::Tensor& t, const std::optional<c10::ScalarType>& dtype) {
  if (!t.defined() || !dtype || !t.is_floating_point() || t.scalar_type() == *dtype) return t;
  return t.to(*dtype);
}

}  // namespace ditrl::precision
