// ditrl-mpi-ranks: 1 2
//
// Sliced loading onto the GPU (issue #18 point 1 on a CUDA device): weights
// files staged through pinned host blocks into each rank's slices on its GPU
// give bitwise the slices the CPU load gives, for a bf16 file cast into fp32
// masters (full fine-tune) and read as the frozen bf16 base (LoRA), an fp64
// file rounding through fp32, and a sharded checkpoint read by three threads
// at once; and staging one range in chunks of any size onto the GPU equals
// the CPU's cast. SKIPPED where a rank has no GPU.
#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/nccl_communicator.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/io/safetensors_shards.hpp>
#include <ditrl/models/parameter_source.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include "mpi_world.hpp"
#include "same_bits.hpp"
#include "sliced_loading.hpp"

namespace ditrl {
namespace {

using test::same_bits;
using test::seeded_state;
using test::seeded_weights;
using test::shared_dir;
using test::sliced_deck;

c10::Device gpu_of_rank() {
  return c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(test::rank()));
}

std::vector<shard::ShardPiece> load(const config::Config& c, dist::Communicator& comm, c10::Device device) {
  app::SlicedModel sliced = app::sliced_deck_model(c, device);
  shard::ShardedParams params(*sliced.family, sliced.family->wrap_units(), app::compiled_plan(c, *sliced.family), comm,
                              app::shard_options(c, device), sliced.source.get());
  return params.pieces();
}

// The deck's model loaded on this rank's GPU (NCCL) and on the CPU (MPI).
void check_gpu_equals_cpu(const config::Config& c, dist::Communicator& mpi, dist::Communicator& nccl) {
  const std::vector<shard::ShardPiece> cpu = load(c, mpi, c10::kCPU), gpu = load(c, nccl, gpu_of_rank());
  REQUIRE(cpu.size() == gpu.size());
  REQUIRE(!cpu.empty());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(cpu[i].name << " on rank " << mpi.rank());
    REQUIRE(cpu[i].name == gpu[i].name);
    CHECK(gpu[i].compute.device() == gpu_of_rank());
    CHECK(same_bits(cpu[i].master, gpu[i].master));
    CHECK(same_bits(cpu[i].compute, gpu[i].compute));
  }
}

}  // namespace

TEST_CASE("sliced loading on CUDA: every weights file gives the CPU load's slices bitwise", "[sliced_cuda]") {
  auto mpi = dist::make_mpi_communicator();
  auto nccl = dist::make_nccl_communicator(MPI_COMM_WORLD, {test::rank(), 60, 30, true});
  const std::string dir = shared_dir(*mpi, "cuda-files");
  const config::Config seeded = sliced_deck("family = \"sd3\"\npreset = \"tiny\"\ninit_seed = 11");
  for (const auto& [dtype, file] : {std::pair{at::kBFloat16, "bf16.safetensors"}, {at::kDouble, "fp64.safetensors"}}) {
    const std::string path = seeded_weights(*mpi, dir, file, seeded, dtype);
    INFO(file);
    check_gpu_equals_cpu(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + path + "\""), *mpi, *nccl);
    check_gpu_equals_cpu(sliced_deck("family = \"sd3\"\npreset = \"tiny\"\nweights = \"" + path +
                                     "\"\n[model.lora]\nenabled = true\nrank = 4"),
                         *mpi, *nccl);
  }
  // A sharded checkpoint, read by three threads at once.
  if (mpi->rank() == 0)
    io::write_sharded_safetensors(
        dir, "diffusion_pytorch_model",
        seeded_state(sliced_deck("family = \"wan\"\npreset = \"tiny\"\ninit_seed = 2"), at::kBFloat16), 20'000);
  mpi->barrier();
  const int threads = at::get_num_threads();
  at::set_num_threads(3);
  check_gpu_equals_cpu(sliced_deck("family = \"wan\"\npreset = \"tiny\"\nweights = \"" + dir +
                                   "/diffusion_pytorch_model.safetensors.index.json\""),
                       *mpi, *nccl);
  at::set_num_threads(threads);
}

TEST_CASE("sliced loading on CUDA: a range staged in chunks of any size equals the CPU's cast", "[sliced_cuda]") {
  auto mpi = dist::make_mpi_communicator();
  const std::string path = shared_dir(*mpi, "cuda-stage") + "/w.safetensors";
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor values = at::randn({100'000}, gen, at::TensorOptions().dtype(at::kDouble));
  if (mpi->rank() == 0) io::write_safetensors(path, {{"bf16", values.to(at::kBFloat16)}, {"fp64", values}});
  mpi->barrier();
  const io::Checkpoint file(path);
  for (const char* name : {"bf16", "fp64"})
    for (const c10::ScalarType into : {at::kFloat, at::kBFloat16})
      for (const size_t chunk : {size_t{6}, size_t{4096}, models::kStagingChunkBytes}) {
        INFO(name << " into " << c10::toString(into) << ", chunks of " << chunk << " bytes");
        const at::Tensor expected = at::empty({99'000}, at::TensorOptions().dtype(into));
        models::stage_range_into(file, name, 1000, 100'000, expected, chunk);
        const at::Tensor out = at::empty({99'000}, at::TensorOptions().dtype(into).device(gpu_of_rank()));
        models::stage_range_into(file, name, 1000, 100'000, out, chunk);
        dist::finish_host_copies(out.device());
        CHECK(same_bits(out, expected));
      }
}

}  // namespace ditrl
