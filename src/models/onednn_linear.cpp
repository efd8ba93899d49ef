#include <ditrl/error.hpp>
#include <ditrl/models/onednn_linear.hpp>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

namespace ditrl::models {

namespace {

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   c10::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<c10::string_view>);

// x (rows x in) times weight (out x in) transposed, plus bias: the op takes
// both operands as strided views, so the backward's transposes cost no copy.
at::Tensor linear_2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "").typed<LinearPointwise>();
  return op.call(x, weight, bias, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

struct OnednnLinear : torch::autograd::Function<OnednnLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return linear_2d(x.reshape({-1, x.size(-1)}), weight, bias).view(sizes);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor g = grads[0].reshape({-1, weight.size(0)});
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = onednn_mm(g, weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) grad_weight = onednn_mm(g.t(), x.reshape({-1, x.size(-1)}));
    // An absent bias is no autograd input: its edge index does not exist.
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = g.sum(0);
    return {grad_x, grad_weight, grad_bias};
  }
};

}  // namespace

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (x.dim() == 0 || weight.dim() != 2 || x.size(-1) != weight.size(1))
    fail("linear: input {} and weight {} cannot be multiplied", fmt::join(x.sizes(), "x"),
         fmt::join(weight.sizes(), "x"));
  return OnednnLinear::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

at::Tensor onednn_mm(const at::Tensor& a, const at::Tensor& b) {
  return linear_2d(a, b.t(), std::nullopt);
}

}  // namespace ditrl::models
