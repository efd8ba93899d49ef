#pragma once

// A small transformer-like stack for the sharding tests and benchmarks: an
// embedding linear and a head (the root unit) around blocks of layernorm +
// MLP + residual + a second norm (`norm2`, which plans keep in fp32). Each
// block is one wrap unit; every module casts its input to its own weights'
// dtype, as a family does for parameters a plan keeps in another dtype.

#include <ditrl/models/unit.hpp>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace ditrl::test {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t hidden)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", torch::nn::Linear(dim, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, dim))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))) {}

  at::Tensor forward(const at::Tensor& input) {
    const at::Tensor x = input.to(fc1->weight.scalar_type());
    const at::Tensor h = fc2(torch::gelu(fc1(norm1(x.to(norm1->weight.scalar_type())).to(x.scalar_type()))));
    return norm2((x + h).to(norm2->weight.scalar_type()));
  }

  torch::nn::LayerNorm norm1;
  torch::nn::Linear fc1, fc2;
  torch::nn::LayerNorm norm2;
};
TORCH_MODULE(Block);

struct StackShape {
  int64_t in = 5;
  int64_t dim = 7;  // odd sizes: every flat group needs padding at 2 and 4 ranks
  int64_t hidden = 11;
  int64_t out = 3;
  int64_t blocks = 3;
};

struct BlockStack : torch::nn::Module {
  explicit BlockStack(const StackShape& shape, uint64_t seed) {
    torch::manual_seed(seed);
    embed = register_module("embed", torch::nn::Linear(shape.in, shape.dim));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < shape.blocks; ++i) blocks->push_back(Block(shape.dim, shape.hidden));
    head = register_module("head", torch::nn::Linear(shape.dim, shape.out));
    // LayerNorm starts at weight 1, bias 0; perturb so that every gradient differs.
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.add_(torch::randn_like(p) * 0.05);
  }

  std::vector<models::WrapUnit> wrap_units() {
    std::vector<models::WrapUnit> units;
    for (size_t i = 0; i < blocks->size(); ++i) units.push_back({"blocks." + std::to_string(i), blocks->ptr(i)});
    return units;
  }

  at::Tensor forward(const at::Tensor& x, const models::ForwardContext& ctx = {}) {
    at::Tensor h = embed(x.to(embed->weight.scalar_type()));
    for (size_t i = 0; i < blocks->size(); ++i) {
      std::shared_ptr<BlockImpl> block = blocks->ptr<BlockImpl>(i);
      h = ctx.run_unit(i, {h},
                       [block](const models::Tensors& in) { return models::Tensors{block->forward(in[0])}; })[0];
    }
    return head(h.to(head->weight.scalar_type())).to(at::kFloat);
  }

  torch::nn::Linear embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Linear head{nullptr};
};

inline std::vector<std::string> parameter_names(torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) names.push_back(item.key());
  return names;
}

}  // namespace ditrl::test
