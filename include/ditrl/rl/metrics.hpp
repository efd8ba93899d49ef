#pragma once

// The training and rollout metrics of docs/algorithms.md §7, with their exact
// definitions, emitted into a MetricBuffer (keys without the "train/" or
// "rollout/" prefix the logger adds). Per micro-batch of B pairs a MEAN metric
// adds (total, count):
//   loss                   sum L_pair + kl_beta sum KL_pair, B
//   policy_loss            sum L_pair, B          kl_loss        sum KL_pair, B
//   loss_abs_mean          sum |L_pair|, B        adv_abs_mean   sum |A clamped|, B
//   ratio_abs_minus_1      sum |ratio - 1|, B     approx_kl      sum 0.5 (logp_new - logp_old)^2, B
//   clipfrac               sum 1[|ratio - 1| > eps], B  (+ clipfrac_gt_one: ratio - 1 > eps, clipfrac_lt_one: 1 - ratio
//   > eps) log_prob_new_idx_0, log_prob_old_idx_0   the first pair's value, 1 log_prob_mean_abs_diff sum |logp_new -
//   logp_old|, B model_output_mean_abs_diff  sum over elements |v_train - v_rollout|, numel model_output_max_abs_diff
//   MAX of max |v_train - v_rollout| model_output_rel_max        MAX of max|dv| / (max|v_rollout| + 1e-30) per
//   micro-batch prev_mean_diff_over_noise_std  sum over pairs sqrt(mean_e(((mu_rollout - mu_train) / s)^2)) (0 where s
//   = 0), B

#include <ditrl/rl/grpo_loss.hpp>
#include <ditrl/rl/metric_buffer.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/sft_loss.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace ditrl::rl {

MetricSchema grpo_metric_schema();
MetricSchema nft_metric_schema();
MetricSchema sft_metric_schema(int64_t num_sigma_buckets);

// log_prob_old: the value the ratio used (rollout, recomputed, or logp_new for recompute window 0).
void record_grpo_metrics(MetricBuffer& metrics, const GrpoTerms& terms, const at::Tensor& log_prob_new,
                         const at::Tensor& log_prob_old, double clip_range);

// Train-vs-rollout velocity agreement (needs the rollout's per-step model output, guided if CFG).
void record_model_output_diff(MetricBuffer& metrics, const at::Tensor& v_train, const at::Tensor& v_rollout);

// Per pair sqrt(mean_e(((mean_rollout - mean_train) / s)^2)), 0 where s == 0: (B,).
at::Tensor prev_mean_diff_over_noise_std(const at::Tensor& mean_rollout, const at::Tensor& mean_train,
                                         const at::Tensor& noise_std);

// NFT: loss and nft_loss = sum L_pair * K, nft_loss_per_pair = sum L_pair, nft_r_mean, nft_pos_loss,
// nft_neg_loss, nft_adv_mean (signed), nft_t_mean (mean sigma), nft_num_timesteps (K, count 1), adv_abs_mean.
void record_nft_metrics(MetricBuffer& metrics, const NftTerms& terms, const at::Tensor& advantages,
                        const at::Tensor& sigmas, int64_t num_timesteps);

// SFT: loss = mean L_pair and per-sigma-bucket means sft_loss_bucket_<k>.
// host_sigmas: the pairs' sigmas on the host (PreparedBatch::host_sigmas),
// which pick the buckets; the losses may be on any device and are not read.
void record_sft_metrics(MetricBuffer& metrics, const SftTerms& terms, const at::Tensor& host_sigmas,
                        int64_t num_sigma_buckets);
// bucket = min(int(sigma * nb), nb - 1)
int64_t sigma_bucket(double sigma, int64_t num_buckets);

// Rollout reward statistics (population std, 0 for one sample; median = the
// lower middle value, as torch.median): raw_{mean,std,min,max,median,num_samples},
// group_mean_avg, group_std_avg (G > 1) and zero_std/count_<r>: the number of
// groups whose rewards are all identical, keyed by str(round(r, 1)).
std::map<std::string, double> reward_stats(const at::Tensor& rewards, int64_t group_size);
// norm_{mean,std,min,max,median,num_samples} of the normalised advantages.
std::map<std::string, double> advantage_stats(const at::Tensor& advantages);

}  // namespace ditrl::rl
