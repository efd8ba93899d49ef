#include <ditrl/error.hpp>
#include <ditrl/io/standard.hpp>

#include <fmt/format.h>
#include <boost/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ditrl::io {

namespace json = boost::json;

namespace {

// Values are written as "%.17g" strings and read back with strtod (correctly
// rounded), so a standard holds every value bit for bit: Boost.JSON 1.81's
// number parser is not correctly rounded and can move the last bit. JSON
// has no NaN or infinity either; strings hold them too.
json::value to_json(double v) {
  if (std::isnan(v)) return "nan";
  return json::string(fmt::format("{:.17g}", v));
}

double from_json(const json::value& v, const std::string& context) {
  if (v.is_string()) {
    const std::string s(v.as_string());
    if (s == "nan") return std::nan("");
    char* end = nullptr;
    const double value = std::strtod(s.c_str(), &end);
    if (end != s.c_str() && *end == '\0') return value;
  }
  if (v.is_double()) return v.as_double();
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  fail("{}: expected a number (as a string), got {}", context, json::serialize(v));
}

bool excluded(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

}  // namespace

Standard make_standard(const MetricsTable& run, const std::string& deck,
                       const std::vector<std::string>& excluded_prefixes) {
  Standard standard;
  standard.deck = deck;
  standard.cpu = run.cpu;
  standard.steps = run.steps;
  for (const auto& [name, values] : run.series)
    if (!excluded(name, excluded_prefixes)) standard.metrics[name] = values;
  return standard;
}

void write_standard(const std::string& path, const Standard& standard) {
  json::object root;
  root["deck"] = standard.deck;
  if (!standard.cpu.empty()) root["cpu"] = standard.cpu;
  json::array steps;
  for (int64_t s : standard.steps) steps.push_back(s);
  root["steps"] = std::move(steps);
  json::object metrics;
  for (const auto& [name, values] : standard.metrics) {
    json::array series;
    for (double v : values) series.push_back(to_json(v));
    metrics[name] = std::move(series);
  }
  root["metrics"] = std::move(metrics);
  json::object tolerance;
  for (const auto& [name, t] : standard.tolerance)
    tolerance[name] = json::object{{"abs", t.abs}, {"rel", t.rel}, {"reason", t.reason}};
  root["tolerance"] = std::move(tolerance);

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) fail("cannot write standard {}", tmp);
    out << json::serialize(root) << "\n";
    if (!out) fail("cannot write standard {}", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename {} to {}", tmp, path);
}

Standard read_standard(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open standard {}", path);
  std::stringstream text;
  text << in.rdbuf();
  json::error_code ec;
  json::value root = json::parse(text.str(), ec);
  if (ec || !root.is_object()) fail("{}: not a JSON object ({})", path, ec ? ec.message() : "wrong type");
  const json::object& obj = root.as_object();
  Standard standard;
  try {
    if (const json::value* deck = obj.if_contains("deck")) standard.deck = json::value_to<std::string>(*deck);
    if (const json::value* cpu = obj.if_contains("cpu")) standard.cpu = json::value_to<std::string>(*cpu);
    if (const json::value* steps = obj.if_contains("steps"))
      for (const json::value& s : steps->as_array()) standard.steps.push_back(s.to_number<int64_t>());
    for (const auto& [name, series] : obj.at("metrics").as_object()) {
      std::vector<double>& values = standard.metrics[std::string(name)];
      for (const json::value& v : series.as_array())
        values.push_back(from_json(v, fmt::format("{}: metrics.{}", path, std::string(name))));
    }
    if (const json::value* tolerance = obj.if_contains("tolerance"))
      for (const auto& [name, t] : tolerance->as_object()) {
        Tolerance& tol = standard.tolerance[std::string(name)];
        const json::object& o = t.as_object();
        if (const json::value* v = o.if_contains("abs")) tol.abs = v->to_number<double>();
        if (const json::value* v = o.if_contains("rel")) tol.rel = v->to_number<double>();
        if (const json::value* v = o.if_contains("reason")) tol.reason = json::value_to<std::string>(*v);
        if (tol.reason.empty()) fail("{}: tolerance for '{}' has no reason", path, std::string(name));
      }
  } catch (const std::exception& e) {
    if (dynamic_cast<const ditrl::Error*>(&e)) throw;
    fail("{}: malformed standard: {}", path, e.what());
  }
  return standard;
}

bool tolerances_apply(const Standard& standard, const MetricsTable& run, ToleranceMode mode) {
  return mode == ToleranceMode::Always || standard.cpu.empty() || run.cpu.empty() || standard.cpu != run.cpu;
}

std::vector<std::string> check_standard(const Standard& standard, const MetricsTable& run, ToleranceMode mode,
                                        const std::vector<std::string>& excluded_prefixes) {
  std::vector<std::string> problems;
  const bool tolerant = tolerances_apply(standard, run, mode);
  if (!standard.steps.empty() && standard.steps != run.steps)
    problems.push_back(
        fmt::format("steps differ: standard has {} rows, the run {}", standard.steps.size(), run.steps.size()));
  for (const auto& [name, values] : run.series)
    if (!excluded(name, excluded_prefixes) && standard.metrics.count(name) == 0)
      problems.push_back(fmt::format("{}: in the run but not in the standard (re-record it)", name));
  for (const auto& [name, t] : standard.tolerance)
    if (standard.metrics.count(name) == 0)
      problems.push_back(fmt::format("{}: has a tolerance but no recorded series", name));
  for (const auto& [name, expected] : standard.metrics) {
    auto it = run.series.find(name);
    if (it == run.series.end()) {
      problems.push_back(fmt::format("{}: missing from the run", name));
      continue;
    }
    const std::vector<double>& actual = it->second;
    if (actual.size() != expected.size()) {
      problems.push_back(fmt::format("{}: {} values, standard has {}", name, actual.size(), expected.size()));
      continue;
    }
    const auto tol = tolerant ? standard.tolerance.find(name) : standard.tolerance.end();
    for (size_t i = 0; i < expected.size(); ++i) {
      bool ok;
      if (tol == standard.tolerance.end()) {
        ok = same_bits(actual[i], expected[i]);
      } else {
        const double allowed = tol->second.abs + tol->second.rel * std::fabs(expected[i]);
        ok = same_bits(actual[i], expected[i]) || std::fabs(actual[i] - expected[i]) <= allowed;
      }
      if (!ok) {
        problems.push_back(
            fmt::format("{}: row {} (step {}): run {:.17g}, standard {:.17g}{}", name, i,
                        i < run.steps.size() ? run.steps[i] : -1, actual[i], expected[i],
                        tol == standard.tolerance.end()
                            ? " (bitwise)"
                            : fmt::format(" (tolerance abs {} rel {})", tol->second.abs, tol->second.rel)));
        break;
      }
    }
  }
  return problems;
}

}  // namespace ditrl::io
