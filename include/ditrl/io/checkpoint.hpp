#pragma once

// Checkpoints: OUT/checkpoints/step-<N>.h5, one per save, written by every
// rank together. Each rank writes its own slab (flat element range)
// of every trainable parameter and its AdamW moments into datasets of the full
// logical shape, in the master dtype:
//   /model/<canonical name>                     master values
//   /optimizer/<canonical name>/exp_avg, exp_avg_sq
//   /extra/<set>/<canonical name>               per-parameter state such as the NFT EMA shadow
//   /rng/torch_cpu, /rng/torch_cuda             the default CPU generator's state; the GPU's on CUDA runs
//   root attributes: format, step, rollout_id (the next rollout), world_size,
//   adam_step, data_position, deck, complete (written last) and
//   sha256_manifest (written after all data): one line per
//   writer's slab, "<dataset> <begin> <end> <sha256 hex>", the digest of the
//   stored bytes of flat elements [begin, end)
// Datasets are contiguous, allocated when created (no fill values): rank 0
// creates them all in one pass through HDF5's serial driver and writes the
// file's metadata alone; every rank writes its slabs' bytes at their places
// with its own file descriptor, so no dataset costs a collective and no step
// of a save is a collective inside HDF5: a rank whose write fails (a full
// disk) tells the others in ditrl's own agreement after that step, and the
// save ends on every rank with the same error, its temporary file removed
// ("checkpoint not written: disk full" when a write lacked space). On load each
// rank reads, per dataset, the written slabs overlapping its range and checks
// their digests, so a flipped byte is reported naming its dataset (format 1
// checkpoints, chunked with Fletcher-32, still load). The file is written
// under a temporary name, flushed and fsync'ed, renamed, and only then does
// the `latest` pointer move to it; older checkpoints beyond `keep` are
// removed. A checkpoint loads at any rank count: each rank reads the flat
// ranges its own layout owns.
// Frozen parameters (a LoRA run's base weights) are not saved: they come from
// the model's weights (or seeded init) named in the deck.
//
// The state comes as a plain description (TrainingState): every trainable
// parameter's name and shape, and views of the piece this rank holds.

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::io {

struct CheckpointMeta {
  int64_t step = 0;        // optimizer steps done
  int64_t rollout_id = 0;  // the next rollout to run
  int64_t world_size = 1;
  int64_t adam_step = 0;
  int64_t data_position = 0;  // prompts consumed (rollout_id x rollout.batch)
  std::string deck;
};

// One trainable parameter and this rank's piece of it.
struct StateTensor {
  std::string name;                        // canonical
  std::vector<int64_t> shape;              // full logical shape
  int64_t begin = 0;                       // elements [begin, end) of the flattened parameter this rank holds;
  int64_t end = 0;                         // begin == end: none (the tensors below are then undefined)
  at::Tensor master, exp_avg, exp_avg_sq;  // views: saving reads them, loading writes them
  std::vector<at::Tensor> extra;           // one per TrainingState::extra_sets entry
};

struct TrainingState {
  std::vector<StateTensor> tensors;     // every trainable parameter, the same list on every rank
  std::vector<std::string> extra_sets;  // per-parameter state saved beside the moments (/extra/<set>/...)
  // Where the run computes, the same on every rank (also on one that holds
  // no slab): it decides which generators are saved, collectively.
  c10::Device device = c10::kCPU;
};

// Collective. Returns the checkpoint's path. A failure on any rank raises a
// dist::AgreedError on every rank, the previous checkpoint and `latest` intact.
std::string save_checkpoint(const std::string& out_dir, const TrainingState& state, const CheckpointMeta& meta,
                            int64_t keep, MPI_Comm comm);

// "latest" (follows OUT/checkpoints/latest) or a path. Errors name the file.
std::string resolve_checkpoint(const std::string& out_dir, const std::string& which);

// The checkpoints of OUT/checkpoints to resume from, best first: the one
// `latest` names, then every step-N.h5 from the newest down. What `latest`
// says and could not be used (unreadable, a missing file) is in `notes`.
struct ResumeCandidates {
  std::vector<std::string> paths;
  std::vector<std::string> notes;
};
ResumeCandidates resume_candidates(const std::string& out_dir);

// The deck a checkpoint stores, read on this process alone before any
// collective load; "" when the file or its attribute cannot be read (the
// collective load then names what is wrong with it).
std::string checkpoint_deck(const std::string& path);

// One process checks a whole checkpoint as a load does (format, completion,
// every slab of the SHA-256 manifest; a format 1 file's Fletcher-32 chunks),
// one slab in memory at a time, and returns its metadata; raises naming
// what does not verify. Takes no communicator: `ditrl status` runs it on a
// login node beside the job.
CheckpointMeta verify_checkpoint(const std::string& path);

// Collective. Writes the stored values into `state`'s views (masters,
// moments, extra sets), restores the CPU (and CUDA) generators and returns the metadata
// (the AdamW step counter among it). A checkpoint that fails to verify on
// any rank (format, manifest, SHA-256 of a slab) raises a dist::AgreedError
// on every rank, with the file closed: the caller may try another one.
CheckpointMeta load_checkpoint(const std::string& path, const TrainingState& state, MPI_Comm comm);

// A checkpoint's trained parameters (/model), read on one process one at a
// time, each verified against the manifest: a full fine-tune's checkpoint is
// the whole model in fp32, which `ditrl export` streams without holding it.
class TrainedWeights {
 public:
  explicit TrainedWeights(const std::string& path);
  ~TrainedWeights();
  TrainedWeights(const TrainedWeights&) = delete;
  TrainedWeights& operator=(const TrainedWeights&) = delete;

  std::vector<std::string> names() const;  // canonical, sorted
  bool contains(const std::string& name) const;
  at::Tensor read(const std::string& name) const;  // full logical shape, master dtype

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every trained parameter at once (full, in the master dtype), by canonical name.
std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& path);

}  // namespace ditrl::io
