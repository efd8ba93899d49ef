#include <ditrl/error.hpp>
#include <ditrl/rl/metrics.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace ditrl::rl {

namespace {

const char* const kGrpoMeans[] = {"loss",
                                  "policy_loss",
                                  "kl_loss",
                                  "loss_abs_mean",
                                  "adv_abs_mean",
                                  "ratio_abs_minus_1",
                                  "approx_kl",
                                  "clipfrac",
                                  "clipfrac_gt_one",
                                  "clipfrac_lt_one",
                                  "log_prob_new_idx_0",
                                  "log_prob_old_idx_0",
                                  "log_prob_mean_abs_diff",
                                  "model_output_mean_abs_diff",
                                  "prev_mean_diff_over_noise_std"};

void add_model_output_keys(MetricSchema& s) {
  s["model_output_mean_abs_diff"] = MetricReduce::Mean;
  s["model_output_max_abs_diff"] = MetricReduce::Max;
  s["model_output_rel_max"] = MetricReduce::Max;
}

std::map<std::string, double> summary(const at::Tensor& values, const std::string& prefix) {
  const at::Tensor v = values.to(at::kDouble).cpu().flatten();
  const int64_t n = v.numel();
  if (n == 0) fail("{} statistics of an empty tensor", prefix);
  std::map<std::string, double> out;
  out[prefix + "mean"] = v.mean().item<double>();
  out[prefix + "std"] = n > 1 ? v.std(/*unbiased=*/false).item<double>() : 0.0;
  out[prefix + "min"] = v.min().item<double>();
  out[prefix + "max"] = v.max().item<double>();
  out[prefix + "median"] = v.median().item<double>();
  out[prefix + "num_samples"] = static_cast<double>(n);
  return out;
}

}  // namespace

MetricSchema grpo_metric_schema() {
  MetricSchema s;
  for (const char* key : kGrpoMeans) s[key] = MetricReduce::Mean;
  add_model_output_keys(s);
  s["grad_norm"] = MetricReduce::Replicated;
  return s;
}

MetricSchema nft_metric_schema() {
  MetricSchema s;
  for (const char* key : {"loss", "nft_loss", "nft_loss_per_pair", "nft_r_mean", "nft_pos_loss", "nft_neg_loss",
                          "nft_adv_mean", "nft_t_mean", "nft_num_timesteps", "adv_abs_mean", "kl_loss"})
    s[key] = MetricReduce::Mean;
  add_model_output_keys(s);
  s["grad_norm"] = MetricReduce::Replicated;
  return s;
}

MetricSchema sft_metric_schema(int64_t num_sigma_buckets) {
  MetricSchema s;
  s["loss"] = MetricReduce::Mean;
  for (int64_t k = 0; k < num_sigma_buckets; ++k) s[fmt::format("sft_loss_bucket_{}", k)] = MetricReduce::Mean;
  s["grad_norm"] = MetricReduce::Replicated;
  return s;
}

void record_grpo_metrics(MetricBuffer& m, const GrpoTerms& t, const at::Tensor& log_prob_new,
                         const at::Tensor& log_prob_old, double clip_range) {
  at::NoGradGuard no_grad;
  const double bsz = static_cast<double>(t.policy_loss.size(0));
  const at::Tensor ratio = t.ratio.detach();
  const at::Tensor diff = log_prob_new.detach() - log_prob_old.detach();
  m.emit_mean("loss", t.loss_sum, bsz);
  m.emit_mean("policy_loss", t.policy_loss.sum(), bsz);
  m.emit_mean("kl_loss", t.kl.sum(), bsz);
  m.emit_mean("loss_abs_mean", t.policy_loss.abs().sum(), bsz);
  m.emit_mean("adv_abs_mean", t.advantages.abs().sum(), bsz);
  m.emit_mean("ratio_abs_minus_1", (ratio - 1.0).abs().sum(), bsz);
  m.emit_mean("approx_kl", 0.5 * diff.pow(2).sum(), bsz);
  m.emit_mean("clipfrac", ((ratio - 1.0).abs() > clip_range).to(at::kFloat).sum(), bsz);
  m.emit_mean("clipfrac_gt_one", ((ratio - 1.0) > clip_range).to(at::kFloat).sum(), bsz);
  m.emit_mean("clipfrac_lt_one", ((1.0 - ratio) > clip_range).to(at::kFloat).sum(), bsz);
  m.emit_mean("log_prob_new_idx_0", log_prob_new.detach()[0], 1);
  m.emit_mean("log_prob_old_idx_0", log_prob_old.detach()[0], 1);
  m.emit_mean("log_prob_mean_abs_diff", diff.abs().sum(), bsz);
}

void record_model_output_diff(MetricBuffer& m, const at::Tensor& v_train, const at::Tensor& v_rollout) {
  if (v_train.sizes() != v_rollout.sizes())
    fail("model output diff: train {} and rollout {} outputs differ in shape", fmt::join(v_train.sizes(), "x"),
         fmt::join(v_rollout.sizes(), "x"));
  at::NoGradGuard no_grad;
  const at::Tensor d = (v_train.detach().to(at::kFloat) - v_rollout.to(at::kFloat)).abs();
  const at::Tensor max_abs = d.max();
  m.emit_mean("model_output_mean_abs_diff", d.sum(), static_cast<double>(d.numel()));
  m.emit_max("model_output_max_abs_diff", max_abs);
  m.emit_max("model_output_rel_max", max_abs / (v_rollout.to(at::kFloat).abs().max() + 1e-30));
}

at::Tensor prev_mean_diff_over_noise_std(const at::Tensor& mean_rollout, const at::Tensor& mean_train,
                                         const at::Tensor& noise_std) {
  if (mean_rollout.sizes() != mean_train.sizes() || mean_train.dim() < 2)
    fail("prev_mean_diff_over_noise_std: means {} and {} must be equal (B, ...) shapes",
         fmt::join(mean_rollout.sizes(), "x"), fmt::join(mean_train.sizes(), "x"));
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < mean_train.dim(); ++d) dims.push_back(d);
  const at::Tensor s = noise_std.to(at::kFloat).expand_as(mean_train);
  const at::Tensor z =
      at::where(s > 0, (mean_rollout.to(at::kFloat) - mean_train.detach().to(at::kFloat)) / s, at::zeros_like(s));
  return z.pow(2).mean(dims).sqrt();
}

void record_nft_metrics(MetricBuffer& m, const NftTerms& t, const at::Tensor& advantages, const at::Tensor& sigmas,
                        int64_t num_timesteps) {
  at::NoGradGuard no_grad;
  const double bsz = static_cast<double>(t.per_pair.size(0));
  const at::Tensor total = t.per_pair.detach().sum();
  m.emit_mean("loss", total * static_cast<double>(num_timesteps), bsz);
  m.emit_mean("nft_loss", total * static_cast<double>(num_timesteps), bsz);
  m.emit_mean("nft_loss_per_pair", total, bsz);
  m.emit_mean("nft_r_mean", t.r.sum(), bsz);
  m.emit_mean("nft_pos_loss", t.pos_loss.detach().sum(), bsz);
  m.emit_mean("nft_neg_loss", t.neg_loss.detach().sum(), bsz);
  m.emit_mean("nft_adv_mean", advantages.sum(), bsz);
  m.emit_mean("nft_t_mean", sigmas.sum(), bsz);
  m.emit_mean("nft_num_timesteps", static_cast<double>(num_timesteps), 1);
  m.emit_mean("adv_abs_mean", advantages.abs().sum(), bsz);
  m.emit_mean("kl_loss", t.kl.detach().sum(), bsz);
}

int64_t sigma_bucket(double sigma, int64_t num_buckets) {
  if (num_buckets < 1) fail("sigma buckets: need at least one bucket, got {}", num_buckets);
  return std::min(static_cast<int64_t>(sigma * static_cast<double>(num_buckets)), num_buckets - 1);
}

void record_sft_metrics(MetricBuffer& m, const SftTerms& t, const at::Tensor& host_sigmas, int64_t num_sigma_buckets) {
  // The bucket is control flow, so it is read from the host's sigmas; the
  // losses stay where they were computed (a GPU run reads its metrics back
  // once per optimizer step, in MetricBuffer::reduce, not per micro-batch).
  if (!host_sigmas.device().is_cpu())
    fail("sft metrics: the sigmas that pick the buckets must be the host copy, got a tensor on {}",
         host_sigmas.device().str());
  at::NoGradGuard no_grad;
  const at::Tensor per_pair = t.per_pair.detach().to(at::kDouble);
  const at::Tensor s = host_sigmas.to(at::kDouble).contiguous();
  m.emit_mean("loss", per_pair.sum(), static_cast<double>(per_pair.size(0)));
  for (int64_t i = 0; i < per_pair.size(0); ++i)
    m.emit_mean(fmt::format("sft_loss_bucket_{}", sigma_bucket(s.data_ptr<double>()[i], num_sigma_buckets)),
                per_pair[i], 1);
}

std::map<std::string, double> reward_stats(const at::Tensor& rewards, int64_t group_size) {
  if (!rewards.defined() || rewards.dim() != 1 || group_size < 1 || rewards.size(0) % group_size != 0)
    fail("reward stats: {} rewards do not split into groups of {}", rewards.defined() ? rewards.numel() : 0,
         group_size);
  std::map<std::string, double> out = summary(rewards, "raw_");
  const at::Tensor groups = rewards.to(at::kDouble).cpu().view({-1, group_size});
  if (group_size > 1) {
    out["group_mean_avg"] = groups.mean(1).mean().item<double>();
    out["group_std_avg"] = groups.std({1}, /*unbiased=*/false, false).mean().item<double>();
  }
  std::map<std::string, double> zero_std;
  for (int64_t g = 0; g < groups.size(0); ++g) {
    const double* r = groups[g].data_ptr<double>();
    if (std::all_of(r, r + group_size, [&](double v) { return v == r[0]; }))
      zero_std[fmt::format("zero_std/count_{:.1f}", r[0])] += 1;
  }
  out.insert(zero_std.begin(), zero_std.end());
  return out;
}

std::map<std::string, double> advantage_stats(const at::Tensor& advantages) {
  return summary(advantages, "norm_");
}

}  // namespace ditrl::rl
