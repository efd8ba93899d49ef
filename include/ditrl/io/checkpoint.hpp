#pragma once

// Checkpoints: OUT/checkpoints/step-<N>.h5, one per save, written
// collectively over MPI-IO. Each rank writes its own slab (flat element range)
// of every trainable parameter and its AdamW moments into datasets of the full
// logical shape, in the master dtype:
//   /model/<canonical name>                     master values
//   /optimizer/<canonical name>/exp_avg, exp_avg_sq
//   /extra/<set>/<canonical name>               per-parameter state such as the NFT EMA shadow
//   /rng/torch_cpu                              the default CPU generator's state
//   root attributes: format, step, rollout_id (the next rollout), world_size,
//   adam_step, data_position, deck, complete (written last) and
//   sha256_manifest (written after all data): one line per
//   writer's slab, "<dataset> <begin> <end> <sha256 hex>", the digest of the
//   stored bytes of flat elements [begin, end)
// Datasets are contiguous, allocated when created (no fill values): every
// rank creates them all in one pass (metadata only), then writes its slabs
// with independent MPI-IO, so no dataset costs a collective. On load each
// rank reads, per dataset, the written slabs overlapping its range and checks
// their digests, so a flipped byte is reported naming its dataset (format 1
// checkpoints, chunked with Fletcher-32, still load). The file is written
// under a temporary name, flushed and fsync'ed, renamed, and only then does
// the `latest` pointer move to it; older checkpoints beyond `keep` are
// removed. A checkpoint loads at any rank count: each rank reads the flat
// ranges its own layout owns.
// Frozen parameters (a LoRA run's base weights) are not saved: they come from
// the model's weights (or seeded init) named in the deck.

#include <ditrl/shard/sharded_params.hpp>

#include <mpi.h>

#include <cstdint>
#include <map>
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

// Named per-parameter state saved beside the masters: for each set, one
// tensor per trainable piece (params.pieces() order, frozen pieces left out),
// each holding the piece's range.
using ExtraState = std::map<std::string, std::vector<at::Tensor>>;

// Collective. Returns the checkpoint's path.
std::string save_checkpoint(const std::string& out_dir, shard::ShardedParams& params, const CheckpointMeta& meta,
                            const ExtraState& extra, int64_t keep, MPI_Comm comm);

// "latest" (follows OUT/checkpoints/latest) or a path. Errors name the file.
std::string resolve_checkpoint(const std::string& out_dir, const std::string& which);

// Collective. Restores masters, moments, the AdamW step counter and `extra`
// (tensors to fill, as for save) and returns the metadata.
CheckpointMeta load_checkpoint(const std::string& path, shard::ShardedParams& params, ExtraState& extra,
                               MPI_Comm comm);

// The trained weights (full, fp32) by canonical name: collective gather of
// every trainable parameter; frozen ones with `include_frozen`.
std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& path);

}  // namespace ditrl::io
