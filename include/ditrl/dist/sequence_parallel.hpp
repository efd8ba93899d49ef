#pragma once

// Sequence-parallel groups ([parallel] sequence_parallel = N): the world's
// ranks in groups of N consecutive ranks that share one sample, group g being
// ranks [g*N, (g+1)*N). Launchers place consecutive ranks on one node first,
// so a group's all-to-alls stay on the node's links. Data is split over the
// world/N groups (data_rank, data_size); parameters stay sharded over the
// whole world.

#include <ditrl/dist/communicator.hpp>

#include <memory>

namespace ditrl::dist {

struct SequenceLayout {
  int size = 1;       // N: ranks per group
  int rank = 0;       // this rank's place in its group (its token chunk)
  int data_rank = 0;  // its group's index: which share of the data it takes
  int data_size = 1;  // the number of groups: world / N
};

// The layout of `world_rank` among `world_size` ranks; an error naming
// parallel.sequence_parallel unless it is >= 1 and divides the world size.
SequenceLayout sequence_layout(int world_rank, int world_size, int sequence_parallel);

class SequenceGroups {
 public:
  // Collective over `world`: splits it into the groups and into the
  // communicators across them (at N = 1 nothing is created).
  SequenceGroups(Communicator& world, int sequence_parallel);

  const SequenceLayout& layout() const { return layout_; }
  // The group's communicator (ranks in token order); only when N > 1.
  Communicator& group() const;
  // The ranks holding this rank's token chunk of every group's sample, one
  // per group, in group order: what the data split, rewards and metrics run
  // over. The world itself at N = 1.
  Communicator& samples() const { return group_ ? *samples_ : *world_; }

 private:
  SequenceLayout layout_;
  Communicator* world_;
  std::unique_ptr<Communicator> group_, samples_;
};

}  // namespace ditrl::dist
