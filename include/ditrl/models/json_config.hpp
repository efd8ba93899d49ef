#pragma once

// Reading a family's config file: typed values with errors that name the
// file and the key (a config's keys are listed in its fields():
// models/config_fields.hpp).

#include <ditrl/error.hpp>

#include <boost/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ditrl::models::json_config {

// The text of config file `path`, naming it when it cannot be read.
std::string read_file(const std::string& path);

int64_t to_int(const boost::json::value& v, const std::string& key, const std::string& source);
double to_number(const boost::json::value& v, const std::string& key, const std::string& source);
bool to_bool(const boost::json::value& v, const std::string& key, const std::string& source);

// Writing one: the header diffusers puts first (the class its loader builds,
// and the ditrl version that wrote it), and an integer list.
boost::json::object diffusers_header(const char* class_name);
boost::json::array int_array(const std::vector<int64_t>& values);

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
