#pragma once

// Scaled dot-product attention and the diffusers-style Attention module
// (docs/families.md §0.6): self-, cross- and joint (image+text) attention with
// optional q/k RMSNorm per head or across heads, an optional mask and an
// optional rotary hook on q/k.

#include <ditrl/models/attention_backend.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/norms.hpp>
#include <ditrl/models/ulysses.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace ditrl::models {

// `backend` itself, or an error saying which build has it when this build lacks it.
AttentionBackend usable_attention_backend(AttentionBackend backend);

// softmax(q k^T / sqrt(Dh) + mask) v for q (B, H, Lq, Dh), k and v (B, H, Lk, Dh).
// `mask` is undefined (none), bool (true = attend) or additive float,
// broadcastable to (B, H, Lq, Lk). Callers pass a mask only when it masks
// something: an all-true mask changes the fused kernel (docs/algorithms.md §9.6).
at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& mask, AttentionBackend backend);

enum class QKNorm {
  None,
  PerHead,     // RMSNorm over Dh (SD3.5, Qwen-Image): weight [Dh]
  AcrossHeads  // RMSNorm over H*Dh before the head split (Wan, LTX): weight [H*Dh]
};

// Order of the two streams inside joint attention (SD3 image first, Qwen text first).
enum class JointOrder { ImageFirst, TextFirst };

struct AttentionConfig {
  int64_t dim = 0;  // query input width
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t kv_dim = 0;   // key/value input width for cross-attention; 0 = dim
  int64_t out_dim = 0;  // 0 = dim
  bool bias = true;
  QKNorm qk_norm = QKNorm::None;
  RmsFlavour rms_flavour = RmsFlavour::Diffusers;
  double eps = 1e-6;
  bool joint = false;       // add_q/k/v_proj (+ norm_added_q/k) for a second (text) stream
  bool context_out = true;  // to_add_out; false in a context_pre_only block
  // No to_out: self_attention returns the heads' output unprojected (FLUX.1's
  // single-stream blocks project it together with their MLP).
  bool pre_only = false;
  JointOrder order = JointOrder::ImageFirst;
  AttentionBackend backend = AttentionBackend::Math;
};

// Rotates q and k (B, H, L, Dh) of one stream after their norms (RoPE).
using QKRotary = std::function<void(at::Tensor& q, at::Tensor& k)>;

class Attention : public torch::nn::Module {
 public:
  Attention(const AttentionConfig& config, const at::TensorOptions& options);

  // With `ulysses`, x holds this rank's tokens of the sequence (and `rotary`
  // rotates them); q/k/v go through an all-to-all to a head split, attention
  // runs over the whole sequence, and the output comes back to the token
  // split. A mask then covers the whole sequence and broadcasts over heads.
  at::Tensor self_attention(const at::Tensor& x, const at::Tensor& mask = {}, const QKRotary& rotary = {},
                            const Ulysses* ulysses = nullptr);
  at::Tensor cross_attention(const at::Tensor& x, const at::Tensor& context, const at::Tensor& mask = {});
  // Image stream x (B, Lx, D) and text stream c (B, Lc, D) attend jointly;
  // `mask` covers the concatenated sequence in config.order. Returns
  // (x_out, c_out); c_out is undefined without to_add_out.
  std::pair<at::Tensor, at::Tensor> joint_attention(const at::Tensor& x, const at::Tensor& c,
                                                    const at::Tensor& mask = {}, const QKRotary& rotary_x = {},
                                                    const QKRotary& rotary_c = {});

  std::shared_ptr<Linear> to_q, to_k, to_v, to_out;  // to_out is `to_out.0` (none when pre_only)
  std::shared_ptr<Linear> add_q_proj, add_k_proj, add_v_proj, to_add_out;
  std::shared_ptr<RMSNorm> norm_q, norm_k, norm_added_q, norm_added_k;

 private:
  struct QKV {
    at::Tensor q, k, v;  // (B, H, L, Dh)
  };
  QKV project(const Linear& q_proj, const Linear& k_proj, const Linear& v_proj, const RMSNorm* q_norm,
              const RMSNorm* k_norm, const at::Tensor& x, const at::Tensor& kv, const QKRotary& rotary) const;
  // -> (B, L, H*Dh); with `ulysses`, over the group's whole sequence.
  at::Tensor attend(const QKV& qkv, const at::Tensor& mask, const Ulysses* ulysses = nullptr) const;

  AttentionConfig config_;
};

}  // namespace ditrl::models
