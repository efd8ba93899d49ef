#pragma once

// A model of the activation bytes one rank holds during a training step of a
// DiT under ditrl's per-block recompute (shard/unit_function.hpp): every
// block keeps only its input until backward, then one block at a time
// rebuilds its autograd graph. With Ulysses sequence parallelism over N ranks
// (models/ulysses.hpp) a rank holds T/N tokens through the blocks and H/N
// heads over all T tokens in attention, so every term scales as 1/N. It is a
// model for `ditrl plan`, not a measurement (benchmarks/sequence_parallel
// measures peak memory).

#include <ditrl/models/family.hpp>

#include <cstdint>
#include <optional>

namespace ditrl::models {

// The sizes the model reads: tokens per sample (after patchify), text
// tokens, width, heads, FFN width and the blocks of one forward.
struct ActivationGeometry {
  int64_t tokens = 0, text_tokens = 0, dim = 0, heads = 0, ffn_dim = 0, blocks = 0;
};

struct ActivationEstimate {
  int64_t saved_inputs = 0;  // every block's input (B, T/N, D), kept until backward
  int64_t block_graph = 0;   // one block's per-token tensors while it is recomputed
  int64_t attention = 0;     // its attention scores and probabilities (math backend: fp32, B x H/N x T x T)
  int64_t total() const { return saved_inputs + block_graph + attention; }
};

// Wan and LTX (the families with a sequence-parallel forward); nullopt for others.
std::optional<ActivationGeometry> activation_geometry(const Family& family, const LatentGrid& grid);

// `batch` samples per forward, `element_bytes` of the forward dtype;
// math_attention: the portable math backend materialises the scores (the
// fused CUDA kernels keep O(T) per head instead).
ActivationEstimate estimate_activations(const ActivationGeometry& g, int64_t batch, int64_t sequence_parallel,
                                        int64_t element_bytes, bool math_attention);

}  // namespace ditrl::models
