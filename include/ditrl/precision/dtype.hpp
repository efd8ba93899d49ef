#pragma once

// Dtype helpers and the boundary input dtype policy (docs/design.md §4).

#include <ditrl/precision/dtype_names.hpp>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace ditrl::precision {

// The deck name of a dtype ("fp32", "bf16", "fp16"), "fp64", else LibTorch's.
std::string dtype_name(c10::ScalarType dtype);
// Bytes per element.
int64_t dtype_bytes(c10::ScalarType dtype);
// `t` in fp32; an undefined tensor (an absent bias or affine) stays undefined.
at::Tensor to_fp32(const at::Tensor& t);
// bf16 or fp16.
bool is_half(c10::ScalarType dtype);

// How the DiT's boundary inputs are cast before the forward. Autocast-free
// code runs element-wise ops at the input dtype, so these casts decide the
// numerics as much as the parameter dtypes do (docs/algorithms.md §9.3).
// nullopt = passthrough (keep the caller's dtype).
struct InputPolicy {
  std::optional<c10::ScalarType> latents;
  std::optional<c10::ScalarType> cond;
  std::optional<c10::ScalarType> timestep;

  // From the deck's choices (Default = the forward dtype).
  static InputPolicy resolve(InputDtype latents, InputDtype cond, InputDtype timestep, c10::ScalarType forward);

  at::Tensor cast_latents(const at::Tensor& t) const { return cast(t, latents); }
  at::Tensor cast_cond(const at::Tensor& t) const { return cast(t, cond); }
  at::Tensor cast_timestep(const at::Tensor& t) const { return cast(t, timestep); }

 private:
  // Only floating tensors are cast: masks and indices keep their dtype.
  static at::Tensor cast(const at::Tensor& t, const std::optional<c10::ScalarType>& dtype);
};

}  // namespace ditrl::precision
