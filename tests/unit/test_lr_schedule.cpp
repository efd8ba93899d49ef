#include <ditrl/rl/lr_schedule.hpp>

#include <catch2/catch.hpp>

using ditrl::rl::LrSchedule;

TEST_CASE("lr schedule: constant / linear warmup / warmup + cosine", "[lr]") {
  CHECK(LrSchedule{"constant", 1e-4, 0, 10}.at(7) == 1e-4);
  const LrSchedule warm{"warmup", 1e-3, 4, 100};
  CHECK(warm.at(0) == Approx(2.5e-4));
  CHECK(warm.at(3) == Approx(1e-3));
  CHECK(warm.at(50) == Approx(1e-3));
  const LrSchedule cosine{"cosine", 1e-3, 2, 12};
  CHECK(cosine.at(0) == Approx(5e-4));
  CHECK(cosine.at(2) == Approx(1e-3));
  CHECK(cosine.at(7) == Approx(5e-4));
  CHECK(cosine.at(12) == Approx(0.0).margin(1e-18));
  CHECK_THROWS(LrSchedule{"linear", 1e-3, 0, 1}.at(0));
}
