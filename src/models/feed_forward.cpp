#include <ditrl/models/feed_forward.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

FeedForward::FeedForward(int64_t dim, int64_t inner, int64_t dim_out, bool bias, const at::TensorOptions& options) {
  auto net = register_module("net", std::make_shared<Container>());
  auto gelu = net->register_module("0", std::make_shared<Container>());
  proj = gelu->register_module("proj", std::make_shared<Linear>(dim, inner, bias, options));
  out = net->register_module("2", std::make_shared<Linear>(inner, dim_out, bias, options));
}

at::Tensor FeedForward::forward(const at::Tensor& x) const {
  return out->forward(at::gelu(proj->forward(x), "tanh"));
}

}  // namespace ditrl::models
