#include <ditrl/error.hpp>
#include <ditrl/rl/metric_buffer.hpp>
#include <ditrl/rl/metrics.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace ditrl;
using namespace ditrl::rl;

namespace {

at::Tensor f32(std::vector<float> v) {
  return at::tensor(v, at::kFloat);
}

// Stands in for a group of `size` ranks that all hold this rank's values (the
// MPI communicator is another issue's): SUM multiplies by the size, MAX keeps
// the value, and `corrupt_schema` makes another rank's schema hash differ.
class MirrorCommunicator : public dist::Communicator {
 public:
  explicit MirrorCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void all_gather(const at::Tensor&, at::Tensor&) override { fail("not used"); }
  void reduce_scatter(const at::Tensor&, at::Tensor&, dist::ReduceOp) override { fail("not used"); }
  void all_reduce(at::Tensor& t, dist::ReduceOp op) override {
    ops.push_back(op);
    if (op == dist::ReduceOp::Sum) t.mul_(size_);
    if (op == dist::ReduceOp::Max && corrupt_schema && t.scalar_type() == at::kLong) t.add_(1);
  }
  void all_to_all(const at::Tensor&, at::Tensor&) override { fail("not used"); }
  void broadcast(at::Tensor&, int) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  dist::Pending all_gather_async(const at::Tensor&, const at::Tensor&) override { fail("not used"); }
  dist::Pending reduce_scatter_async(const at::Tensor&, const at::Tensor&, dist::ReduceOp) override {
    fail("not used");
  }

  std::vector<dist::ReduceOp> ops;
  bool corrupt_schema = false;

 private:
  int size_;
};

MetricSchema small_schema() {
  return {{"loss", MetricReduce::Mean},
          {"approx_kl", MetricReduce::Mean},
          {"model_output_max_abs_diff", MetricReduce::Max},
          {"grad_norm", MetricReduce::Replicated}};
}

}  // namespace

TEST_CASE("metric buffer: item-weighted means / maxima and replicated values", "[rl][metrics]") {
  MetricBuffer m(small_schema(), c10::kCPU);
  m.emit_mean("loss", at::scalar_tensor(6.0, at::kFloat), 2);  // micro-batch 1: 2 pairs, sum 6
  m.emit_mean("loss", 1.0, 4);                                 // micro-batch 2: 4 pairs, sum 1
  m.emit_max("model_output_max_abs_diff", at::scalar_tensor(0.5));
  m.emit_max("model_output_max_abs_diff", 0.25);
  m.emit_replicated("grad_norm", 1.75);
  const auto out = m.local();
  CHECK(out.at("loss") == Approx(7.0 / 6.0));
  CHECK(out.at("model_output_max_abs_diff") == 0.5);
  CHECK(out.at("grad_norm") == 1.75);
  CHECK(out.count("approx_kl") == 0);  // no item counted: not a datapoint
  CHECK_THROWS_WITH(m.emit_max("loss", 1.0), Catch::Contains("reduces as MEAN, not MAX"));
  CHECK_THROWS_WITH(m.emit_mean("los", 1.0, 1), Catch::Contains("'los' is not in the metric schema"));
  CHECK_THROWS_WITH(m.emit_mean("loss", at::ones({2}), 1), Catch::Contains("scalar"));
  m.clear();
  CHECK(m.local().empty());
}

TEST_CASE("metric buffer: reduce goes through the communicator (SUM for means / MAX for maxima)", "[rl][metrics]") {
  MetricBuffer m(small_schema(), c10::kCPU);
  m.emit_mean("loss", 3.0, 2);
  m.emit_max("model_output_max_abs_diff", 0.125);
  m.emit_replicated("grad_norm", 2.0);
  MirrorCommunicator comm(4);
  const auto out = m.reduce(comm);
  // sums and counts are both reduced, so identical ranks give the local mean back
  CHECK(out.at("loss") == Approx(1.5));
  CHECK(out.at("model_output_max_abs_diff") == 0.125);
  CHECK(out.at("grad_norm") == 2.0);
  REQUIRE(comm.ops.size() == 3);
  CHECK(comm.ops[0] == dist::ReduceOp::Max);  // schema check
  CHECK(comm.ops[1] == dist::ReduceOp::Sum);
  CHECK(comm.ops[2] == dist::ReduceOp::Max);
  comm.corrupt_schema = true;
  CHECK_THROWS_WITH(m.reduce(comm), Catch::Contains("metric schema that differs"));
}

TEST_CASE("metrics: Flow-GRPO definitions", "[rl][metrics]") {
  const at::Tensor lp_new = f32({-1.0f, -2.0f, -0.5f, -0.9f});
  const at::Tensor lp_old = f32({-1.0f, -2.5f, -0.4f, -0.9f});
  const at::Tensor adv = f32({1.0f, -2.0f, 0.5f, 8.0f});
  const double eps = 0.05;
  const GrpoTerms t = grpo_loss(lp_new, lp_old, adv, GrpoOptions{eps, 5.0, 0.0});
  MetricBuffer m(grpo_metric_schema(), c10::kCPU);
  record_grpo_metrics(m, t, lp_new, lp_old, eps);
  const auto out = m.local();
  const std::vector<double> diff = {0.0, 0.5, -0.1, 0.0};
  double abs_ratio = 0, approx_kl = 0, abs_diff = 0;
  int clip = 0, gt = 0, lt = 0;
  for (double d : diff) {
    const double r = std::exp(d);
    abs_ratio += std::abs(r - 1);
    approx_kl += 0.5 * d * d;
    abs_diff += std::abs(d);
    clip += std::abs(r - 1) > eps;
    gt += r - 1 > eps;
    lt += 1 - r > eps;
  }
  CHECK(out.at("ratio_abs_minus_1") == Approx(abs_ratio / 4).epsilon(1e-6));
  CHECK(out.at("approx_kl") == Approx(approx_kl / 4).epsilon(1e-6));
  CHECK(out.at("log_prob_mean_abs_diff") == Approx(abs_diff / 4).epsilon(1e-6));
  CHECK(out.at("clipfrac") == Approx(clip / 4.0));
  CHECK(out.at("clipfrac_gt_one") == Approx(gt / 4.0));
  CHECK(out.at("clipfrac_lt_one") == Approx(lt / 4.0));
  CHECK(out.at("adv_abs_mean") == Approx((1 + 2 + 0.5 + 5) / 4.0));  // clamped at 5
  CHECK(out.at("log_prob_new_idx_0") == -1.0);
  CHECK(out.at("log_prob_old_idx_0") == -1.0);
  CHECK(out.at("loss") == Approx(t.policy_loss.sum().item<double>() / 4));
  CHECK(out.at("kl_loss") == 0.0);
  CHECK(out.at("loss_abs_mean") == Approx(t.policy_loss.abs().sum().item<double>() / 4));
}

TEST_CASE("metrics: train-vs-rollout model output and mean agreement", "[rl][metrics]") {
  const at::Tensor v_rollout = f32({1.0f, -4.0f, 2.0f, 0.5f}).view({2, 2});
  const at::Tensor v_train = v_rollout + f32({0.0f, 0.5f, -0.25f, 0.0f}).view({2, 2});
  MetricBuffer m(grpo_metric_schema(), c10::kCPU);
  record_model_output_diff(m, v_train, v_rollout);
  record_model_output_diff(m, v_rollout, v_rollout);
  const auto out = m.local();
  CHECK(out.at("model_output_mean_abs_diff") == Approx(0.75 / 8));
  CHECK(out.at("model_output_max_abs_diff") == 0.5);
  CHECK(out.at("model_output_rel_max") == Approx(0.5 / 4.0));

  const at::Tensor mu = f32({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2});
  const at::Tensor d = prev_mean_diff_over_noise_std(mu + 0.2, mu, f32({0.1f, 0.0f}).view({2, 1}));
  CHECK(d[0].item<double>() == Approx(2.0).epsilon(1e-5));
  CHECK(d[1].item<double>() == 0.0);  // s = 0 counts as 0
}

TEST_CASE("metrics: NFT and SFT records", "[rl][metrics]") {
  NftTerms t;
  t.per_pair = f32({1.0f, 3.0f});
  t.r = f32({0.25f, 1.0f});
  t.pos_loss = f32({0.5f, 0.5f});
  t.neg_loss = f32({2.0f, 0.0f});
  t.kl = f32({0.0f, 0.0f});
  MetricBuffer m(nft_metric_schema(), c10::kCPU);
  record_nft_metrics(m, t, f32({-2.0f, 4.0f}), f32({0.3f, 0.7f}), 9);
  const auto out = m.local();
  CHECK(out.at("loss") == Approx(18.0));
  CHECK(out.at("nft_loss_per_pair") == Approx(2.0));
  CHECK(out.at("nft_r_mean") == Approx(0.625));
  CHECK(out.at("nft_adv_mean") == Approx(1.0));
  CHECK(out.at("adv_abs_mean") == Approx(3.0));
  CHECK(out.at("nft_t_mean") == Approx(0.5));
  CHECK(out.at("nft_num_timesteps") == 9.0);

  CHECK(sigma_bucket(0.0, 4) == 0);
  CHECK(sigma_bucket(0.26, 4) == 1);
  CHECK(sigma_bucket(1.0, 4) == 3);
  SftTerms s{at::scalar_tensor(0.0), f32({1.0f, 2.0f, 4.0f})};
  MetricBuffer ms(sft_metric_schema(4), c10::kCPU);
  record_sft_metrics(ms, s, f32({0.1f, 0.15f, 0.9f}), 4);
  const auto so = ms.local();
  CHECK(so.at("loss") == Approx(7.0 / 3));
  CHECK(so.at("sft_loss_bucket_0") == Approx(1.5));
  CHECK(so.at("sft_loss_bucket_3") == Approx(4.0));
  CHECK(so.count("sft_loss_bucket_1") == 0);
  // The buckets come from the host's sigmas: a device copy (meta here, CUDA
  // in a GPU run) would be a read back per micro-batch.
  CHECK_THROWS_WITH(record_sft_metrics(ms, s, f32({0.1f, 0.15f, 0.9f}).to(c10::kMeta), 4),
                    Catch::Contains("must be the host copy"));
}

TEST_CASE("metrics: rollout reward and advantage statistics", "[rl][metrics]") {
  // three groups of 3: varied, all 1.0, all 0.2
  const at::Tensor r = f32({0.0f, 1.0f, 0.5f, 1.0f, 1.0f, 1.0f, 0.2f, 0.2f, 0.2f});
  const auto out = reward_stats(r, 3);
  const double mean = 5.1 / 9;
  double var = 0;
  for (int i = 0; i < 9; ++i) var += std::pow(r[i].item<double>() - mean, 2) / 9;
  CHECK(out.at("raw_mean") == Approx(mean).epsilon(1e-6));
  CHECK(out.at("raw_std") == Approx(std::sqrt(var)).epsilon(1e-6));  // population std
  CHECK(out.at("raw_min") == 0.0);
  CHECK(out.at("raw_max") == 1.0);
  CHECK(out.at("raw_median") == Approx(0.5));
  CHECK(out.at("raw_num_samples") == 9.0);
  CHECK(out.at("group_mean_avg") == Approx((0.5 + 1.0 + 0.2) / 3).epsilon(1e-6));
  CHECK(out.at("group_std_avg") == Approx(std::sqrt(1.0 / 6) / 3).epsilon(1e-6));
  CHECK(out.at("zero_std/count_1.0") == 1.0);
  CHECK(out.at("zero_std/count_0.2") == 1.0);
  CHECK(out.count("zero_std/count_0.0") == 0);
  const auto one = advantage_stats(f32({3.0f}));
  CHECK(one.at("norm_std") == 0.0);                                                // one sample: 0, not NaN
  CHECK(advantage_stats(f32({1.0f, 2.0f, 3.0f, 4.0f})).at("norm_median") == 2.0);  // lower middle, as torch
}
