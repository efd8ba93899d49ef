// TreeSum: a streaming sum in the canonical tree order.

#include <ditrl/shard/tree_sum.hpp>

#include <ATen/ATen.h>

namespace ditrl::shard {

at::Tensor TreeSum::fresh(const at::Tensor& like) {
  for (size_t k = 0; k < spare_.size(); ++k) {
    if (spare_[k].sizes() == like.sizes() && spare_[k].options().type_equal(like.options())) {
      at::Tensor t = std::move(spare_[k]);
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(k));
      return t;
    }
  }
  return at::empty_like(like);
}

void TreeSum::add(const at::Tensor& leaf) {
  at::Tensor copy = fresh(leaf);
  copy.copy_(leaf);
  pending_.push_back({1, std::move(copy)});
  // Two complete subtrees of one size are siblings: merge them.
  while (pending_.size() >= 2 && pending_[pending_.size() - 2].leaves == pending_.back().leaves) {
    Partial right = std::move(pending_.back());
    pending_.pop_back();
    pending_.back().sum.add_(right.sum);
    pending_.back().leaves *= 2;
    spare_.push_back(std::move(right.sum));
  }
}

void TreeSum::fold_into(at::Tensor& out) {
  if (pending_.empty()) return;
  // T(n) = T(p) + T(n - p) with p the largest power of two below n: the
  // partials from the right, the newest (smallest) first.
  while (pending_.size() >= 2) {
    Partial right = std::move(pending_.back());
    pending_.pop_back();
    pending_.back().sum.add_(right.sum);
    pending_.back().leaves += right.leaves;
    spare_.push_back(std::move(right.sum));
  }
  out.copy_(pending_.back().sum);
  spare_.push_back(std::move(pending_.back().sum));
  pending_.clear();
}

void TreeSum::clear() {
  for (Partial& p : pending_) spare_.push_back(std::move(p.sum));
  pending_.clear();
}

}  // namespace ditrl::shard
