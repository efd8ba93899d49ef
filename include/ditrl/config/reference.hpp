#pragma once

// The deck reference: every section and key of the deck with its type,
// default, allowed values and meaning, read from the sections' own fields()
// (config/sections.hpp) by one more visitor, so it cannot drift from what the
// deck reader accepts. `ditrl deck-reference` renders it as
// docs/deck-reference.md.

#include <string>
#include <vector>

namespace ditrl::config {

struct KeyReference {
  std::string key;   // as written inside its section
  std::string type;  // "integer", "number", "string", "boolean", "array of integers", ...
  bool required = false;
  // The default as TOML text (`ditrl check` prints the same value); empty for
  // a required key and for an optional one whose absence means something.
  std::string default_value;
  std::string allowed;       // "[0, 4096]", "> 0", "\"auto\", \"cpu\"", ...; empty: any value of the type
  bool per_element = false;  // an array whose every element must be `allowed`
  std::string meaning;
};

struct SectionReference {
  std::string name;    // dotted: "model.lora"
  bool array = false;  // [[name]]: zero or more tables
  std::string meaning;
  std::vector<KeyReference> keys;
};

// Every section in the order the reader visits them, each sub-table after its
// parent's section.
std::vector<SectionReference> deck_reference();

}  // namespace ditrl::config
