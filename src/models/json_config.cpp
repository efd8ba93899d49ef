#include <ditrl/build_info.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/json_config.hpp>

#include <fstream>
#include <sstream>

namespace ditrl::models::json_config {

namespace json = boost::json;

int64_t to_int(const json::value& v, const std::string& key, const std::string& source) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(v.get_uint64());
  fail("{}: '{}' must be an integer, got {}", source, key, json::serialize(v));
}

double to_number(const json::value& v, const std::string& key, const std::string& source) {
  if (v.is_number()) return v.to_number<double>();
  fail("{}: '{}' must be a number, got {}", source, key, json::serialize(v));
}

bool to_bool(const json::value& v, const std::string& key, const std::string& source) {
  if (v.is_bool()) return v.get_bool();
  fail("{}: '{}' must be true or false, got {}", source, key, json::serialize(v));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read model config {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

json::object diffusers_header(const char* class_name) {
  json::object o;
  o["_class_name"] = class_name;
  o["_ditrl_version"] = build::kVersion;
  return o;
}

json::array int_array(const std::vector<int64_t>& values) {
  json::array out;
  for (int64_t x : values) out.emplace_back(x);
  return out;
}

}  // namespace ditrl::models::json_config
