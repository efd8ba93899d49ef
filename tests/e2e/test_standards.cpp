// E2E standards (tests/standards/<name>.toml + <name>.json): short runs whose
// metric series must be reproduced exactly (or within a tolerance whose
// reason is written in the standard). Re-record with scripts/record_standards.sh.
#include <catch2/catch.hpp>

#include "e2e.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;

TEST_CASE("standards: tiny SD3 GRPO / NFT and SFT runs reproduce their recorded metrics", "[e2e][standard]") {
  for (const std::string name : {"sd3_grpo", "sd3_nft", "sd3_sft"}) {
    const std::string dir = std::string(DITRL_SOURCE_DIR) + "/tests/standards/";
    const std::string out = test::fresh_output_dir("standard_" + name);
    const auto run = test::train(dir + name + ".toml", out, 2);
    INFO(name << "\n" << run.output);
    REQUIRE(run.exit_code == 0);
    const auto check = test::ditrl("standard check " + out + " " + dir + name + ".json");
    INFO(check.output);
    CHECK(check.exit_code == 0);
    CHECK_THAT(check.output, Contains("standard met"));
  }
}
