// UnitFunction: one wrap unit's forward and recomputing backward under the manager.

#include <ditrl/shard/sharded_params.hpp>
#include <ditrl/shard/unit_function.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>

namespace ditrl::shard {

// A unit's function run with grad on detached copies of its inputs: those
// that require grad (`wrt_inputs`, positions among the defined inputs) are
// the leaves of its graph.
struct UnitGraph {
  std::vector<at::Tensor> inputs;
  std::vector<size_t> wrt_inputs;
  models::Tensors outputs;
};

// What a unit call's backward needs: the manager, the unit, the function to
// recompute (or, without recompute, the graph its forward kept), and where
// undefined inputs/outputs were (autograd::Function takes defined tensors
// only). Held by the autograd node through an IValue capsule (LibTorch's
// holder for opaque objects), so it lives exactly as long as the graph.
struct UnitCall : torch::CustomClassHolder {
  ShardedParams* owner = nullptr;
  size_t index = 0;
  models::UnitFn fn;
  std::vector<bool> input_defined;
  std::vector<bool> output_defined;
  std::optional<UnitGraph> kept;

  models::Tensors full_inputs(const at::TensorList defined) const {
    models::Tensors inputs;
    size_t k = 0;
    for (bool d : input_defined) inputs.push_back(d ? defined[k++] : at::Tensor());
    return inputs;
  }

  UnitGraph record(const std::vector<at::Tensor>& defined) const {
    UnitGraph graph;
    for (size_t k = 0; k < defined.size(); ++k) {
      graph.inputs.push_back(defined[k].detach());
      if (!defined[k].requires_grad()) continue;
      graph.inputs.back().requires_grad_(true);
      graph.wrt_inputs.push_back(k);
    }
    at::AutoGradMode enable(true);
    graph.outputs = fn(full_inputs(graph.inputs));
    return graph;
  }
};

struct UnitFunction : torch::autograd::Function<UnitFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<UnitCall> call, at::TensorList inputs,
                                                const at::Tensor& /*anchor*/) {
    ShardedParams& self = *call->owner;
    self.gather_.gather(call->index);
    self.gather_.prefetch(call->index + 1);
    models::Tensors outputs;
    if (self.options_.recompute) {
      outputs = call->fn(call->full_inputs(inputs));
      if (self.options_.reshard_after_forward) self.gather_.release(call->index);
      ctx->save_for_backward(inputs.vec());
    } else {
      // The graph stays with the call; its outputs leave as aliases outside
      // it (autograd would otherwise attach them to this node instead).
      call->kept = call->record(inputs.vec());
      for (const at::Tensor& out : call->kept->outputs) outputs.push_back(out.defined() ? out.detach() : out);
      if (self.options_.reshard_after_forward) self.gather_.evict(call->index);
    }
    for (at::Tensor& out : outputs) {
      call->output_defined.push_back(out.defined());
      if (!out.defined()) out = at::empty({0});
    }
    ctx->saved_data["call"] = at::IValue::make_capsule(call);
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<UnitCall>(ctx->saved_data["call"].toCapsule());
    ShardedParams& self = *call->owner;
    self.gather_.gather(call->index);
    if (call->index > 0) self.gather_.prefetch(call->index - 1);

    UnitGraph graph;
    if (call->kept) {
      graph = std::move(*call->kept);
      call->kept.reset();
    } else {
      models::TapSuppressGuard quiet;
      graph = call->record(ctx->get_saved_variables());
    }
    std::vector<at::Tensor> wrt;
    for (size_t k : graph.wrt_inputs) wrt.push_back(graph.inputs[k]);
    const std::vector<at::Tensor> params = self.trainable_params(call->index);
    wrt.insert(wrt.end(), params.begin(), params.end());

    torch::autograd::variable_list grads(wrt.size());
    std::vector<at::Tensor> roots, root_grads;
    for (size_t j = 0; j < graph.outputs.size() && j < grad_outputs.size(); ++j) {
      if (!grad_outputs[j].defined() || !graph.outputs[j].defined() || !graph.outputs[j].requires_grad()) continue;
      roots.push_back(graph.outputs[j]);
      root_grads.push_back(grad_outputs[j]);
    }
    if (!roots.empty() && !wrt.empty()) {
      at::AutoGradMode enable(true);
      grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    }
    const std::vector<size_t> wrt_inputs = std::move(graph.wrt_inputs);
    self.reducer_.reduce(call->index,
                         std::vector<at::Tensor>(grads.begin() + static_cast<int64_t>(wrt_inputs.size()), grads.end()));
    // Drops the views of the gathered buffer the graph saved, so that release can recycle it.
    graph = UnitGraph{};
    roots.clear();
    self.gather_.release(call->index);

    // One entry per forward argument: the call, each input, the anchor.
    const auto defined = static_cast<size_t>(std::count(call->input_defined.begin(), call->input_defined.end(), true));
    torch::autograd::variable_list result(defined + 2);
    for (size_t w = 0; w < wrt_inputs.size(); ++w) result[1 + wrt_inputs[w]] = grads[w];
    return result;
  }
};

models::Tensors run_with_backward(ShardedParams& params, size_t index, const models::Tensors& inputs,
                                  const models::UnitFn& fn, const at::Tensor& anchor) {
  auto call = c10::make_intrusive<UnitCall>();
  call->owner = &params;
  call->index = index;
  call->fn = fn;
  std::vector<at::Tensor> defined;
  for (const at::Tensor& t : inputs) {
    call->input_defined.push_back(t.defined());
    if (t.defined()) defined.push_back(t);
  }
  models::Tensors outputs = UnitFunction::apply(call, at::TensorList(defined), anchor);
  for (size_t j = 0; j < outputs.size(); ++j)
    if (!call->output_defined[j]) outputs[j] = at::Tensor();
  return outputs;
}

}  // namespace ditrl::shard
