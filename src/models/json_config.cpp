#include <ditrl/build_info.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/json_config.hpp>

#include <fstream>
#include <sstream>

namespace ditrl::models::json_config {

namespace json = boost::json;

namespace {

// Parses `text` as a JSON object and calls fn(key, value) for every key that
// does not start with '_'.
void for_each_key(const std::string& text, const std::string& source,
                  const std::function<void(const std::string&, const json::value&)>& fn) {
  json::error_code ec;
  const json::value doc = json::parse(text, ec);
  if (ec) fail("{}: not valid JSON: {}", source, ec.message());
  if (!doc.is_object()) fail("{}: a model config.json must be a JSON object", source);
  for (const auto& [k, v] : doc.get_object()) {
    const std::string key(k);
    if (key.rfind('_', 0) != 0) fn(key, v);
  }
}

}  // namespace

void read_fields(const std::string& text, const std::string& source, const std::string& model_class,
                 const std::map<std::string, int64_t*>& ints, const std::map<std::string, Field>& fields) {
  for_each_key(text, source, [&](const std::string& key, const json::value& v) {
    if (const auto it = ints.find(key); it != ints.end())
      *it->second = to_int(v, key, source);
    else if (const auto field = fields.find(key); field != fields.end())
      field->second(v);
    else
      fail("{}: unknown {} config key '{}'", source, model_class, key);
  });
}

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

std::vector<int64_t> to_int_list(const json::value& v, const std::string& key, const std::string& source) {
  if (!v.is_array()) fail("{}: '{}' must be a list of integers, got {}", source, key, json::serialize(v));
  std::vector<int64_t> out;
  for (const json::value& item : v.get_array()) out.push_back(to_int(item, key, source));
  return out;
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

void require_positive(const char* family, const std::vector<std::pair<const char*, int64_t>>& fields) {
  for (const auto& [name, value] : fields)
    if (value <= 0) fail("{} config: {} must be positive, got {}", family, name, value);
}

}  // namespace ditrl::models::json_config
