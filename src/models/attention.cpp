#include <ditrl/error.hpp>
#include <ditrl/models/attention.hpp>

#include <ditrl/cuda_build.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "fused_attention.hpp"

namespace ditrl::models {

namespace {

// The reference harness's math SDPA: half inputs are computed in fp32 and the
// result cast back, a bool mask puts -inf where it is false, a float mask is added.
at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const c10::ScalarType dtype = q.scalar_type();
  const bool half = precision::is_half(dtype);
  const auto up = [half](const at::Tensor& t) { return half ? t.to(at::kFloat) : t; };
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(up(q), up(k).transpose(-2, -1)) * scale;
  if (mask.defined()) {
    if (mask.scalar_type() == at::kBool)
      scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
    else
      scores = scores + mask.to(scores.scalar_type());
  }
  at::Tensor out = at::matmul(at::softmax(scores, -1), up(v));
  return half ? out.to(dtype) : out;
}

}  // namespace

AttentionBackend usable_attention_backend(AttentionBackend backend) {
  if (!kCudaBuild && !runs_on_cpu(backend))
    fail("attention backend '{}' runs on CUDA only and this build of ditrl is CPU-only; use \"math\" or \"flash\"",
         name_of(kAttentionNames, backend));
  return backend;
}

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& mask, AttentionBackend backend) {
  if (backend == AttentionBackend::Math) return math_attention(q, k, v, mask);
  return fused_attention(q, k, v, mask, backend);
}

Attention::Attention(const AttentionConfig& config, const at::TensorOptions& options) : config_(config) {
  const int64_t inner = config.heads * config.head_dim;
  const int64_t kv_dim = config.kv_dim > 0 ? config.kv_dim : config.dim;
  const int64_t out_dim = config.out_dim > 0 ? config.out_dim : config.dim;
  to_q = register_module("to_q", std::make_shared<Linear>(config.dim, inner, config.bias, options));
  to_k = register_module("to_k", std::make_shared<Linear>(kv_dim, inner, config.bias, options));
  to_v = register_module("to_v", std::make_shared<Linear>(kv_dim, inner, config.bias, options));
  const int64_t norm_dim = config.qk_norm == QKNorm::AcrossHeads ? inner : config.head_dim;
  const auto norm = [&](const char* name) {
    return register_module(name, std::make_shared<RMSNorm>(norm_dim, config.eps, config.rms_flavour, options));
  };
  if (config.qk_norm != QKNorm::None) {
    norm_q = norm("norm_q");
    norm_k = norm("norm_k");
  }
  if (config.joint) {
    add_q_proj = register_module("add_q_proj", std::make_shared<Linear>(config.dim, inner, config.bias, options));
    add_k_proj = register_module("add_k_proj", std::make_shared<Linear>(config.dim, inner, config.bias, options));
    add_v_proj = register_module("add_v_proj", std::make_shared<Linear>(config.dim, inner, config.bias, options));
    if (config.qk_norm != QKNorm::None) {
      norm_added_q = norm("norm_added_q");
      norm_added_k = norm("norm_added_k");
    }
  }
  if (!config.pre_only) {
    auto out = register_module("to_out", std::make_shared<Container>());
    to_out = out->register_module("0", std::make_shared<Linear>(inner, out_dim, config.bias, options));
  }
  if (config.joint && config.context_out)
    to_add_out = register_module("to_add_out", std::make_shared<Linear>(inner, out_dim, config.bias, options));
}

// Mirrors diffusers' processors: project, (norm across heads), split heads as
// a (B, H, L, Dh) view, (norm per head), rotate.
Attention::QKV Attention::project(const Linear& q_proj, const Linear& k_proj, const Linear& v_proj,
                                  const RMSNorm* q_norm, const RMSNorm* k_norm, const at::Tensor& x,
                                  const at::Tensor& kv, const QKRotary& rotary) const {
  QKV out{q_proj.forward(x), k_proj.forward(kv), v_proj.forward(kv)};
  const bool across = config_.qk_norm == QKNorm::AcrossHeads;
  if (across && q_norm) {
    out.q = q_norm->forward(out.q);
    out.k = k_norm->forward(out.k);
  }
  const int64_t batch = x.size(0);
  const auto split = [&](const at::Tensor& t) {
    return t.view({batch, -1, config_.heads, config_.head_dim}).transpose(1, 2);
  };
  out.q = split(out.q);
  out.k = split(out.k);
  out.v = split(out.v);
  if (!across && q_norm) {
    out.q = q_norm->forward(out.q);
    out.k = k_norm->forward(out.k);
  }
  if (rotary) rotary(out.q, out.k);
  return out;
}

at::Tensor Attention::attend(const QKV& qkv, const at::Tensor& mask, const Ulysses* ulysses) const {
  at::Tensor out;
  if (ulysses) {
    out = scaled_dot_product_attention(ulysses->tokens_to_heads(qkv.q), ulysses->tokens_to_heads(qkv.k),
                                       ulysses->tokens_to_heads(qkv.v), mask, config_.backend);
    out = ulysses->heads_to_tokens(out);
  } else {
    out = scaled_dot_product_attention(qkv.q, qkv.k, qkv.v, mask, config_.backend);
  }
  return out.transpose(1, 2).reshape({qkv.q.size(0), -1, config_.heads * config_.head_dim}).to(qkv.q.scalar_type());
}

at::Tensor Attention::self_attention(const at::Tensor& x, const at::Tensor& mask, const QKRotary& rotary,
                                     const Ulysses* ulysses) {
  const QKV qkv = project(*to_q, *to_k, *to_v, norm_q.get(), norm_k.get(), x, x, rotary);
  const at::Tensor out = attend(qkv, mask, ulysses);
  return to_out ? to_out->forward(out) : out;
}

at::Tensor Attention::cross_attention(const at::Tensor& x, const at::Tensor& context, const at::Tensor& mask) {
  const QKV qkv = project(*to_q, *to_k, *to_v, norm_q.get(), norm_k.get(), x, context, {});
  return to_out->forward(attend(qkv, mask));
}

std::pair<at::Tensor, at::Tensor> Attention::joint_attention(const at::Tensor& x, const at::Tensor& c,
                                                             const at::Tensor& mask, const QKRotary& rotary_x,
                                                             const QKRotary& rotary_c) {
  if (!config_.joint) fail("joint attention needs the add_q/k/v projections (AttentionConfig::joint)");
  const QKV img = project(*to_q, *to_k, *to_v, norm_q.get(), norm_k.get(), x, x, rotary_x);
  const QKV txt =
      project(*add_q_proj, *add_k_proj, *add_v_proj, norm_added_q.get(), norm_added_k.get(), c, c, rotary_c);
  const bool image_first = config_.order == JointOrder::ImageFirst;
  const QKV& first = image_first ? img : txt;
  const QKV& second = image_first ? txt : img;
  const QKV joint{at::cat({first.q, second.q}, 2), at::cat({first.k, second.k}, 2), at::cat({first.v, second.v}, 2)};
  const at::Tensor out = attend(joint, mask);
  const int64_t split = image_first ? x.size(1) : c.size(1);
  const at::Tensor head = out.slice(1, 0, split);
  const at::Tensor tail = out.slice(1, split);
  const at::Tensor x_out = to_out->forward(image_first ? head : tail);
  at::Tensor c_out;
  if (to_add_out) c_out = to_add_out->forward(image_first ? tail : head);
  return {x_out, c_out};
}

}  // namespace ditrl::models
