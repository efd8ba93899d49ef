#include <ditrl/config/schema.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ditrl::config {

std::string where(const toml::source_region& region) {
  const std::string path = region.path ? *region.path : std::string("<deck>");
  if (path.rfind("--set", 0) == 0) return "(" + path + ")";
  return fmt::format("{}:{}:{}", path, region.begin.line, region.begin.column);
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Closest candidate by edit distance, or empty when nothing is close enough.
std::string did_you_mean(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(key, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  // A suggestion must be closer than rewriting most of the key.
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_distance <= limit ? best : std::string();
}

std::string node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "number";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

}  // namespace

std::string not_a_choice(std::string_view what, const std::string& text, const std::vector<std::string>& choices) {
  std::string message = fmt::format("{} = {} is out of range: expected {}", what, detail::show(text),
                                    detail::describe(choices));
  if (const std::string suggestion = did_you_mean(text, choices); !suggestion.empty())
    message += fmt::format(" (did you mean {}?)", detail::show(suggestion));
  return message;
}

void Diagnostics::throw_if_any(std::string_view what) const {
  if (errors_.empty()) return;
  std::string message = fmt::format("{}: {} problem{}", what, errors_.size(), errors_.size() == 1 ? "" : "s");
  for (const std::string& e : errors_) message += "\n  " + e;
  throw Error(message);
}

std::string SourceMap::locate(const std::string& key) const {
  for (std::string k = key;;) {
    if (auto it = at_.find(k); it != at_.end()) return it->second;
    const size_t dot = k.rfind('.');
    if (dot == std::string::npos) break;
    k.resize(dot);
  }
  return file_;
}

namespace detail {

std::string show(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}
std::string show(const std::string& v) { return "\"" + v + "\""; }

std::string describe(const Between& c) { return fmt::format("a value in [{}, {}]", show(c.lo), show(c.hi)); }
std::string describe(const Above& c) {
  if (c.hi == kFp32Max) return fmt::format("a finite value > {} within fp32's range (<= 3.4e38)", show(c.lo));
  return fmt::format("a value > {} and <= {}", show(c.lo), show(c.hi));
}
std::string describe(const OneOf& c) { return describe(c.values); }
std::string describe(const std::vector<std::string>& choices) {
  std::string s = "one of";
  for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", \"" : " \"") + choices[i] + "\"";
  return s;
}

bool satisfies(double v, const Between& c) { return v >= c.lo && v <= c.hi; }
bool satisfies(double v, const Above& c) { return v > c.lo && v <= c.hi; }
bool satisfies(const std::string& v, const OneOf& c) {
  return std::find(c.values.begin(), c.values.end(), v) != c.values.end();
}

}  // namespace detail

void Reader::finish() {
  for (const auto& [key, node] : table_) {
    const std::string name(key.str());
    if (std::find(known_.begin(), known_.end(), name) != known_.end()) continue;
    // A key --set added has no source of its own; its value has the --set's.
    const toml::source_region& source = key.source().path ? key.source() : node.source();
    std::string message = fmt::format("{}: unknown key '{}'", where(source), dotted(name));
    if (std::string suggestion = did_you_mean(name, known_); !suggestion.empty())
      message += fmt::format(" (did you mean '{}'?)", dotted(suggestion));
    else
      message += fmt::format(" (known keys here: {})", fmt::join(known_, ", "));
    diag_.error(message);
  }
}

void Reader::wrong_type(std::string_view key, const toml::node& node, const std::string& expected) {
  diag_.error(fmt::format("{}: '{}' must be a {}, got a {}", where(node.source()), dotted(key), expected,
                          node_type_name(node)));
}

void Reader::missing(std::string_view key, const std::string& expected) {
  const std::string at = table_.source().path ? where(table_.source()) : sources_.locate(prefix_);
  diag_.error(fmt::format("{}: missing required key '{}' ({})", at, dotted(key), expected));
}

void Reader::out_of_range(std::string_view key, const toml::node& node, const std::string& shown,
                          const std::string& expected) {
  diag_.error(fmt::format("{}: '{}' = {} is out of range: expected {}", where(node.source()), dotted(key),
                          shown, expected));
}

void Reader::not_a_choice(std::string_view key, const toml::node& node, const std::string& text,
                          const std::vector<std::string>& choices) {
  diag_.error(fmt::format("{}: {}", where(node.source()),
                          config::not_a_choice("'" + dotted(key) + "'", text, choices)));
}

}  // namespace ditrl::config
