#include <ditrl/error.hpp>
#include <ditrl/io/metrics.hpp>
#include <ditrl/io/standard.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>

#include <catch2/catch.hpp>

#include "process.hpp"

#include <cmath>

using namespace ditrl::io;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;

namespace {

void write_rows(MetricsWriter& w, int64_t from, int64_t to) {
  for (int64_t step = from; step < to; ++step) {
    std::map<std::string, double> row{{"train/loss", 1.0 / (step + 1)}, {"rollout/reward/raw_mean", 0.1 * step}};
    if (step >= 2) row["train/kl_loss"] = 0.5 * step;
    w.write(step, row);
  }
}

}  // namespace

TEST_CASE("metrics: rows align by step / late series are NaN-padded", "[metrics]") {
  const std::string dir = ditrl::test::fresh_output_dir("metrics_rows");
  MetricsWriter writer(dir + "/metrics.h5", "[model]\nfamily = 'sd3'\n", "cpu", false, 0);
  write_rows(writer, 0, 4);
  const MetricsTable table = read_metrics(dir + "/metrics.h5");
  CHECK(table.steps == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(table.series.at("train/loss") == std::vector<double>{1.0, 0.5, 1.0 / 3, 0.25});
  const std::vector<double>& kl = table.series.at("train/kl_loss");
  REQUIRE(kl.size() == 4);
  CHECK(std::isnan(kl[0]));
  CHECK(std::isnan(kl[1]));
  CHECK(kl[3] == 1.5);
  const auto dump = ditrl::test::run_process("h5dump -d /metrics/train/loss " + dir + "/metrics.h5");
  CHECK(dump.exit_code == 0);
}

TEST_CASE("metrics: a resumed run drops the rows after its checkpoint and continues", "[metrics]") {
  const std::string dir = ditrl::test::fresh_output_dir("metrics_resume");
  {
    MetricsWriter writer(dir + "/a.h5", "deck", "cpu", false, 0);
    write_rows(writer, 0, 5);
  }
  {
    MetricsWriter uninterrupted(dir + "/b.h5", "deck", "cpu", false, 0);
    write_rows(uninterrupted, 0, 5);
  }
  {
    MetricsWriter resumed(dir + "/a.h5", "deck", "cpu", true, 3);  // checkpoint after step 2
    write_rows(resumed, 3, 5);
  }
  const MetricsTable a = read_metrics(dir + "/a.h5"), b = read_metrics(dir + "/b.h5");
  CHECK(a.steps == b.steps);
  CHECK(check_standard(make_standard(b, "deck"), a).empty());
}

TEST_CASE("standard: round trip / bitwise check / tolerances with reasons", "[standard]") {
  const std::string dir = ditrl::test::fresh_output_dir("standard");
  {
    MetricsWriter writer(dir + "/metrics.h5", "deck", "cpu", false, 0);
    write_rows(writer, 0, 3);
  }
  MetricsTable run = read_metrics(dir + "/metrics.h5");
  Standard standard = make_standard(run, "deck");
  write_standard(dir + "/s.json", standard);
  const Standard back = read_standard(dir + "/s.json");
  CHECK(back.metrics.size() == 3);
  CHECK(back.metrics.at("train/loss") == standard.metrics.at("train/loss"));  // exact through JSON
  CHECK(back.deck == "deck");
  CHECK(check_standard(back, run).empty());  // NaN entries compare equal to NaN

  MetricsTable nudged = run;
  nudged.series["train/loss"][1] = std::nextafter(0.5, 1.0);
  const auto problems = check_standard(back, nudged);
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Contains("train/loss: row 1 (step 1)"));
  CHECK_THAT(problems[0], Contains("(bitwise)"));

  Standard tolerant = back;
  tolerant.tolerance["train/loss"] = Tolerance{0.0, 1e-12, "summation order differs across CPU models"};
  CHECK(check_standard(tolerant, nudged, ToleranceMode::Always).empty());
  write_standard(dir + "/t.json", tolerant);
  CHECK(read_standard(dir + "/t.json").tolerance.at("train/loss").reason ==
        "summation order differs across CPU models");

  MetricsTable missing = run;
  missing.series.erase("rollout/reward/raw_mean");
  CHECK_THAT(check_standard(back, missing).at(0), Contains("rollout/reward/raw_mean: missing from the run"));

  // A series the run has and the standard lacks is not silently unchecked;
  // wall-clock timings (perf/) are never recorded, so never asked for.
  MetricsTable extra = run;
  extra.series["train/new_metric"] = {1.0, 2.0, 3.0};
  extra.series["perf/step_seconds"] = {0.1, 0.2, 0.3};
  const auto unrecorded = check_standard(back, extra);
  REQUIRE(unrecorded.size() == 1);
  CHECK_THAT(unrecorded[0], Contains("train/new_metric: in the run but not in the standard"));
  CHECK(make_standard(extra, "deck").metrics.count("perf/step_seconds") == 0);

  // A tolerance whose series is gone would otherwise excuse nothing unseen.
  Standard orphan = back;
  orphan.tolerance["train/gone"] = Tolerance{1e-3, 0.0, "a reason"};
  CHECK_THAT(check_standard(orphan, run).at(0), Contains("train/gone: has a tolerance but no recorded series"));
}

TEST_CASE("standard: tolerances apply only off the recording CPU / or when forced", "[standard]") {
  MetricsTable run;
  run.steps = {0, 1};
  run.series["train/loss"] = {1.0, 0.5};
  run.cpu = "CPU A; avx2 avx512f";
  Standard standard = make_standard(run, "deck");
  CHECK(standard.cpu == run.cpu);
  standard.tolerance["train/loss"] = Tolerance{1e-6, 0.0, "bf16 kernels of another CPU, measured"};

  MetricsTable nudged = run;
  nudged.series["train/loss"][1] = 0.5 + 1e-9;
  // Same CPU identity: the same kernels ran, so the tolerance does not apply.
  CHECK_FALSE(tolerances_apply(standard, nudged));
  REQUIRE(check_standard(standard, nudged).size() == 1);
  CHECK_THAT(check_standard(standard, nudged)[0], Contains("(bitwise)"));
  CHECK(check_standard(standard, nudged, ToleranceMode::Always).empty());
  // Another CPU, or a run or standard without an identity: it applies.
  nudged.cpu = "CPU B; avx2 avx512f avx512_bf16";
  CHECK(tolerances_apply(standard, nudged));
  CHECK(check_standard(standard, nudged).empty());
  nudged.cpu.clear();
  CHECK(check_standard(standard, nudged).empty());
  // Beyond the bound it fails there too.
  nudged.series["train/loss"][1] = 0.5 + 1e-5;
  CHECK_THAT(check_standard(standard, nudged).at(0), Contains("(tolerance abs 1e-06 rel 0)"));

  const std::string dir = ditrl::test::fresh_output_dir("standard_cpu");
  write_standard(dir + "/s.json", standard);
  CHECK(read_standard(dir + "/s.json").cpu == "CPU A; avx2 avx512f");
  // This machine's identity names its CPU and is what metrics files carry.
  CHECK_THAT(cpu_kernel_identity(), Contains(";"));
  {
    MetricsWriter writer(dir + "/metrics.h5", "deck", "cpu", false, 0);
    write_rows(writer, 0, 1);
  }
  CHECK(read_metrics(dir + "/metrics.h5").cpu == cpu_kernel_identity());
  // Half GEMMs other than the CPU's default kernels are another identity.
  using namespace ditrl::precision;
  const CpuHalfGemm chosen = cpu_half_gemm();
  const CpuFp32Gemm fp32 = cpu_fp32_gemm();
  set_cpu_fp32_gemm(CpuFp32Gemm::Blas);
  CHECK_THAT(cpu_kernel_identity(), !Contains("cpu_half_gemm"));
  const CpuHalfGemm other =
      parse_cpu_half_gemm("auto") == CpuHalfGemm::Native ? CpuHalfGemm::Widened : CpuHalfGemm::Native;
  set_cpu_half_gemm(other);
  CHECK_THAT(cpu_kernel_identity(), EndsWith("; cpu_half_gemm=" + cpu_half_gemm_name(other)));
  set_cpu_half_gemm(chosen);
  // So are oneDNN's fp32 GEMMs: every standard so far ran LibTorch's BLAS.
  CHECK_THAT(cpu_kernel_identity(), !Contains("cpu_fp32_gemm"));
  set_cpu_fp32_gemm(CpuFp32Gemm::Onednn);
  CHECK_THAT(cpu_kernel_identity(), EndsWith("; cpu_fp32_gemm=onednn"));
  set_cpu_fp32_gemm(fp32);
}

TEST_CASE("standard: `ditrl standard record|check` on a run directory", "[standard][cli]") {
  const std::string dir = ditrl::test::fresh_output_dir("standard_cli");
  {
    MetricsWriter writer(dir + "/metrics.h5", "deck text", "cpu", false, 0);
    write_rows(writer, 0, 3);
  }
  const std::string bin = DITRL_BINARY;
  const auto rec = ditrl::test::run_process(bin + " standard record " + dir + " " + dir + "/std.json");
  CHECK(rec.exit_code == 0);
  CHECK_THAT(rec.output, Contains("recorded 3 metrics x 3 steps"));
  const auto ok = ditrl::test::run_process(bin + " standard check " + dir + " " + dir + "/std.json");
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains("standard met"));
  {
    MetricsWriter writer(dir + "/metrics.h5", "deck text", "cpu", true, 2);
    writer.write(2, {{"train/loss", 9.0}, {"rollout/reward/raw_mean", 0.2}, {"train/kl_loss", 1.0}});
  }
  const auto bad = ditrl::test::run_process(bin + " standard check " + dir + " " + dir + "/std.json");
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("train/loss: row 2 (step 2): run 9"));
}
