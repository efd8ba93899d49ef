#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

namespace ditrl::models::json_config {

namespace json = boost::json;

std::vector<std::string> Reader::read(const json::object& object) {
  std::vector<std::string> unknown;
  for (const auto& [k, v] : object) {
    const std::string key(k);
    if (key.rfind('_', 0) == 0) continue;
    if (const auto it = keys_.find(key); it != keys_.end())
      it->second(v);
    else
      unknown.push_back(key);
  }
  for (const auto& assign : after_) assign();
  return unknown;
}

int64_t Reader::read_int(const char* key, const json::value& v) const {
  if (integral_doubles_ && v.is_double() && v.get_double() == static_cast<double>(static_cast<int64_t>(v.get_double())))
    return static_cast<int64_t>(v.get_double());
  return to_int(v, key, source_);
}

void Reader::read_value(const char* key, const json::value& v, double& member) const {
  member = to_number(v, key, source_);
}

void Reader::read_value(const char* key, const json::value& v, bool& member) const {
  member = to_bool(v, key, source_);
}

void Reader::read_value(const char* key, const json::value& v, std::string& member) const {
  if (!v.is_string()) fail("{}: '{}' must be a string, got {}", source_, key, json::serialize(v));
  member = std::string(v.get_string());
}

void Reader::read_value(const char* key, const json::value& v, std::vector<int64_t>& member) const {
  if (!v.is_array()) fail("{}: '{}' must be a list of integers, got {}", source_, key, json::serialize(v));
  std::vector<int64_t> out;
  for (const json::value& item : v.get_array()) out.push_back(read_int(key, item));
  member = std::move(out);
}

bool Reader::read_coded(const char* key, const json::value& v, const Coded& code) const {
  if (v == code.on) return true;
  for (const json::value& off : code.off)
    if (v == off) return false;
  std::vector<std::string> spellings{json::serialize(code.on)};
  for (const json::value& off : code.off) spellings.push_back(json::serialize(off));
  fail("{}: '{}' must be {}, got {}", source_, key, fmt::join(spellings, " or "), json::serialize(v));
}

void Reader::check_fixed(const char* key, const json::value& v, const Fixed& fixed) const {
  // 0 and 0.0 are the same number.
  const bool same = fixed.value.is_number() && v.is_number() ? v.to_number<double>() == fixed.value.to_number<double>()
                                                             : v == fixed.value;
  if (!same) fail("{}: '{}' = {} is not supported: {}", source_, key, json::serialize(v), fixed.why);
}

json::object parse_object(const std::string& text, const std::string& source) {
  json::error_code ec;
  json::value doc = json::parse(text, ec);
  if (ec) fail("{}: not valid JSON: {}", source, ec.message());
  if (!doc.is_object()) fail("{}: a model config must be a JSON object", source);
  return std::move(doc.get_object());
}

void report_unknown(const std::vector<std::string>& keys, const std::string& source, const std::string& model_class,
                    bool strict) {
  if (keys.empty()) return;
  if (strict) fail("{}: unknown {} config key(s) {}", source, model_class, fmt::join(keys, ", "));
  spdlog::warn("{}: {} config keys not read by ditrl: {}", source, model_class, fmt::join(keys, ", "));
}

}  // namespace ditrl::models::json_config
