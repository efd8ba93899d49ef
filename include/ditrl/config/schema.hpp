#pragma once

// The deck schema machinery. A section is a plain struct with a
//   template <class V> void fields(V& v)
// member that names each key once: v("key", member, "meaning", constraints...).
// The same description drives reading (Reader: types, ranges, unknown keys
// with a did-you-mean), writing back to TOML (Writer) and so `--set`
// overrides, which are applied to the TOML tree before reading and get the
// same checks, and the deck reference (config/reference.hpp), which prints
// each key's type, default, constraints and meaning. The meaning is a
// required argument so that no key goes undocumented; only the reference
// reads it. An enum-valued key takes its enum's name table as its one
// constraint, v("loss", loss, "meaning", rl::kLossNames): the deck names the
// value, the member holds the enum, and each visitor maps between the two
// with that table (ditrl/name_table.hpp).

#include <ditrl/name_table.hpp>

#include <toml++/toml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ditrl::config {

// Inclusive numeric range.
struct Between {
  double lo, hi;
};
// The largest finite fp32: most unbounded deck numbers end up in fp32 tensors.
constexpr double kFp32Max = 3.4028234663852886e38;

// Strictly greater than lo, and at most hi.
struct Above {
  double lo;
  double hi = kFp32Max;
};
// A string drawn from a fixed set.
struct OneOf {
  std::vector<std::string> values;
  OneOf(std::initializer_list<const char*> v) : values(v.begin(), v.end()) {}
};

// The value `text` names in `names`, if any: the one place outside a test
// where such a name is compared.
template <class E, std::size_t N>
std::optional<E> parse_name(const NameTable<E, N>& names, std::string_view text) {
  for (const Named<E>& n : names)
    if (n.name == text) return n.value;
  return std::nullopt;
}

template <class E, std::size_t N>
std::vector<std::string> names_of(const NameTable<E, N>& names) {
  std::vector<std::string> out;
  for (const Named<E>& n : names) out.emplace_back(n.name);
  return out;
}

// "file:line:col" for a node, or "--set k=v" for an override.
std::string where(const toml::source_region& region);

// "`what` = "text" is out of range: expected one of "a", "b" (did you mean
// "a"?)": a name that is none of `choices`.
std::string not_a_choice(std::string_view what, const std::string& text, const std::vector<std::string>& choices);

// Collects every problem of a deck so a user fixes them in one pass.
class Diagnostics {
 public:
  void error(std::string message) { errors_.push_back(std::move(message)); }
  bool empty() const { return errors_.empty(); }
  const std::vector<std::string>& errors() const { return errors_; }
  // Throws ditrl::Error listing every collected problem, if any.
  void throw_if_any(std::string_view what) const;

 private:
  std::vector<std::string> errors_;
};

// Where each dotted key of the deck came from, for cross-field messages.
class SourceMap {
 public:
  void set(const std::string& key, std::string location) { at_[key] = std::move(location); }
  // Location of `key`, else of its section, else the deck file.
  std::string locate(const std::string& key) const;
  void set_file(std::string file) { file_ = std::move(file); }

 private:
  std::map<std::string, std::string> at_;
  std::string file_;
};

namespace detail {

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "boolean";
  else if constexpr (std::is_integral_v<T>)
    return "integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "number";
  else if constexpr (std::is_same_v<T, std::string> || std::is_enum_v<T>)
    return "string";  // an enum by its name
  else if constexpr (is_vector<T>::value)
    return "array of " + type_name<typename T::value_type>() + "s";
  else if constexpr (is_optional<T>::value)
    return type_name<typename T::value_type>();
  else
    return "table";
}

std::string describe(const Between& c);
std::string describe(const Above& c);
std::string describe(const OneOf& c);
std::string describe(const std::vector<std::string>& choices);
bool satisfies(double v, const Between& c);
bool satisfies(double v, const Above& c);
bool satisfies(const std::string& v, const OneOf& c);
std::string show(double v);
std::string show(const std::string& v);

// Scalar conversion: false when the node has the wrong type.
template <class T>
bool convert(const toml::node& node, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = node.value_exact<bool>()) return out = *v, true;
    return false;
  } else if constexpr (std::is_integral_v<T>) {
    if (auto v = node.value_exact<int64_t>()) return out = static_cast<T>(*v), true;
    return false;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (auto v = node.value_exact<double>()) return out = static_cast<T>(*v), true;
    if (auto v = node.value_exact<int64_t>()) return out = static_cast<T>(*v), true;
    return false;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto v = node.value_exact<std::string>()) return out = *v, true;
    return false;
  } else {
    static_assert(sizeof(T) == 0, "unsupported deck field type");
  }
}

}  // namespace detail

// Reads one TOML table into a section struct.
class Reader {
 public:
  Reader(const toml::table& table, std::string prefix, Diagnostics& diag, SourceMap& sources)
      : table_(table), prefix_(std::move(prefix)), diag_(diag), sources_(sources) {}

  template <class T, class... C>
  void operator()(std::string_view key, T& value, std::string_view /*meaning*/, const C&... constraints) {
    read(key, value, false, constraints...);
  }
  template <class T, class... C>
  void required(std::string_view key, T& value, std::string_view /*meaning*/, const C&... constraints) {
    read(key, value, true, constraints...);
  }
  // A sub-table ([section.key]) read into a struct with its own fields().
  template <class S>
  void table(std::string_view key, S& sub, std::string_view /*meaning*/) {
    known_.emplace_back(key);
    // An absent table is read as empty so its required keys are reported.
    static const toml::table empty;
    const toml::node* node = table_.get(key);
    const toml::table* t = node ? node->as_table() : &empty;
    if (!t) return wrong_type(key, *node, "table");
    Reader r(*t, dotted(key), diag_, sources_);
    sub.fields(r);
    r.finish();
  }
  // An array of tables ([[section.key]]), each read into S.
  template <class S>
  void tables(std::string_view key, std::vector<S>& subs, std::string_view /*meaning*/) {
    known_.emplace_back(key);
    const toml::node* node = table_.get(key);
    if (!node) return;
    const toml::array* arr = node->as_array();
    if (!arr) return wrong_type(key, *node, "array of tables");
    subs.clear();
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table* t = (*arr)[i].as_table();
      if (!t) return wrong_type(key, (*arr)[i], "array of tables");
      S sub;
      Reader r(*t, dotted(key) + "[" + std::to_string(i) + "]", diag_, sources_);
      sub.fields(r);
      r.finish();
      subs.push_back(std::move(sub));
    }
  }
  // A key that is either one table ([key]) or an array of them ([[key]]):
  // the array fills `subs` (at least one entry), the table or its absence
  // fills `single`.
  template <class S>
  void table_or_tables(std::string_view key, S& single, std::vector<S>& subs, std::string_view meaning) {
    const toml::node* node = table_.get(key);
    if (!node || !node->is_array()) return table(key, single, meaning);
    tables(key, subs, meaning);
    if (subs.empty()) missing(key, "at least one [[" + dotted(key) + "]] entry");
  }
  // Reports keys the section does not know, with a suggestion.
  void finish();

 private:
  std::string dotted(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
  }
  void wrong_type(std::string_view key, const toml::node& node, const std::string& expected);
  void missing(std::string_view key, const std::string& expected);
  void out_of_range(std::string_view key, const toml::node& node, const std::string& shown,
                    const std::string& expected);
  void not_a_choice(std::string_view key, const toml::node& node, const std::string& text,
                    const std::vector<std::string>& choices);

  template <class T, class... C>
  void read(std::string_view key, T& value, bool is_required, const C&... constraints) {
    known_.emplace_back(key);
    const toml::node* node = table_.get(key);
    if (!node) {
      if (is_required) missing(key, detail::type_name<T>());
      return;
    }
    sources_.set(dotted(key), where(node->source()));
    if constexpr (detail::is_optional<T>::value) {
      typename T::value_type inner{};
      if (convert_checked(key, *node, inner, constraints...)) value = std::move(inner);
    } else {
      convert_checked(key, *node, value, constraints...);
    }
  }

  template <class T, class... C>
  bool convert_checked(std::string_view key, const toml::node& node, T& out, const C&... c) {
    if constexpr (detail::is_vector<T>::value) {
      const toml::array* arr = node.as_array();
      if (!arr) return wrong_type(key, node, detail::type_name<T>()), false;
      T result;
      for (const toml::node& element : *arr) {
        typename T::value_type item{};
        if (!convert_checked(key, element, item, c...)) return false;
        result.push_back(std::move(item));
      }
      out = std::move(result);
      return true;
    } else if constexpr (std::is_enum_v<T>) {
      static_assert(sizeof...(C) == 1, "an enum key takes its name table as its one constraint");
      return (convert_name(key, node, out, c), ...);
    } else {
      T converted{};
      if (!detail::convert(node, converted)) return wrong_type(key, node, detail::type_name<T>()), false;
      bool ok = true;
      (check(key, node, converted, c, ok), ...);
      if (ok) out = std::move(converted);
      return ok;
    }
  }

  template <class E, std::size_t N>
  bool convert_name(std::string_view key, const toml::node& node, E& out, const NameTable<E, N>& names) {
    std::string text;
    if (!detail::convert(node, text)) return wrong_type(key, node, "string"), false;
    const std::optional<E> value = parse_name(names, text);
    if (!value) return not_a_choice(key, node, text, names_of(names)), false;
    out = *value;
    return true;
  }

  template <class T, class Constraint>
  void check(std::string_view key, const toml::node& node, const T& v, const Constraint& c, bool& ok) {
    if (!ok) return;
    if constexpr (std::is_same_v<Constraint, OneOf>) {
      static_assert(std::is_same_v<T, std::string>, "OneOf constrains strings");
      if (!detail::satisfies(v, c)) {
        not_a_choice(key, node, v, c.values);
        ok = false;
      }
    } else {
      static_assert(std::is_arithmetic_v<T>, "numeric constraint on a non-number");
      if (!detail::satisfies(static_cast<double>(v), c)) {
        out_of_range(key, node, detail::show(static_cast<double>(v)), detail::describe(c));
        ok = false;
      }
    }
  }

  const toml::table& table_;
  std::string prefix_;
  Diagnostics& diag_;
  SourceMap& sources_;
  std::vector<std::string> known_;
};

// Writes a section struct back to a TOML table (the effective deck).
class Writer {
 public:
  explicit Writer(toml::table& out) : out_(out) {}

  template <class T, class... C>
  void operator()(std::string_view key, const T& value, std::string_view /*meaning*/, const C&... c) {
    if constexpr (detail::is_optional<T>::value) {
      if (value) out_.insert_or_assign(key, to_node(*value));
    } else if constexpr (std::is_enum_v<T>) {
      out_.insert_or_assign(key, toml::value<std::string>(std::string(name_of(c..., value))));
    } else {
      out_.insert_or_assign(key, to_node(value));
    }
  }
  template <class T, class... C>
  void required(std::string_view key, const T& value, std::string_view meaning, const C&... c) {
    (*this)(key, value, meaning, c...);
  }
  template <class S>
  void table(std::string_view key, S& sub, std::string_view /*meaning*/) {
    toml::table t;
    Writer w(t);
    sub.fields(w);
    out_.insert_or_assign(key, std::move(t));
  }
  template <class S>
  void table_or_tables(std::string_view key, S& single, std::vector<S>& subs, std::string_view meaning) {
    if (subs.empty()) return table(key, single, meaning);
    tables(key, subs, meaning);
  }
  template <class S>
  void tables(std::string_view key, std::vector<S>& subs, std::string_view /*meaning*/) {
    if (subs.empty()) return;
    toml::array arr;
    for (S& sub : subs) {
      toml::table t;
      Writer w(t);
      sub.fields(w);
      arr.push_back(std::move(t));
    }
    out_.insert_or_assign(key, std::move(arr));
  }

 private:
  template <class T>
  static auto to_node(const T& v) {
    if constexpr (detail::is_vector<T>::value) {
      toml::array arr;
      for (const auto& e : v) arr.push_back(to_node(e));
      return arr;
    } else if constexpr (std::is_same_v<T, bool>) {
      return toml::value<bool>(v);
    } else if constexpr (std::is_integral_v<T>) {
      return toml::value<int64_t>(static_cast<int64_t>(v));
    } else if constexpr (std::is_floating_point_v<T>) {
      return toml::value<double>(static_cast<double>(v));
    } else {
      return toml::value<std::string>(v);
    }
  }

  toml::table& out_;
};

}  // namespace ditrl::config
