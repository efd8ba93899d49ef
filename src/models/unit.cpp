#include <ditrl/models/unit.hpp>

namespace ditrl::models {

namespace {
thread_local bool taps_suppressed = false;
}

TapSuppressGuard::TapSuppressGuard() : previous_(taps_suppressed) { taps_suppressed = true; }
TapSuppressGuard::~TapSuppressGuard() { taps_suppressed = previous_; }
bool TapSuppressGuard::active() { return taps_suppressed; }

}  // namespace ditrl::models
