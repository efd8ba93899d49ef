// The deck reference (config/reference.hpp) against the deck reader itself:
// its keys are the keys the reader accepts, its defaults are the values a
// deck without the key gets, and what it prints for a range is the range the
// reader enforces.

#include <ditrl/config/deck.hpp>
#include <ditrl/config/reference.hpp>
#include <ditrl/error.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <set>

using ditrl::config::deck_reference;
using ditrl::config::KeyReference;
using ditrl::config::parse_deck;
using ditrl::config::SectionReference;

namespace {

const char* kMinimal = "[model]\nfamily = \"sd3\"\n";

// The dotted keys of a TOML tree's leaves (values and arrays of values).
void collect_keys(const toml::table& table, const std::string& prefix, std::set<std::string>& keys) {
  for (const auto& [key, node] : table) {
    const std::string dotted = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table())
      collect_keys(*sub, dotted, keys);
    else
      keys.insert(dotted);
  }
}

std::set<std::string> effective_keys(const std::string& deck) {
  std::set<std::string> keys;
  collect_keys(toml::parse(ditrl::config::to_toml(parse_deck(deck, "deck.toml"))), "", keys);
  return keys;
}

// Every key's row by its dotted name; at() of a name it lacks throws, which fails the test.
std::map<std::string, KeyReference> rows(const std::vector<SectionReference>& sections) {
  std::map<std::string, KeyReference> out;
  for (const SectionReference& s : sections)
    for (const KeyReference& k : s.keys) out[s.name + "." + k.key] = k;
  return out;
}

}  // namespace

TEST_CASE("config: the deck reference lists exactly the keys the effective deck has", "[config]") {
  std::set<std::string> documented;
  for (const SectionReference& s : deck_reference())
    for (const KeyReference& k : s.keys)
      // Arrays of tables and absent optional keys are not in a minimal deck's effective configuration.
      if (!s.array && !(k.default_value.empty() && !k.required)) documented.insert(s.name + "." + k.key);
  CHECK(documented == effective_keys(kMinimal));
  CHECK(documented.size() > 90);
}

TEST_CASE("config: each default in the deck reference is the value a deck without the key gets", "[config]") {
  const std::string baseline = ditrl::config::to_toml(parse_deck(kMinimal, "deck.toml"));
  int checked = 0;
  for (const SectionReference& s : deck_reference()) {
    for (const KeyReference& k : s.keys) {
      if (s.array || k.required || k.default_value.empty()) continue;
      const std::string assignment = s.name + "." + k.key + "=" + k.default_value;
      INFO(assignment);
      CHECK(ditrl::config::to_toml(parse_deck(kMinimal, "deck.toml", {assignment})) == baseline);
      ++checked;
    }
  }
  CHECK(checked > 90);
  // Negative control: a value other than the default changes the effective deck.
  CHECK(ditrl::config::to_toml(parse_deck(kMinimal, "deck.toml", {"rollout.steps=11"})) != baseline);
}

TEST_CASE("config: the deck reference shows the reader's ranges and choices and required keys", "[config]") {
  const std::vector<SectionReference> sections = deck_reference();
  const std::map<std::string, KeyReference> row = rows(sections);
  const KeyReference& microgroup = row.at("rollout.microgroup");
  CHECK(microgroup.type == "integer");
  CHECK(microgroup.allowed == "[0, 1048576]");
  CHECK_NOTHROW(parse_deck(kMinimal, "deck.toml", {"rollout.microgroup=1048576"}));
  CHECK_THROWS_AS(parse_deck(kMinimal, "deck.toml", {"rollout.microgroup=1048577"}), ditrl::Error);
  CHECK(row.at("train.lr").allowed == "> 0");
  CHECK(row.at("parallel.startup_timeout_s").allowed == "(0, 1000000000]");
  CHECK(row.at("run.device").allowed == "\"auto\", \"cpu\", \"cuda\"");
  CHECK(row.at("rollout.window").type == "array of integers");
  CHECK(row.at("rollout.window").per_element);
  CHECK(row.at("rollout.shift").default_value.empty());
  CHECK_FALSE(row.at("rollout.shift").required);
  CHECK(row.at("model.family").required);
  CHECK_THROWS_AS(parse_deck("[run]\nseed = 1\n", "deck.toml"), ditrl::Error);
  for (const SectionReference& s : sections) {
    INFO(s.name);
    CHECK_FALSE(s.meaning.empty());
    for (const KeyReference& k : s.keys) CHECK_FALSE(k.meaning.empty());
  }
}

TEST_CASE("config: the deck reference puts arrays of tables and sub-tables under their parent", "[config]") {
  std::vector<std::string> names;
  bool override_is_array = false;
  for (const SectionReference& s : deck_reference()) {
    names.push_back(s.name);
    if (s.name == "precision.override") override_is_array = s.array;
  }
  CHECK(override_is_array);
  const std::vector<std::string> head{
      "run", "model", "model.lora", "precision", "precision.override", "precision.inputs"};
  REQUIRE(names.size() >= head.size());
  CHECK(std::vector<std::string>(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(head.size())) == head);
  // A rule of the array is read with the keys the reference lists for it.
  CHECK_NOTHROW(parse_deck(std::string(kMinimal) + "[[precision.override]]\npattern = \"*norm*\"\ndtype = \"fp32\"\n",
                           "deck.toml"));
}
