#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/ltx.hpp>
#include <ditrl/models/wan.hpp>

namespace ditrl::models {

std::optional<ActivationGeometry> activation_geometry(const Family& family, const LatentGrid& grid) {
  if (const auto* wan = dynamic_cast<const Wan*>(&family)) {
    const WanConfig& c = wan->config();
    const int64_t tokens =
        grid.frames / c.patch_size[0] * (grid.height / c.patch_size[1]) * (grid.width / c.patch_size[2]);
    // One expert runs per forward.
    return ActivationGeometry{tokens, c.text_tokens, c.inner_dim(), c.num_attention_heads, c.ffn_dim, c.num_layers};
  }
  if (const auto* ltx = dynamic_cast<const LTX*>(&family)) {
    const LtxConfig& c = ltx->config();
    return ActivationGeometry{grid.frames * grid.height * grid.width,
                              c.text_tokens,
                              c.inner_dim(),
                              c.num_attention_heads,
                              4 * c.inner_dim(),
                              c.num_layers};
  }
  return std::nullopt;
}

ActivationEstimate estimate_activations(const ActivationGeometry& g, int64_t batch, int64_t sequence_parallel,
                                        int64_t element_bytes, bool math_attention) {
  const int64_t local = g.tokens / sequence_parallel;
  const int64_t token_row = batch * local * element_bytes;  // one (B, T/N) row of width 1
  ActivationEstimate e;
  e.saved_inputs = g.blocks * token_row * g.dim;
  // What a recomputed block's graph holds per local token, counted from the
  // Wan/LTX block: two norms and their modulated copies, q/k/v, rotated q/k,
  // their all-to-all copies, the attention output and its copy back, the
  // cross-attention query and output, the residuals (~16 x D), and the FFN's
  // hidden layer before and after its activation (2 x F).
  e.block_graph = token_row * (16 * g.dim + 2 * g.ffn_dim);
  // Scores and probabilities of H/N heads over all T queries and keys, fp32;
  // cross-attention's over the text tokens for the local queries.
  const int64_t heads = g.heads / sequence_parallel;
  e.attention = math_attention
                    ? 2 * 4 * batch * heads * g.tokens * g.tokens + 2 * 4 * batch * g.heads * local * g.text_tokens
                    : 4 * batch * heads * g.tokens * 2;  // log-sum-exp rows
  return e;
}

}  // namespace ditrl::models
