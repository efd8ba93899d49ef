#include <ditrl/dist/sequence_parallel.hpp>
#include <ditrl/error.hpp>

namespace ditrl::dist {

SequenceLayout sequence_layout(int world_rank, int world_size, int sequence_parallel) {
  if (sequence_parallel < 1)
    fail("parallel.sequence_parallel = {}: expected a positive number of ranks per sample", sequence_parallel);
  if (world_size % sequence_parallel != 0)
    fail("parallel.sequence_parallel = {} does not divide the world size {}: expected a divisor of the rank count",
         sequence_parallel, world_size);
  SequenceLayout l;
  l.size = sequence_parallel;
  l.rank = world_rank % sequence_parallel;
  l.data_rank = world_rank / sequence_parallel;
  l.data_size = world_size / sequence_parallel;
  return l;
}

SequenceGroups::SequenceGroups(Communicator& world, int sequence_parallel)
    : layout_(sequence_layout(world.rank(), world.size(), sequence_parallel)), world_(&world) {
  if (layout_.size == 1) return;
  group_ = world.split(layout_.data_rank, layout_.rank);
  samples_ = world.split(layout_.rank, layout_.data_rank);
}

Communicator& SequenceGroups::group() const {
  if (!group_) fail("sequence parallel: no group communicator at parallel.sequence_parallel = 1");
  return *group_;
}

}  // namespace ditrl::dist
