#include <ditrl/models/adaln.hpp>
#include <ditrl/models/flux2/flux2.hpp>
#include <ditrl/models/flux2/flux2_blocks.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

TimeGuidanceEmbedding::TimeGuidanceEmbedding(int64_t channels, int64_t dim, bool guidance,
                                             const at::TensorOptions& options)
    : channels_(channels) {
  timestep_embedder = register_module(
      "timestep_embedder", std::make_shared<MLPEmbedding>(channels, dim, dim, Activation::SiLU, options, false));
  if (guidance)
    guidance_embedder = register_module(
        "guidance_embedder", std::make_shared<MLPEmbedding>(channels, dim, dim, Activation::SiLU, options, false));
}

at::Tensor TimeGuidanceEmbedding::forward(const at::Tensor& timestep, const at::Tensor& guidance) const {
  SinusoidOptions sinusoid;
  sinusoid.dim = channels_;
  // The sinusoid is fp32; its result goes back to the scaled input's dtype.
  at::Tensor emb = timestep_embedder->forward(timestep_sinusoid(timestep, sinusoid).to(timestep.scalar_type()));
  if (guidance.defined() && guidance_embedder)
    emb = emb + guidance_embedder->forward(timestep_sinusoid(guidance, sinusoid).to(guidance.scalar_type()));
  return emb;
}

Flux2Modulation::Flux2Modulation(int64_t dim, int64_t sets, const at::TensorOptions& options) {
  linear = register_module("linear", std::make_shared<Linear>(dim, 3 * sets * dim, false, options));
}

at::Tensor swiglu(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::silu(x.slice(-1, 0, half)) * x.slice(-1, half);
}

Flux2FeedForward::Flux2FeedForward(int64_t dim, int64_t hidden, const at::TensorOptions& options) {
  linear_in = register_module("linear_in", std::make_shared<Linear>(dim, 2 * hidden, false, options));
  linear_out = register_module("linear_out", std::make_shared<Linear>(hidden, dim, false, options));
}

at::Tensor Flux2FeedForward::forward(const at::Tensor& x) const {
  return linear_out->forward(swiglu(linear_in->forward(x)));
}

Flux2DoubleBlock::Flux2DoubleBlock(const Flux2Config& config, AttentionBackend backend,
                                   const at::TensorOptions& options)
    : eps_(config.eps) {
  const int64_t dim = config.inner_dim();
  AttentionConfig ac;
  ac.dim = dim;
  ac.heads = config.num_attention_heads;
  ac.head_dim = config.attention_head_dim;
  ac.bias = false;
  ac.qk_norm = QKNorm::PerHead;
  ac.rms_flavour = RmsFlavour::Torch;  // torch.nn.RMSNorm
  ac.eps = config.eps;
  ac.joint = true;
  ac.context_out = true;
  ac.order = JointOrder::TextFirst;
  ac.backend = backend;
  attn = register_module("attn", std::make_shared<Attention>(ac, options));
  ff = register_module("ff", std::make_shared<Flux2FeedForward>(dim, config.mlp_hidden_dim(), options));
  ff_context = register_module("ff_context", std::make_shared<Flux2FeedForward>(dim, config.mlp_hidden_dim(), options));
}

// diffusers Flux2TransformerBlock.forward, op for op.
Tensors Flux2DoubleBlock::forward(const Tensors& inputs, Tap* tap, const std::string& module) {
  const at::Tensor& x = inputs.at(0);
  const at::Tensor& c = inputs.at(1);
  // (shift, scale, gate) for attention, then for the MLP.
  const std::vector<at::Tensor> im = inputs.at(2).chunk(6, -1);
  const std::vector<at::Tensor> tm = inputs.at(3).chunk(6, -1);
  // RoPE rotates each token by its own ids, so rotating each stream before
  // the text-first concatenation gives the joint sequence's values.
  const auto rotary = [](const at::Tensor& cos, const at::Tensor& sin) -> QKRotary {
    return [cos, sin](at::Tensor& q, at::Tensor& k) {
      q = FluxRope::apply(q.transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1)).transpose(1, 2);
      k = FluxRope::apply(k.transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1)).transpose(1, 2);
    };
  };
  const at::Tensor img_modulated = modulate(layer_norm(x, eps_), im[0], im[1]);
  const at::Tensor txt_modulated = modulate(layer_norm(c, eps_), tm[0], tm[1]);
  const auto record = [tap, &module](const char* sub, const at::Tensor& image, const at::Tensor& text) {
    if (!tap) return;
    const ForwardContext ctx{nullptr, tap};
    ctx.record(module + sub, "out0", image);
    ctx.record(module + sub, "out1", text);
  };
  // Parity dump points: the modulated attention inputs, then the attention outputs.
  record(".norm1", img_modulated, txt_modulated);
  const auto [img_attn, txt_attn] = attn->joint_attention(
      img_modulated, txt_modulated, {}, rotary(inputs.at(4), inputs.at(5)), rotary(inputs.at(6), inputs.at(7)));
  record(".attn", img_attn, txt_attn);
  at::Tensor h = x + im[2].unsqueeze(1) * img_attn;
  h = h + im[5].unsqueeze(1) * ff->forward(modulate(layer_norm(h, eps_), im[3], im[4]));
  at::Tensor e = c + tm[2].unsqueeze(1) * txt_attn;
  e = e + tm[5].unsqueeze(1) * ff_context->forward(modulate(layer_norm(e, eps_), tm[3], tm[4]));
  if (e.scalar_type() == at::kHalf) e = e.clip(-65504, 65504);
  return {e, h};
}

Flux2ParallelAttention::Flux2ParallelAttention(const Flux2Config& config, AttentionBackend backend,
                                               const at::TensorOptions& options)
    : heads_(config.num_attention_heads),
      head_dim_(config.attention_head_dim),
      mlp_hidden_(config.mlp_hidden_dim()),
      backend_(backend) {
  const int64_t dim = config.inner_dim();
  to_qkv_mlp_proj =
      register_module("to_qkv_mlp_proj", std::make_shared<Linear>(dim, 3 * dim + 2 * mlp_hidden_, false, options));
  norm_q = register_module("norm_q", std::make_shared<RMSNorm>(head_dim_, config.eps, RmsFlavour::Torch, options));
  norm_k = register_module("norm_k", std::make_shared<RMSNorm>(head_dim_, config.eps, RmsFlavour::Torch, options));
  to_out = register_module("to_out", std::make_shared<Linear>(dim + mlp_hidden_, dim, false, options));
}

// diffusers Flux2ParallelSelfAttnProcessor, op for op.
at::Tensor Flux2ParallelAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
  const int64_t inner = heads_ * head_dim_;
  const at::Tensor projected = to_qkv_mlp_proj->forward(x);
  const std::vector<at::Tensor> qkv = projected.slice(-1, 0, 3 * inner).chunk(3, -1);
  const at::Tensor mlp = projected.slice(-1, 3 * inner);
  // (B, T, H, Dh) as the reference holds them; attention reads (B, H, T, Dh).
  const auto heads = [this](const at::Tensor& t) { return t.unflatten(-1, {heads_, head_dim_}); };
  const at::Tensor q = FluxRope::apply(norm_q->forward(heads(qkv[0])), cos.unsqueeze(1), sin.unsqueeze(1));
  const at::Tensor k = FluxRope::apply(norm_k->forward(heads(qkv[1])), cos.unsqueeze(1), sin.unsqueeze(1));
  const at::Tensor v = heads(qkv[2]);
  at::Tensor out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, backend_);
  out = out.transpose(1, 2).flatten(2, 3).to(q.scalar_type());
  return to_out->forward(at::cat({out, swiglu(mlp)}, -1));
}

Flux2SingleBlock::Flux2SingleBlock(const Flux2Config& config, AttentionBackend backend,
                                   const at::TensorOptions& options)
    : eps_(config.eps) {
  attn = register_module("attn", std::make_shared<Flux2ParallelAttention>(config, backend, options));
}

// diffusers Flux2SingleTransformerBlock.forward (the concatenated stream).
Tensors Flux2SingleBlock::forward(const Tensors& inputs) const {
  const at::Tensor& h = inputs.at(0);
  const std::vector<at::Tensor> mod = inputs.at(1).chunk(3, -1);  // shift, scale, gate
  const at::Tensor attended = attn->forward(modulate(layer_norm(h, eps_), mod[0], mod[1]), inputs.at(2), inputs.at(3));
  at::Tensor out = h + mod[2].unsqueeze(1) * attended;
  if (out.scalar_type() == at::kHalf) out = out.clip(-65504, 65504);
  return {out};
}

}  // namespace ditrl::models
