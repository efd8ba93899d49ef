#include <ditrl/error.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/norms.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

namespace {

// ltx_core get_ada_values: rows [begin, begin + count) of `table` (cast to the
// timestep dtype) plus the matching rows of the AdaLN output (B, T', rows * D).
std::vector<at::Tensor> ada_values(const at::Tensor& table, const at::Tensor& timestep, int64_t begin, int64_t count) {
  const int64_t rows = table.size(0);
  const at::Tensor t = timestep.reshape({timestep.size(0), timestep.size(1), rows, -1}).slice(2, begin, begin + count);
  const at::Tensor sum = table.slice(0, begin, begin + count).unsqueeze(0).unsqueeze(0).to(timestep.scalar_type()) + t;
  return sum.unbind(2);
}

// ltx_core get_av_ca_ada_values: (scale, shift) from rows `begin`, `begin + 1`
// of the first four table rows with the A/V scale-shift AdaLN, and the gate
// from row 4 with the gate AdaLN.
struct AvModulation {
  at::Tensor scale, shift, gate;
};
AvModulation av_values(const at::Tensor& table, const at::Tensor& scale_shift, const at::Tensor& gate, int64_t begin) {
  const std::vector<at::Tensor> ss = ada_values(table.slice(0, 0, 4), scale_shift, begin, 2);
  const std::vector<at::Tensor> g = ada_values(table.slice(0, 4), gate, 0, 1);
  return {ss[0], ss[1], g[0]};
}

at::Tensor rms(const at::Tensor& x, double eps) {
  return rms_norm(x, {}, eps, RmsFlavour::Torch);
}

}  // namespace

LtxAttention::LtxAttention(int64_t query_dim, int64_t context_dim, int64_t heads, int64_t head_dim, double eps,
                           bool gated, AttentionBackend backend, const at::TensorOptions& options)
    : heads_(heads), head_dim_(head_dim), backend_(backend) {
  const int64_t inner = heads * head_dim;
  q_norm = register_module("q_norm", std::make_shared<RMSNorm>(inner, eps, RmsFlavour::Torch, options));
  k_norm = register_module("k_norm", std::make_shared<RMSNorm>(inner, eps, RmsFlavour::Torch, options));
  to_q = register_module("to_q", std::make_shared<Linear>(query_dim, inner, true, options));
  to_k = register_module("to_k", std::make_shared<Linear>(context_dim, inner, true, options));
  to_v = register_module("to_v", std::make_shared<Linear>(context_dim, inner, true, options));
  if (gated)
    to_gate_logits = register_module("to_gate_logits", std::make_shared<Linear>(query_dim, heads, true, options));
  auto out = register_module("to_out", std::make_shared<Container>());
  to_out = out->register_module("0", std::make_shared<Linear>(inner, query_dim, true, options));
}

at::Tensor LtxAttention::forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& mask,
                                 const RopeTables* pe, const RopeTables* k_pe, const Ulysses* ulysses) const {
  const at::Tensor v = to_v->forward(context);
  at::Tensor q = q_norm->forward(to_q->forward(x));
  at::Tensor k = k_norm->forward(to_k->forward(context));
  if (pe) {
    q = apply_ltx_rope(q, *pe);
    k = apply_ltx_rope(k, k_pe ? *k_pe : *pe);
  }
  // PytorchAttention: (B, L, H*Dh) -> (B, H, L, Dh) views, masks get batch and head dims.
  const int64_t b = x.size(0);
  const auto heads = [&](const at::Tensor& t) { return t.view({b, -1, heads_, head_dim_}).transpose(1, 2); };
  at::Tensor m = mask;
  if (m.defined() && m.dim() == 2) m = m.unsqueeze(0);
  if (m.defined() && m.dim() == 3) m = m.unsqueeze(1);
  at::Tensor out = ulysses ? ulysses->heads_to_tokens(scaled_dot_product_attention(
                                 ulysses->tokens_to_heads(heads(q)), ulysses->tokens_to_heads(heads(k)),
                                 ulysses->tokens_to_heads(heads(v)), m, backend_))
                           : scaled_dot_product_attention(heads(q), heads(k), heads(v), m, backend_);
  out = out.transpose(1, 2).reshape({b, -1, heads_ * head_dim_});
  if (to_gate_logits) {
    const at::Tensor gates = 2.0 * at::sigmoid(to_gate_logits->forward(x));  // (B, T, H)
    const int64_t t = out.size(1);
    out = (out.view({b, t, heads_, head_dim_}) * gates.unsqueeze(-1)).view({b, t, heads_ * head_dim_});
  }
  return to_out->forward(out);
}

void LtxStream::append_to(Tensors& out) const {
  out.insert(out.end(), {x, timestep, prompt_timestep, context, context_mask, self_mask, pe.cos, pe.sin, cross_pe.cos,
                         cross_pe.sin, cross_scale_shift, cross_gate});
}

LtxStream LtxStream::from(const Tensors& in, size_t o) {
  if (in.size() < o + kTensors) fail("ltx block: {} input tensors, expected at least {}", in.size(), o + kTensors);
  LtxStream s;
  s.x = in[o];
  s.timestep = in[o + 1];
  s.prompt_timestep = in[o + 2];
  s.context = in[o + 3];
  s.context_mask = in[o + 4];
  s.self_mask = in[o + 5];
  s.pe = {in[o + 6], in[o + 7]};
  s.cross_pe = {in[o + 8], in[o + 9]};
  s.cross_scale_shift = in[o + 10];
  s.cross_gate = in[o + 11];
  return s;
}

LtxBlock::LtxBlock(const LtxConfig& c, AttentionBackend backend, const at::TensorOptions& options) : config_(c) {
  const int64_t dim = c.inner_dim();
  const bool gated = c.apply_gated_attention;
  const auto attention = [&](const char* name, int64_t query, int64_t context, int64_t heads, int64_t head_dim) {
    return register_module(
        name, std::make_shared<LtxAttention>(query, context, heads, head_dim, c.norm_eps, gated, backend, options));
  };
  attn1 = attention("attn1", dim, dim, c.num_attention_heads, c.attention_head_dim);
  attn2 = attention("attn2", dim, c.cross_attention_dim, c.num_attention_heads, c.attention_head_dim);
  ff = register_module("ff", std::make_shared<FeedForward>(dim, 4 * dim, dim, c.ff_bias, options));
  scale_shift_table = register_parameter("scale_shift_table", at::empty({c.adaln_rows(), dim}, options));
  if (c.audio) {
    const int64_t adim = c.audio_inner_dim();
    audio_attn1 = attention("audio_attn1", adim, adim, c.audio_num_attention_heads, c.audio_attention_head_dim);
    audio_attn2 = attention("audio_attn2", adim, c.audio_cross_attention_dim, c.audio_num_attention_heads,
                            c.audio_attention_head_dim);
    audio_ff =
        register_module("audio_ff", std::make_shared<FeedForward>(adim, 4 * adim, adim, c.audio_ff_bias, options));
    audio_scale_shift_table = register_parameter("audio_scale_shift_table", at::empty({c.adaln_rows(), adim}, options));
    // Both A/V attentions use the audio heads: q from one stream, k/v from the other.
    audio_to_video_attn =
        attention("audio_to_video_attn", dim, adim, c.audio_num_attention_heads, c.audio_attention_head_dim);
    video_to_audio_attn =
        attention("video_to_audio_attn", adim, dim, c.audio_num_attention_heads, c.audio_attention_head_dim);
    scale_shift_table_a2v_ca_audio =
        register_parameter("scale_shift_table_a2v_ca_audio", at::empty({5, adim}, options));
    scale_shift_table_a2v_ca_video = register_parameter("scale_shift_table_a2v_ca_video", at::empty({5, dim}, options));
  }
  if (c.cross_attention_adaln) {
    prompt_scale_shift_table = register_parameter("prompt_scale_shift_table", at::empty({2, dim}, options));
    if (c.audio)
      audio_prompt_scale_shift_table =
          register_parameter("audio_prompt_scale_shift_table", at::empty({2, c.audio_inner_dim()}, options));
  }
}

// ltx_core _apply_text_cross_attention / apply_cross_attention_adaln.
at::Tensor LtxBlock::text_cross_attention(const at::Tensor& x, const LtxStream& s, const LtxAttention& attn,
                                          const at::Tensor& table, const at::Tensor& prompt_table,
                                          const std::function<void(const at::Tensor&)>& record) const {
  if (!config_.cross_attention_adaln) {
    const at::Tensor out = attn.forward(rms(x, config_.norm_eps), s.context, s.context_mask, {}, {});
    record(out);
    return out;
  }
  const std::vector<at::Tensor> q = ada_values(table, s.timestep, 6, 3);  // shift_q, scale_q, gate
  const int64_t b = x.size(0);
  const std::vector<at::Tensor> kv = (prompt_table.unsqueeze(0).unsqueeze(0).to(x.scalar_type()) +
                                      s.prompt_timestep.reshape({b, s.prompt_timestep.size(1), 2, -1}))
                                         .unbind(2);  // shift_kv, scale_kv
  const at::Tensor query = rms(x, config_.norm_eps) * (1 + q[1]) + q[0];
  const at::Tensor context = s.context * (1 + kv[1]) + kv[0];
  const at::Tensor out = attn.forward(query, context, s.context_mask, {}, {});
  record(out);
  return out * q[2];
}

std::pair<at::Tensor, at::Tensor> LtxBlock::forward(const LtxStream& v, const LtxStream* a, Tap* tap,
                                                    const std::string& module, const Ulysses* ulysses) const {
  // Parity dump points: built only when a tap listens.
  const auto record = [tap, &module](const char* sub, const at::Tensor& value) {
    if (tap) ForwardContext{nullptr, tap}.record(module + sub, "out0", value);
  };
  const auto recorder = [&record](const char* sub) {
    return [&record, sub](const at::Tensor& value) { record(sub, value); };
  };
  const double eps = config_.norm_eps;
  at::Tensor vx = v.x;
  at::Tensor ax = a ? a->x : at::Tensor();
  {
    const std::vector<at::Tensor> m = ada_values(scale_shift_table, v.timestep, 0, 3);  // shift, scale, gate
    const at::Tensor norm = rms(vx, eps) * (1 + m[1]) + m[0];
    record(".norm1", norm);
    const at::Tensor attn = attn1->forward(norm, norm, v.self_mask, &v.pe, nullptr, ulysses);
    record(".attn1", attn);
    vx = vx + attn * m[2];
    vx = vx + text_cross_attention(vx, v, *attn2, scale_shift_table, prompt_scale_shift_table, recorder(".attn2"));
  }
  if (a) {
    const std::vector<at::Tensor> m = ada_values(audio_scale_shift_table, a->timestep, 0, 3);
    const at::Tensor norm = rms(ax, eps) * (1 + m[1]) + m[0];
    record(".audio_norm1", norm);
    const at::Tensor attn = audio_attn1->forward(norm, norm, a->self_mask, &a->pe, nullptr);
    record(".audio_attn1", attn);
    ax = ax + attn * m[2];
    ax = ax + text_cross_attention(ax, *a, *audio_attn2, audio_scale_shift_table, audio_prompt_scale_shift_table,
                                   recorder(".audio_attn2"));

    // Both directions read the streams as they were before either update.
    const at::Tensor vn = rms(vx, eps);
    const at::Tensor an = rms(ax, eps);
    {  // audio -> video: rows 0, 1 of both tables, the video gate
      const AvModulation mv = av_values(scale_shift_table_a2v_ca_video, v.cross_scale_shift, v.cross_gate, 0);
      const at::Tensor vq = vn * (1 + mv.scale) + mv.shift;
      const AvModulation ma = av_values(scale_shift_table_a2v_ca_audio, a->cross_scale_shift, a->cross_gate, 0);
      const at::Tensor akv = an * (1 + ma.scale) + ma.shift;
      const at::Tensor attn = audio_to_video_attn->forward(vq, akv, {}, &v.cross_pe, &a->cross_pe);
      record(".audio_to_video_attn", attn);
      vx = vx + attn * mv.gate;
    }
    {  // video -> audio: rows 2, 3, the audio gate
      const AvModulation ma = av_values(scale_shift_table_a2v_ca_audio, a->cross_scale_shift, a->cross_gate, 2);
      const at::Tensor aq = an * (1 + ma.scale) + ma.shift;
      const AvModulation mv = av_values(scale_shift_table_a2v_ca_video, v.cross_scale_shift, v.cross_gate, 2);
      const at::Tensor vkv = vn * (1 + mv.scale) + mv.shift;
      const at::Tensor attn = video_to_audio_attn->forward(aq, vkv, {}, &a->cross_pe, &v.cross_pe);
      record(".video_to_audio_attn", attn);
      ax = ax + attn * ma.gate;
    }
  }
  {
    const std::vector<at::Tensor> m = ada_values(scale_shift_table, v.timestep, 3, 3);
    vx = vx + ff->forward(rms(vx, eps) * (1 + m[1]) + m[0]) * m[2];
  }
  if (a) {
    const std::vector<at::Tensor> m = ada_values(audio_scale_shift_table, a->timestep, 3, 3);
    ax = ax + audio_ff->forward(rms(ax, eps) * (1 + m[1]) + m[0]) * m[2];
  }
  return {vx, ax};
}

}  // namespace ditrl::models
