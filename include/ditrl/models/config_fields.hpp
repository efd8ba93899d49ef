#pragma once

// A family config names its config-file keys once, in
//   template <class V> void fields(V& v)
// as v("key", member, kinds...), in the order the written file lists them
// (an exported config.json keeps the bytes it had before this list). The
// same list reads a config (read_config), writes one
// (write_config) and checks the sizes that must be positive
// (require_positive); rules between keys stay in the config's validate().
// A member's kinds:
//   Positive    validate() refuses a value <= 0;
//   NotInFile   ditrl's own value (the pipeline's text length): checked, never read or written;
//   Coded       a bool the file spells as JSON values (SD3's qk_norm: "rms_norm" or null);
//   NullMeans   an integer whose null takes another key's value (`out_channels or in_channels`).
// Keys without a member:
//   v("key", Fixed{...})   the one value ditrl builds; any other is refused, saying why;
//   v("key", Ignored{})    a legacy key read and dropped.
// Integers, numbers, bools, strings and integer lists are read with errors
// that name the file and the key (models/json_config.hpp).

#include <ditrl/error.hpp>
#include <ditrl/models/json_config.hpp>

#include <boost/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ditrl::models {

struct Positive {};
struct NotInFile {};
// `on` is true; any of `off` is false, and false is written as off[0].
struct Coded {
  boost::json::value on;
  std::vector<boost::json::value> off;
};
struct NullMeans {
  const int64_t* other;
};
struct Fixed {
  boost::json::value value;
  std::string why;      // the error's end: "'key' = <value> is not supported: <why>"
  bool written = true;  // whether write_config writes the key
};
struct Ignored {};

namespace json_config {

namespace detail {

template <class Kind, class... Kinds>
constexpr bool has = (std::is_same_v<Kind, Kinds> || ...);

// The one kind of type Kind among `kinds`.
template <class Kind, class... Kinds>
const Kind& find(const Kinds&... kinds) {
  const Kind* out = nullptr;
  (
      [&] {
        if constexpr (std::is_same_v<Kinds, Kind>) out = &kinds;
      }(),
      ...);
  return *out;
}

}  // namespace detail

// Reads a config's keys from a JSON object into the members its fields() names.
class Reader {
 public:
  // `integral_doubles`: an integer key also takes 2.0 (ltx_core's metadata
  // comes from Python, where a size may have become a float).
  Reader(std::string source, bool integral_doubles) : source_(std::move(source)), integral_doubles_(integral_doubles) {}

  template <class T, class... Kinds>
  void operator()(const char* key, T& member, const Kinds&... kinds) {
    if constexpr (!detail::has<NotInFile, Kinds...>) {
      if constexpr (std::is_same_v<T, bool> && detail::has<Coded, Kinds...>) {
        const Coded code = detail::find<Coded>(kinds...);
        keys_[key] = [this, key, &member, code](const boost::json::value& v) { member = read_coded(key, v, code); };
      } else if constexpr (std::is_same_v<T, int64_t> && detail::has<NullMeans, Kinds...>) {
        const int64_t* other = detail::find<NullMeans>(kinds...).other;
        keys_[key] = [this, key, &member, other](const boost::json::value& v) {
          if (v.is_null())
            after_.push_back([&member, other] { member = *other; });
          else
            member = read_int(key, v);
        };
      } else {
        keys_[key] = [this, key, &member](const boost::json::value& v) { read_value(key, v, member); };
      }
    }
  }
  void operator()(const char* key, const Fixed& fixed) {
    keys_[key] = [this, key, fixed](const boost::json::value& v) { check_fixed(key, v, fixed); };
  }
  void operator()(const char* key, Ignored) {
    keys_[key] = [](const boost::json::value&) {};
  }

  // Reads every key of `object` that does not start with '_' (_class_name,
  // _diffusers_version: metadata), in the file's order; returns the keys no
  // field names.
  std::vector<std::string> read(const boost::json::object& object);

 private:
  int64_t read_int(const char* key, const boost::json::value& v) const;
  void read_value(const char* key, const boost::json::value& v, int64_t& member) const { member = read_int(key, v); }
  void read_value(const char* key, const boost::json::value& v, double& member) const;
  void read_value(const char* key, const boost::json::value& v, bool& member) const;
  void read_value(const char* key, const boost::json::value& v, std::string& member) const;
  void read_value(const char* key, const boost::json::value& v, std::vector<int64_t>& member) const;
  bool read_coded(const char* key, const boost::json::value& v, const Coded& code) const;
  void check_fixed(const char* key, const boost::json::value& v, const Fixed& fixed) const;

  std::string source_;
  bool integral_doubles_;
  std::map<std::string, std::function<void(const boost::json::value&)>> keys_;
  std::vector<std::function<void()>> after_;  // null-means keys, once every key is read
};

// Writes a config's keys into a JSON object, in fields() order.
class Writer {
 public:
  explicit Writer(boost::json::object& out) : out_(out) {}

  template <class T, class... Kinds>
  void operator()(const char* key, const T& member, const Kinds&... kinds) {
    if constexpr (detail::has<NotInFile, Kinds...>) {
      return;
    } else if constexpr (std::is_same_v<T, bool> && detail::has<Coded, Kinds...>) {
      const Coded& code = detail::find<Coded>(kinds...);
      out_[key] = member ? code.on : code.off.front();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      out_[key] = int_array(member);
    } else {
      out_[key] = member;
    }
  }
  void operator()(const char* key, const Fixed& fixed) {
    if (fixed.written) out_[key] = fixed.value;
  }
  void operator()(const char*, Ignored) {}

 private:
  boost::json::object& out_;
};

// Fails with "<family> config: <key> must be positive, got <value>" for the
// first Positive member that is not.
class PositiveCheck {
 public:
  explicit PositiveCheck(const char* family) : family_(family) {}

  template <class T, class... Kinds>
  void operator()(const char* key, const T& member, const Kinds&...) const {
    if constexpr (detail::has<Positive, Kinds...>)
      if (!(member > 0)) fail("{} config: {} must be positive, got {}", family_, key, member);
  }
  void operator()(const char*, const Fixed&) const {}
  void operator()(const char*, Ignored) const {}

 private:
  const char* family_;
};

// The JSON object of config text `text`; `source` names it in errors.
boost::json::object parse_object(const std::string& text, const std::string& source);

// Fails (`strict`) or warns about `keys`, the keys of `source` no field names.
void report_unknown(const std::vector<std::string>& keys, const std::string& source, const std::string& model_class,
                    bool strict);

// Reads `object`'s keys into `config`. A key no field names is an error
// naming `model_class` (the class the reference loader builds) when
// `strict`, else a warning (a checkpoint's own metadata may carry keys of
// newer features).
template <class Config>
void read_config(const boost::json::object& object, const std::string& source, const std::string& model_class,
                 Config& config, bool strict = true, bool integral_doubles = false) {
  Reader reader(source, integral_doubles);
  config.fields(reader);
  report_unknown(reader.read(object), source, model_class, strict);
}

// `config`'s keys appended to `out`.
template <class Config>
void write_config(const Config& config, boost::json::object& out) {
  Config copy = config;  // fields() is not const: one list serves reading too
  Writer writer(out);
  copy.fields(writer);
}

template <class Config>
void require_positive(const char* family, const Config& config) {
  Config copy = config;
  PositiveCheck check(family);
  copy.fields(check);
}

}  // namespace json_config
}  // namespace ditrl::models
