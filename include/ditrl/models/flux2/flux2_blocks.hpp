#pragma once

// The modules of FLUX.2's transformer (diffusers transformer_flux2.py), named
// as its checkpoints name them. Every linear is bias-free.

#include <ditrl/models/attention.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/norms.hpp>
#include <ditrl/models/unit.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace ditrl::models {

struct Flux2Config;

// time_guidance_embed: the sinusoid of 1000 sigma (and of 1000 x the guidance
// scale, where the model embeds it) through timestep_embedder (and
// guidance_embedder), summed.
class TimeGuidanceEmbedding : public torch::nn::Module {
 public:
  TimeGuidanceEmbedding(int64_t channels, int64_t dim, bool guidance, const at::TensorOptions& options);
  // `timestep` and `guidance` already scaled by 1000 in the hidden dtype; guidance may be undefined.
  at::Tensor forward(const at::Tensor& timestep, const at::Tensor& guidance) const;

  std::shared_ptr<MLPEmbedding> timestep_embedder, guidance_embedder;  // guidance_embedder: null without

 private:
  int64_t channels_;
};

// One shared modulation: linear(SiLU(temb)) -> sets x (shift, scale, gate), each (B, D).
class Flux2Modulation : public torch::nn::Module {
 public:
  Flux2Modulation(int64_t dim, int64_t sets, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& temb) const { return linear->forward(at::silu(temb)); }

  std::shared_ptr<Linear> linear;
};

// SwiGLU feed-forward: linear_in (dim -> 2 x hidden), SiLU(first half) x second half, linear_out.
class Flux2FeedForward : public torch::nn::Module {
 public:
  Flux2FeedForward(int64_t dim, int64_t hidden, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;

  std::shared_ptr<Linear> linear_in, linear_out;
};

// SiLU(x[..., :half]) * x[..., half:].
at::Tensor swiglu(const at::Tensor& x);

// A double-stream block: image and text streams with their own norms, q/k/v
// and SwiGLU MLPs, one joint attention over [text | image].
class Flux2DoubleBlock : public torch::nn::Module {
 public:
  Flux2DoubleBlock(const Flux2Config& config, AttentionBackend backend, const at::TensorOptions& options);
  // {x (B, N, D), c (B, L, D), image modulation (B, 6D), text modulation
  // (B, 6D), image cos, image sin, text cos, text sin} -> {c, x}.
  Tensors forward(const Tensors& inputs, Tap* tap = nullptr, const std::string& module = {});

  std::shared_ptr<Attention> attn;
  std::shared_ptr<Flux2FeedForward> ff, ff_context;

 private:
  double eps_;
};

// The single-stream block's `attn`: one projection makes q, k, v and the
// MLP's SwiGLU input; one projection takes [attention | MLP] back to D.
class Flux2ParallelAttention : public torch::nn::Module {
 public:
  Flux2ParallelAttention(const Flux2Config& config, AttentionBackend backend, const at::TensorOptions& options);
  // x (B, T, D) with RoPE tables (T, head_dim) -> (B, T, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;

  std::shared_ptr<Linear> to_qkv_mlp_proj, to_out;
  std::shared_ptr<RMSNorm> norm_q, norm_k;

 private:
  int64_t heads_, head_dim_, mlp_hidden_;
  AttentionBackend backend_;
};

class Flux2SingleBlock : public torch::nn::Module {
 public:
  Flux2SingleBlock(const Flux2Config& config, AttentionBackend backend, const at::TensorOptions& options);
  // {h (B, L+N, D) text first, modulation (B, 3D), cos, sin} -> {h}.
  Tensors forward(const Tensors& inputs) const;

  std::shared_ptr<Flux2ParallelAttention> attn;

 private:
  double eps_;
};

}  // namespace ditrl::models
