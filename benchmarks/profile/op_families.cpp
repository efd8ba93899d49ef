#include "profile/op_families.hpp"

#include <algorithm>
#include <set>

namespace step_profile {

namespace {

const std::set<std::string> kGemm = {"aten::mm",
                                     "aten::addmm",
                                     "aten::bmm",
                                     "aten::baddbmm",
                                     "aten::addmv",
                                     "aten::mv",
                                     "aten::_convolution",
                                     "aten::mkldnn_convolution",
                                     "aten::convolution_backward",
                                     "aten::_mkl_linear",
                                     "aten::mkldnn_linear",
                                     "mkldnn::_linear_pointwise"};
const std::set<std::string> kAttention = {"aten::_softmax",
                                          "aten::_softmax_backward_data",
                                          "aten::masked_fill",
                                          "aten::masked_fill_",
                                          "aten::_scaled_dot_product_flash_attention_for_cpu",
                                          "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
const std::set<std::string> kCopies = {
    "aten::copy_",        "aten::_to_copy",    "aten::clone",        "aten::cat",   "aten::stack", "aten::contiguous",
    "aten::index_select", "aten::narrow_copy", "aten::_unsafe_view", "aten::fill_", "aten::zero_"};

std::string family_of(const std::string& name, bool in_optimizer) {
  if (in_optimizer) return "optimizer (AdamW on the slices, re-cast)";
  if (kGemm.count(name)) return kGemmFamily;
  if (kAttention.count(name)) return kAttentionFamily;
  if (kCopies.count(name)) return "copies, casts, fills";
  if (name.rfind("aten::empty", 0) == 0 || name == "aten::resize_") return "allocation";
  if (name.rfind("aten::", 0) == 0) return kElementwiseFamily;
  return kFramework;
}

// One thread's events, nested by their spans: each closed op's self time
// goes to its family; `covered` gathers the outermost ops' spans.
class ThreadAttribution {
 public:
  ThreadAttribution(Profile& p, double& covered) : p_(p), covered_(covered) {}

  void run(std::vector<Op>& ops) {
    std::sort(ops.begin(), ops.end(),
              [](const Op& a, const Op& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; });
    for (const Op& op : ops) {
      while (!stack_.empty() && stack_.back().op->end <= op.start) close_innermost();
      if (!stack_.empty()) stack_.back().children += op.end - op.start;
      const bool in_optimizer = op.name == kOptimizerScope || (!stack_.empty() && stack_.back().in_optimizer);
      stack_.push_back({&op, 0, in_optimizer});
      if (kGemm.count(op.name) && !in_optimizer) p_.gemm_flops += static_cast<double>(op.flops);
    }
    while (!stack_.empty()) close_innermost();
  }

 private:
  struct Open {
    const Op* op;
    uint64_t children = 0;
    bool in_optimizer;
  };

  void close_innermost() {
    const Open o = stack_.back();
    stack_.pop_back();
    const double self = static_cast<double>(o.op->end - o.op->start - std::min(o.children, o.op->end - o.op->start));
    p_.self_seconds[family_of(o.op->name, o.in_optimizer)] += self * 1e-9;
    p_.top_ops[o.op->name] += self * 1e-9;
    ++p_.calls[o.op->name];
    if (stack_.empty()) covered_ += static_cast<double>(o.op->end - o.op->start) * 1e-9;
  }

  Profile& p_;
  double& covered_;
  std::vector<Open> stack_;
};

}  // namespace

Profile attribute(const std::vector<Op>& events, double step_seconds) {
  Profile p;
  p.step_seconds = step_seconds;
  std::map<uint64_t, std::vector<Op>> by_thread;
  for (const Op& e : events) by_thread[e.thread].push_back(e);
  double covered = 0;
  for (auto& [thread, ops] : by_thread) ThreadAttribution(p, covered).run(ops);
  p.self_seconds[kFramework] += std::max(0.0, step_seconds - covered);
  return p;
}

double family_seconds(const Profile& p, const std::string& family) {
  const auto it = p.self_seconds.find(family);
  return it == p.self_seconds.end() ? 0.0 : it->second;
}

}  // namespace step_profile
