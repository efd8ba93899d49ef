#pragma once

// The Ulysses suites' model case (tests/mpi/test_ulysses.cpp on MPI,
// tests/mpi/cuda/test_nccl_ulysses.cpp on NCCL): a tiny Wan, its inputs on
// a latent grid, one forward and the backward of sum(output * weight), and
// how a split pass is compared with the unsplit one.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/ulysses.hpp>
#include <ditrl/models/wan/wan.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::test {

struct Grid {
  int64_t batch = 2, frames = 4, height = 16, width = 16;  // wan: 256 tokens of (1, 2, 2) patches
};

inline std::shared_ptr<models::Family> make_wan(int64_t heads, c10::Device device = c10::kCPU) {
  models::WanConfig c = models::WanConfig::preset("tiny");
  c.num_attention_heads = heads;
  c.attention_head_dim = 32;
  c.text_tokens = 16;
  models::FamilyOptions o;
  o.family = "wan";
  o.device = device;
  auto wan = std::make_shared<models::Wan>(c, o);
  models::init_parameters(*wan, 11);
  return wan;
}

// A forward's inputs; the loss is sum(output * weight).
struct Inputs {
  at::Tensor latents, timesteps, sigmas, weight;
  std::string context_name;
  at::Tensor context;
};

// Drawn on the host (the same values on every device), then moved to `device`.
inline Inputs make_inputs(const models::Family& family, const Grid& g, bool per_token, c10::Device device = c10::kCPU) {
  at::manual_seed(5);
  Inputs in;
  const bool wan = family.family_name() == "wan";
  const int64_t tokens = wan ? g.frames * g.height / 2 * g.width / 2 : g.frames * g.height * g.width;
  const models::LatentGrid grid{g.frames, g.height, g.width, 24.0};
  in.latents = at::randn(family.latent_shape(g.batch, grid));
  in.sigmas = at::tensor({0.75f, 0.125f}).narrow(0, 0, g.batch);
  in.timesteps = per_token ? at::rand({g.batch, tokens}) * 1000 : in.sigmas * 1000;
  const models::CondSpec spec = family.cond_spec().at(0);
  in.context_name = spec.name;
  std::vector<int64_t> shape = spec.shape;
  shape.insert(shape.begin(), g.batch);
  in.context = at::randn(shape);
  in.weight = at::randn_like(in.latents);
  for (at::Tensor* t : {&in.latents, &in.timesteps, &in.sigmas, &in.weight, &in.context}) *t = t->to(device);
  return in;
}

struct Pass {
  at::Tensor output, d_latents, d_context;
  std::map<std::string, at::Tensor> grads;
};

inline Pass run(models::Family& family, const Inputs& in, const models::Ulysses* ulysses) {
  family.zero_grad();
  const at::Tensor latents = in.latents.clone().requires_grad_(true);
  const at::Tensor context = in.context.clone().requires_grad_(true);
  models::ForwardContext ctx;
  ctx.ulysses = ulysses;
  models::Cond cond;
  cond.tensors[in.context_name] = context;
  Pass p;
  p.output = family.noise_pred(latents, in.timesteps, in.sigmas, cond, ctx);
  (p.output * in.weight).sum().backward();
  p.output = p.output.detach();
  p.d_latents = latents.grad();
  p.d_context = context.grad();
  for (const auto& item : family.named_parameters())
    if (item.value().grad().defined()) p.grads[item.key()] = item.value().grad().clone();
  return p;
}

inline double relative_difference(const at::Tensor& a, const at::Tensor& reference) {
  const double scale = reference.abs().max().item<double>();
  return (a - reference).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// Under sequence parallelism each rank's loss is one of its group's N equal
// terms (models/ulysses.hpp), so the unsplit model's gradient is the group's
// mean of the ranks' partial gradients, summed in rank order.
inline at::Tensor group_mean(dist::Communicator& group, const at::Tensor& t) {
  at::Tensor sum = t.contiguous().clone();
  group.all_reduce(sum, dist::ReduceOp::Sum);
  return sum / static_cast<double>(group.size());
}

}  // namespace ditrl::test
