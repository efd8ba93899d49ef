// dist::PhaseTimer on the CPU: the wall time of its intervals, not of the gaps
// between them. (On a GPU it times events: tests/gpu/test_phase_timer.cpp.)
#include <ditrl/dist/phase_timer.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

using namespace ditrl;

TEST_CASE("phase timer: the CPU timer sums its intervals and leaves out the gaps between them", "[timer]") {
  using std::chrono::milliseconds;
  dist::PhaseTimer timer(c10::kCPU);
  CHECK(timer.seconds() == 0.0);
  for (int i = 0; i < 2; ++i) {
    {
      const dist::TimedScope timed(timer);
      std::this_thread::sleep_for(milliseconds(20));
    }
    std::this_thread::sleep_for(milliseconds(300));  // not timed
  }
  const double seconds = timer.seconds();
  CHECK(seconds >= 0.040);
  CHECK(seconds < 0.300);
  CHECK(timer.seconds() == seconds);  // reading does not change the total
}
