#include <ditrl/error.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace ditrl::rl {

namespace {

std::vector<int64_t> non_batch_dims(const at::Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

at::Tensor broadcast_sigmas(const at::Tensor& sigmas, const at::Tensor& like) {
  std::vector<int64_t> view(static_cast<size_t>(like.dim()), 1);
  view[0] = like.size(0);
  return sigmas.view(view);
}

}  // namespace

at::Tensor nft_reward_weight(const at::Tensor& advantages, double adv_clip_max) {
  if (!(adv_clip_max > 0)) fail("nft: adv_clip_max must be > 0, got {}", adv_clip_max);
  const at::Tensor clipped = at::clamp(advantages, -adv_clip_max, adv_clip_max);
  return at::clamp((clipped / adv_clip_max) / 2.0 + 0.5, 0.0, 1.0);
}

at::Tensor corrupt(const at::Tensor& x0, const at::Tensor& sigmas, const at::Tensor& noise) {
  if (x0.dim() < 2 || noise.sizes() != x0.sizes() || sigmas.dim() != 1 || sigmas.size(0) != x0.size(0))
    fail("nft corrupt: x0 {} and noise {} must be equal (B, ...) shapes with sigmas (B,), got sigmas {}",
         fmt::join(x0.sizes(), "x"), fmt::join(noise.sizes(), "x"), fmt::join(sigmas.sizes(), "x"));
  const at::Tensor s = broadcast_sigmas(sigmas, x0);
  return (1.0 - s) * x0 + s * noise;
}

NftTerms nft_loss(const at::Tensor& v, const at::Tensor& v_old, const at::Tensor& x0, const at::Tensor& x_t,
                  const at::Tensor& sigmas, const at::Tensor& advantages, const NftOptions& o,
                  const at::Tensor& v_ref) {
  if (!(o.beta > 0)) fail("nft loss: beta must be > 0, got {}", o.beta);
  if (v.dim() < 2 || v_old.sizes() != v.sizes() || x0.sizes() != v.sizes() || x_t.sizes() != v.sizes())
    fail("nft loss: velocity {}, old velocity {}, x0 {} and x_t {} must be equal (B, ...) shapes",
         fmt::join(v.sizes(), "x"), fmt::join(v_old.sizes(), "x"), fmt::join(x0.sizes(), "x"),
         fmt::join(x_t.sizes(), "x"));
  const int64_t b = v.size(0);
  if (sigmas.dim() != 1 || sigmas.size(0) != b || advantages.dim() != 1 || advantages.size(0) != b)
    fail("nft loss: sigmas {} and advantages {} must be ({},)", fmt::join(sigmas.sizes(), "x"),
         fmt::join(advantages.sizes(), "x"), b);
  const auto dims = non_batch_dims(v);
  const auto dtype = v.scalar_type();

  NftTerms r;
  r.r = nft_reward_weight(advantages, o.adv_clip_max);
  const at::Tensor v_pos = o.beta * v + (1.0 - o.beta) * v_old;
  const at::Tensor v_neg = (1.0 + o.beta) * v_old - o.beta * v;
  const at::Tensor x = x_t.to(dtype);
  const at::Tensor s = broadcast_sigmas(sigmas, v).to(dtype);
  const at::Tensor target = x0.to(dtype);
  auto branch_loss = [&](const at::Tensor& x0_branch) {
    const at::Tensor sq = (x0_branch - target).pow(2);
    if (!o.adaptive) return sq.mean(dims);
    // The weight is a detached float64 mean |error| (a scale, not a gradient path).
    const at::Tensor w = (x0_branch.detach().to(at::kDouble) - target.to(at::kDouble))
                             .abs()
                             .mean(dims, /*keepdim=*/true)
                             .clamp_min(1e-5)
                             .to(dtype);
    return (sq / w).mean(dims);
  };
  r.pos_loss = branch_loss(x - s * v_pos);
  r.neg_loss = branch_loss(x - s * v_neg);
  const at::Tensor rb = r.r.to(r.pos_loss.scalar_type());
  r.per_pair = (rb * r.pos_loss / o.beta + (1.0 - rb) * r.neg_loss / o.beta) * o.adv_clip_max;
  if (o.kl_beta > 0) {
    if (!v_ref.defined() || v_ref.sizes() != v.sizes())
      fail("nft loss: kl_beta = {} needs the reference velocity of shape {}", o.kl_beta, fmt::join(v.sizes(), "x"));
    r.kl = (v - v_ref).pow(2).mean(dims);
    r.per_pair = r.per_pair + o.kl_beta * r.kl;
  } else {
    r.kl = at::zeros({b}, r.per_pair.options()).detach();
  }
  r.loss_sum = r.per_pair.sum();
  return r;
}

int64_t nft_pairs_per_sample(int64_t num_sigmas, double timestep_fraction) {
  if (num_sigmas < 1) fail("nft: the snapshot has no non-terminal sigma");
  if (!(timestep_fraction > 0 && timestep_fraction <= 1))
    fail("nft: timestep_fraction must be in (0, 1], got {}", timestep_fraction);
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(num_sigmas) * timestep_fraction));
}

std::vector<int64_t> nft_sigma_indices(int64_t num_sigmas, double timestep_fraction, bool shuffle, int64_t seed,
                                       int64_t sample_index) {
  const int64_t k = nft_pairs_per_sample(num_sigmas, timestep_fraction);
  std::vector<int64_t> out;
  if (!shuffle) {
    for (int64_t i = 0; i < k; ++i) out.push_back(i);
    return out;
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(stable_hash("nft_sigma_shuffle", seed, sample_index));
  const at::Tensor perm = at::randperm(num_sigmas, gen, at::kLong);
  out.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + k);
  return out;
}

}  // namespace ditrl::rl
