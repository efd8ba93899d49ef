#include <ditrl/dist/communicator.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/ulysses.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace ditrl::models {

namespace {

// The group an autograd node talks to, held through an IValue capsule (as the
// sharded unit function holds its call) so the node can reach it in backward.
struct GroupRef : torch::CustomClassHolder {
  explicit GroupRef(dist::Communicator* c) : comm(c) {}
  dist::Communicator* comm;
};

dist::Communicator& group_of(torch::autograd::AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<GroupRef>(ctx->saved_data["group"].toCapsule())->comm;
}

// Splits x into size() chunks along `scatter`, sends chunk r to rank r and
// concatenates the received chunks along `gather` in rank order.
at::Tensor exchange(dist::Communicator& comm, const at::Tensor& x, int64_t scatter, int64_t gather) {
  const at::Tensor send = at::stack(x.chunk(comm.size(), scatter), 0).contiguous();
  at::Tensor recv = at::empty_like(send);
  comm.all_to_all(send, recv);
  return at::cat(recv.unbind(0), gather);
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<GroupRef> group, int64_t scatter, int64_t gather) {
    ctx->saved_data["group"] = at::IValue::make_capsule(group);
    ctx->saved_data["scatter"] = scatter;
    ctx->saved_data["gather"] = gather;
    return exchange(*group->comm, x, scatter, gather);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t scatter = ctx->saved_data["scatter"].toInt(), gather = ctx->saved_data["gather"].toInt();
    return {exchange(group_of(ctx), grads[0], gather, scatter), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct Gather : torch::autograd::Function<Gather> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<GroupRef> group, int64_t dim) {
    ctx->saved_data["group"] = at::IValue::make_capsule(group);
    ctx->saved_data["dim"] = dim;
    dist::Communicator& comm = *group->comm;
    const at::Tensor local = x.contiguous();
    std::vector<int64_t> shape = local.sizes().vec();
    shape.insert(shape.begin(), comm.size());
    at::Tensor all = at::empty(shape, local.options());
    comm.all_gather(local, all);
    return at::cat(all.unbind(0), dim);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    dist::Communicator& comm = group_of(ctx);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const int64_t local = grads[0].size(dim) / comm.size();
    // The all-gather's adjoint is a reduce-scatter (sum) of every rank's
    // output gradient; the group's ranks hold the same loss, hence the same
    // gradient, so the sum is N times this rank's slice (exact for N a power of two).
    return {grads[0].narrow(dim, comm.rank() * local, local) * static_cast<double>(comm.size()), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

Ulysses::Ulysses(dist::Communicator& group) : group_(&group), size_(group.size()), rank_(group.rank()) {}

int64_t Ulysses::local_tokens(int64_t tokens, const char* what) const {
  if (tokens % size_ != 0)
    fail("sequence parallel: {} has {} tokens, which parallel.sequence_parallel = {} does not divide", what, tokens,
         size_);
  return tokens / size_;
}

void Ulysses::check_heads(int64_t heads, const char* what) const {
  if (heads % size_ != 0)
    fail("sequence parallel: {} has {} attention heads, which parallel.sequence_parallel = {} does not divide", what,
         heads, size_);
}

at::Tensor Ulysses::shard(const at::Tensor& x, int64_t dim) const {
  const int64_t local = local_tokens(x.size(dim), "the sequence");
  return x.narrow(dim, rank_ * local, local);
}

at::Tensor Ulysses::gather(const at::Tensor& x, int64_t dim) const {
  if (size_ == 1) return x;
  return Gather::apply(x, c10::make_intrusive<GroupRef>(group_), x.dim() > 0 && dim < 0 ? dim + x.dim() : dim);
}

at::Tensor Ulysses::tokens_to_heads(const at::Tensor& x) const {
  check_heads(x.size(1), "an attention");
  if (size_ == 1) return x;
  return AllToAll::apply(x, c10::make_intrusive<GroupRef>(group_), int64_t{1}, int64_t{2});
}

at::Tensor Ulysses::heads_to_tokens(const at::Tensor& x) const {
  if (size_ == 1) return x;
  return AllToAll::apply(x, c10::make_intrusive<GroupRef>(group_), int64_t{2}, int64_t{1});
}

}  // namespace ditrl::models
