#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/embeddings.hpp>

#include <algorithm>
#include <set>

namespace ditrl::models {

namespace {

// Per-token widths, in units of D elements of the forward dtype, counted
// from the blocks (SD3's JointTransformerBlock, Qwen-Image's dual-stream
// block, Wan's and LTX's self + cross-attention blocks) and rounded up to
// what measured runs showed (benchmarks/results/real_size.md).
//
// Rollout forward, at the attention: the block's inputs, the norm and its
// modulated copy, q/k/v, their joint concatenation (or rotated copies), the
// attention output: ~10 D.
constexpr int64_t kForwardAttentionWidth = 10;
// Rollout forward, at the FFN: the residual stream, the norm, its modulated
// copy and the FFN output (~4 D), plus the hidden layer before and after its
// activation (2 F, counted apart).
constexpr int64_t kForwardFfnWidth = 4;
// A recomputed block's autograd graph plus the gradients in flight during
// its backward: every intermediate above is saved (norms before and after
// modulation, q/k/v before and after their norms and rotation, the
// concatenations, the attention output before and after the output
// projection, the residual sums), and backward adds the gradients of the
// stream and of q/k/v: ~24 D, plus the FFN's 2 F.
constexpr int64_t kGraphWidth = 24;
// Score-sized fp32 tensors (B x H x T x T). Forward: the product and its
// scaled copy, then the softmax beside the scaled scores (2 at once; a mask
// adds its masked copy). Training: the saved probabilities, and in backward
// their gradient and the softmax's gradient (3).
constexpr int64_t kForwardScoreCopies = 2;
constexpr int64_t kTrainingScoreCopies = 3;
// Cross-attention (Wan, LTX): per text token, k and v, and in training
// also before their norm, with the gradients of backward: 2 D forward, 4 D
// in the graph (plus the math backend's fp32 copies of k and v).
constexpr int64_t kForwardTextWidth = 2;
constexpr int64_t kGraphTextWidth = 4;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Bytes of the fp32 copies the math backend makes of half-precision q, k, v
// and of its fp32 output, per token and D.
int64_t upcast_bytes(const ActivationOptions& o) {
  return o.math_attention && o.element_bytes < 4 ? 4 * 4 : 0;
}

// The same for k and v of the text in a cross-attention.
int64_t text_upcast_bytes(const ActivationOptions& o) {
  return o.math_attention && o.element_bytes < 4 ? 2 * 4 : 0;
}

// Score bytes of one attention over `queries` x `keys` for H/N heads.
int64_t scores(const ActivationOptions& o, int64_t heads, int64_t queries, int64_t keys) {
  if (!o.math_attention) return 4 * o.batch * heads * queries * 2;  // fused kernels: log-sum-exp rows
  return 4 * o.batch * heads * queries * keys;
}

}  // namespace

ActivationEstimate estimate_forward(const ActivationGeometry& g, const ActivationOptions& o) {
  const int64_t n = o.sequence_parallel;
  const int64_t local = ceil_div(g.stream_tokens(), n);  // tokens of this rank through the block
  const int64_t heads = g.heads / n;
  const int64_t row = o.batch * local;                 // token rows of this rank
  const int64_t attention_tokens = g.stream_tokens();  // joint: image and text
  const int64_t copies = kForwardScoreCopies + (g.masked ? 1 : 0);
  int64_t at_attention_block = row * g.dim * (kForwardAttentionWidth * o.element_bytes + upcast_bytes(o));
  int64_t at_attention_scores = copies * scores(o, heads, attention_tokens, attention_tokens);
  if (!g.joint) {
    // The cross-attention's moment, when larger: besides the stream, the
    // text's k and v and the scores of the local queries over every text
    // token for all heads.
    const int64_t text = o.batch * g.text_tokens * g.dim * (kForwardTextWidth * o.element_bytes + text_upcast_bytes(o));
    const int64_t cross = copies * scores(o, g.heads, local, g.text_tokens);
    if (text + cross > at_attention_scores) {
      at_attention_block += text;
      at_attention_scores = cross;
    }
  }
  const int64_t at_ffn = row * (kForwardFfnWidth * g.dim + 2 * g.ffn_dim) * o.element_bytes;
  ActivationEstimate e;
  if (at_attention_block + at_attention_scores >= at_ffn) {
    e.block = at_attention_block;
    e.attention = at_attention_scores;
  } else {
    e.block = at_ffn;
  }
  return e;
}

ActivationEstimate estimate_training(const ActivationGeometry& g, const ActivationOptions& o) {
  const int64_t n = o.sequence_parallel;
  const int64_t local = ceil_div(g.stream_tokens(), n);
  const int64_t heads = g.heads / n;
  const int64_t row = o.batch * local;
  ActivationEstimate e;
  // Every block's input stream (joint: image and text), plus the text
  // states the cross-attention blocks all read (one tensor).
  e.saved_inputs = g.blocks * row * g.dim * o.element_bytes;
  if (!g.joint) e.saved_inputs += o.batch * g.text_tokens * g.dim * o.element_bytes;
  // One recomputed block: its graph and the gradients of its backward.
  e.block = row * (g.dim * (kGraphWidth * o.element_bytes + upcast_bytes(o)) + 2 * g.ffn_dim * o.element_bytes);
  if (!g.joint) e.block += o.batch * g.text_tokens * g.dim * (kGraphTextWidth * o.element_bytes + text_upcast_bytes(o));
  const int64_t copies = kTrainingScoreCopies + (g.masked ? 1 : 0);
  e.attention = copies * scores(o, heads, g.stream_tokens(), g.stream_tokens());
  if (g.image_only_attention) e.attention += scores(o, heads, g.tokens, g.tokens);  // its saved probabilities
  if (!g.joint) e.attention += copies * scores(o, g.heads, ceil_div(g.tokens, n), g.text_tokens);  // cross
  if (!o.recompute) {
    // parallel.recompute = false: every block's forward graph lives until its backward, and one copy of its
    // scores (the probabilities); the block in backward holds the full peak. How much of a recomputed
    // block's peak a kept graph holds is measured, not counted (benchmarks/results/real_size.md): with the
    // math backend about half (LoRA runs on the CPU: 1.07-1.37x of the prediction, where the whole peak
    // predicted 1.4-1.9x too much); with a fused kernel all of it (the activations of full fine-tunes,
    // measured against half: 2.1x on an H200 for SD3.5-medium, 1.9x for Wan2.1-1.3B; on the CPU 1.3x for SD3,
    // 2.2x for Wan).
    e.block += (g.blocks - 1) * (o.math_attention ? e.block / 2 : e.block);
    e.attention += (g.blocks - 1) * e.attention / copies;
  }
  return e;
}

int64_t held_buffer_bytes(const torch::nn::Module& model) {
  std::set<const c10::TensorImpl*> windowed;
  int64_t bytes = 0;
  for (const auto& m : model.named_modules()) {
    const auto* embed = dynamic_cast<const PatchEmbed*>(m.value().get());
    if (!embed || !embed->windowed()) continue;
    windowed.insert(embed->pos_embed.unsafeGetTensorImpl());
    bytes += static_cast<int64_t>(embed->window_values().nbytes());
  }
  for (const auto& b : model.named_buffers())
    if (!windowed.count(b.value().unsafeGetTensorImpl())) bytes += static_cast<int64_t>(b.value().nbytes());
  return bytes;
}

}  // namespace ditrl::models
