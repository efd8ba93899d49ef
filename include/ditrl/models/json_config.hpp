#pragma once

// Reading a diffusers config.json: typed values with errors that name the
// file and the key. Keys starting with '_' (_class_name,
// _diffusers_version) are metadata and skipped.

#include <ditrl/error.hpp>

#include <boost/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ditrl::models::json_config {

// How one non-integer key of a config is read.
using Field = std::function<void(const boost::json::value&)>;

// The text of config file `path`, naming it when it cannot be read.
std::string read_file(const std::string& path);

// Reads a diffusers config of the usual shape: integer keys go
// straight into `ints`, the others to their entry of `fields`; any other key
// is an error naming `model_class` (the diffusers class).
void read_fields(const std::string& text, const std::string& source, const std::string& model_class,
                 const std::map<std::string, int64_t*>& ints, const std::map<std::string, Field>& fields);

int64_t to_int(const boost::json::value& v, const std::string& key, const std::string& source);
double to_number(const boost::json::value& v, const std::string& key, const std::string& source);
bool to_bool(const boost::json::value& v, const std::string& key, const std::string& source);
std::vector<int64_t> to_int_list(const boost::json::value& v, const std::string& key, const std::string& source);

// Writing one: the header diffusers puts first (the class its loader builds,
// and the ditrl version that wrote it), and an integer list.
boost::json::object diffusers_header(const char* class_name);
boost::json::array int_array(const std::vector<int64_t>& values);

// Fails with "<family> config: <name> must be positive, got <value>" for the
// first field that is not positive.
void require_positive(const char* family, const std::vector<std::pair<const char*, int64_t>>& fields);

// `config` once config.validate() passed; its error is prefixed with the
// file the config came from.
template <class Config>
Config validated(Config config, const std::string& source) {
  try {
    config.validate();
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  return config;
}

}  // namespace ditrl::models::json_config
