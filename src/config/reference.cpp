#include <ditrl/config/deck.hpp>
#include <ditrl/config/reference.hpp>

#include <fmt/format.h>

#include <type_traits>

namespace ditrl::config {

namespace {

// Shortest text that reads back as the same double, as TOML writes a float:
// toml++'s own formatting prints 0.9 as 0.90000000000000002.
std::string toml_float(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // 'n': inf and nan
  return text;
}

std::string toml_string(const std::string& v) {
  std::string text = "\"";
  for (const char ch : v) {
    if (ch == '"' || ch == '\\') text += '\\';
    if (static_cast<unsigned char>(ch) < 0x20)
      text += fmt::format("\\u{:04X}", static_cast<unsigned>(ch));
    else
      text += ch;
  }
  return text + "\"";
}

template <class T>
std::string toml_text(const T& value) {
  if constexpr (detail::is_vector<T>::value) {
    std::string text = "[";
    for (size_t i = 0; i < value.size(); ++i) text += (i ? ", " : "") + toml_text(value[i]);
    return text + "]";
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else if constexpr (std::is_floating_point_v<T>) {
    return toml_float(static_cast<double>(value));
  } else {
    return toml_string(value);
  }
}

// The constraints as interval notation and value lists; detail::describe()
// words the same ranges for error messages.
std::string allowed(const Between& c) {
  return fmt::format("[{}, {}]", detail::show(c.lo), detail::show(c.hi));
}
std::string allowed(const Above& c) {
  if (c.hi == kFp32Max) return "> " + detail::show(c.lo);
  return fmt::format("({}, {}]", detail::show(c.lo), detail::show(c.hi));
}
std::string allowed(const std::vector<std::string>& choices) {
  std::vector<std::string> shown;
  for (const std::string& v : choices) shown.push_back(detail::show(v));
  return fmt::format("{}", fmt::join(shown, ", "));
}
std::string allowed(const OneOf& c) {
  return allowed(c.values);
}
template <class E, size_t N>
std::string allowed(const NameTable<E, N>& names) {
  return allowed(names_of(names));
}

// The default as TOML text; an enum's by its name in the key's table.
template <class T, class... C>
std::string default_text(const T& value, const C&... constraints) {
  if constexpr (std::is_enum_v<T>)
    return toml_string(std::string(name_of(constraints..., value)));
  else
    return toml_text(value);
}

// A visitor like Reader and Writer that records each key of the fields() it
// visits instead of reading or writing it; the values it sees are the
// defaults of a default-constructed Config. The root one (no section of its
// own) only opens the top-level tables.
class Describer {
 public:
  explicit Describer(std::vector<SectionReference>& out) : out_(out), section_(kRoot) {}

  template <class T, class... C>
  void operator()(std::string_view key, const T& value, std::string_view meaning, const C&... constraints) {
    add(key, value, false, meaning, constraints...);
  }
  template <class T, class... C>
  void required(std::string_view key, const T& value, std::string_view meaning, const C&... constraints) {
    add(key, value, true, meaning, constraints...);
  }
  template <class S>
  void table(std::string_view key, S& sub, std::string_view meaning) {
    Describer inner = open(key, false, meaning);
    sub.fields(inner);
  }
  // One table or an array of them: the keys are the same, listed once.
  template <class S>
  void table_or_tables(std::string_view key, S& single, std::vector<S>& /*none*/, std::string_view meaning) {
    table(key, single, meaning);
  }
  // The keys of one table of the array: the array itself defaults to none.
  template <class S>
  void tables(std::string_view key, std::vector<S>& /*none*/, std::string_view meaning) {
    S one;
    Describer inner = open(key, true, meaning);
    one.fields(inner);
  }

 private:
  static constexpr size_t kRoot = static_cast<size_t>(-1);

  Describer(std::vector<SectionReference>& out, size_t section) : out_(out), section_(section) {}

  Describer open(std::string_view key, bool array, std::string_view meaning) {
    std::string name(key);
    if (section_ != kRoot) name = out_[section_].name + "." + name;
    out_.push_back({name, array, std::string(meaning), {}});
    return Describer(out_, out_.size() - 1);
  }

  template <class T, class... C>
  void add(std::string_view key, const T& value, bool required, std::string_view meaning, const C&... constraints) {
    KeyReference k;
    k.key = key;
    k.type = detail::type_name<T>();
    k.required = required;
    if constexpr (detail::is_optional<T>::value) {
      if (value) k.default_value = toml_text(*value);
    } else if (!required) {
      k.default_value = default_text(value, constraints...);
    }
    const std::vector<std::string> each{allowed(constraints)...};
    k.allowed = fmt::format("{}", fmt::join(each, " and "));
    k.per_element = detail::is_vector<T>::value && !each.empty();
    k.meaning = meaning;
    // at(): a key outside any table is a schema bug, not a deck's.
    out_.at(section_).keys.push_back(std::move(k));
  }

  std::vector<SectionReference>& out_;
  size_t section_;
};

}  // namespace

std::vector<SectionReference> deck_reference() {
  std::vector<SectionReference> sections;
  Config defaults;
  Describer root(sections);
  defaults.sections(root);
  return sections;
}

}  // namespace ditrl::config
