#pragma once

// The names a deck, a command line or a file gives an enum's values. Each
// enum the deck reads (the loss, the SDE kind, the step strategy, dtypes, the
// attention backend) has one table, declared beside the enum: the deck reader
// parses a name with it (config/schema.hpp, the only place a name is compared),
// and the effective deck, messages and files print the value back with it, so
// the two directions cannot drift.

#include <array>
#include <cstddef>
#include <string_view>

namespace ditrl {

template <class E>
struct Named {
  std::string_view name;
  E value;
};

// In the order the deck reference lists the choices.
template <class E, std::size_t N>
using NameTable = std::array<Named<E>, N>;

// The name of `value`. Every value of E has one (a unit test checks each
// table), so the empty fallback is never printed.
template <class E, std::size_t N>
constexpr std::string_view name_of(const NameTable<E, N>& names, E value) {
  for (const Named<E>& n : names)
    if (n.value == value) return n.name;
  return {};
}

}  // namespace ditrl
