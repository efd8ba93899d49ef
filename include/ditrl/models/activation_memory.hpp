#pragma once

// A model of the activation bytes one rank holds while a DiT runs, for
// `ditrl plan`'s prediction of a run's peak memory (app/memory_plan.hpp). Two
// phases:
//  - the rollout's forward (no autograd graph): one block's live tensors at
//    its largest moment, the attention scores or the FFN's hidden layer;
//  - the training step under ditrl's per-block recompute
//    (shard/unit_function.hpp): every block keeps only its inputs until
//    backward, then one block at a time rebuilds its autograd graph, and its
//    backward holds the softmax's gradient beside the probabilities.
// With Ulysses sequence parallelism over N ranks (models/ulysses.hpp) a rank
// holds T/N tokens through the blocks and H/N heads over all T tokens in
// attention, so every term scales as 1/N. The per-token widths are counted
// from the blocks' code and calibrated against measured runs
// (benchmarks/results/real_size.md); it is a model, not a measurement.

#include <ditrl/models/family.hpp>

#include <cstdint>
#include <optional>

namespace ditrl::models {

// The sizes the model reads, per sample.
struct ActivationGeometry {
  int64_t tokens = 0;       // image or video tokens (after patchify)
  int64_t text_tokens = 0;  // text tokens of the conditioning
  int64_t dim = 0, heads = 0, ffn_dim = 0, blocks = 0;
  // Text tokens run through every block beside the image tokens and join
  // its self-attention (SD3, Qwen-Image); otherwise the image tokens
  // cross-attend to them (Wan, LTX).
  bool joint = false;
  bool masked = false;                // the attention takes a mask (Qwen-Image's text mask): one more score copy
  bool image_only_attention = false;  // SD3.5's dual blocks: a second self-attention over the image tokens

  // Tokens every block carries (and attends over, when joint).
  int64_t stream_tokens() const { return joint ? tokens + text_tokens : tokens; }
};

// One phase's activation bytes on one rank.
struct ActivationEstimate {
  int64_t saved_inputs = 0;  // training: every block's inputs, kept until backward
  int64_t block = 0;         // one block's per-token tensors at the phase's largest moment
  int64_t attention = 0;     // the score-sized tensors (math backend: fp32, B x H/N x T x T each)
  int64_t total() const { return saved_inputs + block + attention; }
};

// What the estimate needs besides the geometry.
struct ActivationOptions {
  int64_t batch = 1;              // samples per forward (a CFG forward runs positive and negative: 2x)
  int64_t sequence_parallel = 1;  // Ulysses group size
  int64_t element_bytes = 2;      // the forward dtype's
  bool math_attention = true;     // the portable math backend materialises the scores; fused kernels keep O(T)
  bool recompute = true;          // training: one block's graph at a time (false: every block keeps its own)
};

// Every family's geometry at `grid`; nullopt for a family the model does not know.
// An image DiT whose blocks attend jointly over image patches and text
// (SD3, Qwen-Image): 2-D patches, a 4 x D FFN.
template <class Config>
ActivationGeometry joint_image_geometry(const Config& c, const LatentGrid& grid) {
  ActivationGeometry g;
  g.tokens = (grid.height / c.patch_size) * (grid.width / c.patch_size);
  g.text_tokens = c.text_tokens;
  g.dim = c.inner_dim();
  g.heads = c.num_attention_heads;
  g.ffn_dim = 4 * c.inner_dim();
  g.blocks = c.num_layers;
  g.joint = true;
  return g;
}

// The rollout's no-grad forward: the larger of one block's attention moment
// and its FFN moment.
// Bytes `model`'s buffers hold: a windowed PatchEmbed's pos_embed its crop,
// every other buffer its whole size.
int64_t held_buffer_bytes(const torch::nn::Module& model);

ActivationEstimate estimate_forward(const ActivationGeometry& g, const ActivationOptions& o);
// A training micro-batch's forward and backward under per-block recompute.
ActivationEstimate estimate_training(const ActivationGeometry& g, const ActivationOptions& o);

}  // namespace ditrl::models
