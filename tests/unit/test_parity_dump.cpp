// Parity dumps: the HDF5 layout (dtype kept, record order), the rows a
// chosen sample keeps from a forward batch, and another engine's layout.
#include <ditrl/error.hpp>
#include <ditrl/io/tensor_dump.hpp>
#include <ditrl/rl/parity_dump.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "process.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;

TEST_CASE("parity dump: tensors keep dtype and record order under /<side>/<key>/<module>/<tensor>", "[dump]") {
  const std::string path = test::fresh_output_dir("parity_dump_layout") + "/dump.h5";
  const at::Tensor x = at::randn({2, 3}, at::kFloat);
  const at::Tensor h = at::randn({4}, at::kFloat).to(at::kBFloat16);
  {
    io::TensorDumpWriter w(path);
    w.write("rollout", "r0_s1_t2", "transformer_blocks.0.attn", "out0", x);
    w.write("rollout", "r0_s1_t2", "pos_embed", "out0", h);
    w.write("train", "r0_s1_t2", "pos_embed", "out0", h);
    w.write("rollout", "r0_s1_t2", "pos_embed", "out0", h * 2);  // a second record of the same tensor
    CHECK_THROWS_WITH(w.write("rollout", "k", "a/b", "out0", x), Contains("module 'a/b'"));
  }
  const io::h5::File f = io::h5::File::open(path);
  const std::vector<io::DumpEntry> rollout = io::list_tensor_dump(f, "rollout");
  REQUIRE(rollout.size() == 3);
  CHECK(rollout[0].path == "pos_embed/out0");  // link order is by name; seq keeps the record order
  CHECK(rollout[0].seq == 1);
  CHECK(rollout[1].path == "pos_embed/out0.call1");
  CHECK(rollout[1].seq == 2);
  CHECK(rollout[2].path == "transformer_blocks.0.attn/out0");
  CHECK(rollout[2].seq == 0);
  CHECK(io::list_tensor_dump(f, "train").at(0).seq == 0);  // each side counts on its own
  const at::Tensor back = io::read_dumped_tensor(f, "rollout", rollout[0]);
  CHECK(back.scalar_type() == at::kBFloat16);
  CHECK(at::equal(back, h));
  CHECK(at::equal(io::read_dumped_tensor(f, "rollout", rollout[2]), x));
  CHECK(f.open_dataset("/rollout/r0_s1_t2/pos_embed/out0").string_attr("dtype") == "bf16");
  CHECK_THROWS_WITH(io::list_tensor_dump(f, "sde"),
                    Contains(path) && Contains("no side 'sde'") && Contains("rollout, train"));
}

TEST_CASE("parity dump: another engine's bf16 bits as uint16 read back as bf16 - bad depth is named", "[dump]") {
  const std::string path = test::fresh_output_dir("parity_dump_external") + "/engine.h5";
  const at::Tensor v = at::randn({5}, at::kFloat).to(at::kBFloat16);
  {
    io::h5::File f = io::h5::File::create(path);
    io::h5::Group g = f.create_group("/rollout/r0_s0_t0/proj_out");
    io::h5::Handle u16(H5Tcopy(H5T_STD_U16LE), H5Tclose);
    io::h5::Dataspace space = io::h5::Dataspace::simple({5});
    io::h5::Handle d(H5Dcreate2(g.id(), "out0", u16.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    REQUIRE(H5Dwrite(d.id(), u16.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.contiguous().data_ptr()) >= 0);
    g.open_dataset("out0").set_attr("dtype", "bf16");
    f.create_dataset("/train/r0_s0_t0/stray", at::kFloat, {1});
  }
  const io::h5::File f = io::h5::File::open(path);
  const std::vector<io::DumpEntry> entries = io::list_tensor_dump(f, "rollout");
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].seq == -1);
  const at::Tensor back = io::read_dumped_tensor(f, "rollout", entries[0]);
  CHECK(back.scalar_type() == at::kBFloat16);
  CHECK(at::equal(back, v));
  CHECK_THROWS_WITH(io::list_tensor_dump(f, "train"), Contains("stray") && Contains("expected a module group here"));
}

TEST_CASE("parity dump: a chosen sample keeps its rows of the batch / CFG halves included", "[dump]") {
  const at::Tensor joint = at::arange(12, at::kFloat).view({6, 2});  // [pos; neg] of 3 samples
  CHECK(at::equal(rl::sample_rows(joint, 1, 3), joint.index_select(0, at::tensor({1, 4}, at::kLong))));
  CHECK(at::equal(rl::sample_rows(joint.narrow(0, 0, 3), 2, 3), joint.narrow(0, 2, 1)));
  const at::Tensor shared = at::ones({4, 2});  // not batched over 3 samples: kept whole
  CHECK(at::equal(rl::sample_rows(shared, 0, 3), shared));

  const std::string path = test::fresh_output_dir("parity_dump_tap") + "/dump.h5";
  {
    rl::ParityDump dump(path, {{0}, {5, 7}, {}});
    CHECK(dump.tap(rl::DumpSide::Rollout, 0, {4, 5, 6}, {2, 2, 2}, /*trained=*/false) == nullptr);  // ODE step
    CHECK(dump.tap(rl::DumpSide::Rollout, 1, {4, 5, 6}, {2, 2, 2}, true) == nullptr);  // rollout not chosen
    CHECK(dump.tap(rl::DumpSide::Rollout, 0, {1, 2, 3}, {2, 2, 2}, true) == nullptr);  // no chosen sample
    const auto tap = dump.tap(rl::DumpSide::Rollout, 0, {4, 5, 6}, {2, 2, 2}, true);
    REQUIRE(tap);
    models::ForwardContext ctx;
    ctx.tap = tap.get();
    ctx.record("proj_out", "out0", joint);
    ctx.record("sde", "log_prob", at::tensor({0.1f, 0.2f, 0.3f}));
    ctx.record("sde", "undefined", at::Tensor());
    {
      models::TapSuppressGuard quiet;  // a recomputing runner's backward
      ctx.record("proj_out", "out0", joint);
    }
  }
  const io::h5::File f = io::h5::File::open(path);
  const std::vector<io::DumpEntry> entries = io::list_tensor_dump(f, "rollout");
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].key == "r0_s5_t2");
  CHECK(at::equal(io::read_dumped_tensor(f, "rollout", entries[0]), rl::sample_rows(joint, 1, 3)));
  CHECK(at::equal(io::read_dumped_tensor(f, "rollout", entries[1]), at::tensor({0.2f})));

  rl::ParityDump steps(path + ".steps.h5", {{0}, {0}, {3}});
  CHECK(steps.tap(rl::DumpSide::Train, 0, {0}, {3}, false) != nullptr);  // listed steps, trained or not
  CHECK(steps.tap(rl::DumpSide::Train, 0, {0}, {2}, true) == nullptr);
  CHECK_THROWS_WITH(steps.tap(rl::DumpSide::Train, 0, {0, 1}, {3}, true), Contains("2 sample ids for 1 steps"));
}
