#include <ditrl/error.hpp>
#include <ditrl/precision/names.hpp>
#include <ditrl/precision/plan.hpp>

#include <fmt/format.h>

namespace ditrl::precision {

const ParamPrecision& CompiledPlan::at(const std::string& name) const {
  const auto found = entries_.find(canonical_name(name));
  if (found == entries_.end())
    fail("precision plan has no parameter '{}' (canonical name '{}'; the plan was compiled for {} parameters)", name,
         canonical_name(name), entries_.size());
  return found->second;
}

bool CompiledPlan::contains(const std::string& name) const {
  return entries_.count(canonical_name(name)) > 0;
}

PrecisionPlan::PrecisionPlan(c10::ScalarType master, c10::ScalarType reduce, c10::ScalarType forward,
                             std::vector<DtypeRule> rules)
    : master_(master), reduce_(reduce), forward_(forward), rules_(std::move(rules)) {
  for (const DtypeRule& rule : rules_)
    if (rule.pattern.empty()) fail("precision rule {} has an empty pattern", rule.source);
}

CompiledPlan PrecisionPlan::compile(const std::vector<std::string>& parameter_names) const {
  std::map<std::string, ParamPrecision> entries;
  for (const std::string& name : parameter_names) {
    const std::string canonical = canonical_name(name);
    if (!entries.emplace(canonical, ParamPrecision{master_, forward_, reduce_, "default"}).second)
      fail("precision plan: parameter names '{}' and another spelling both resolve to '{}'", name, canonical);
  }
  std::vector<bool> matched(rules_.size(), false);
  auto apply_rules = [&](const std::string& name, ParamPrecision& entry) {
    bool any = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!glob_match(rules_[r].pattern, name)) continue;
      matched[r] = any = true;
      if (rules_[r].dtype == entry.compute) continue;
      entry.compute = rules_[r].dtype;
      entry.rule = rules_[r].source;
    }
    return any;
  };
  for (auto& [canonical, entry] : entries)
    if (!is_lora_name(canonical)) apply_rules(canonical, entry);
  // Adapters after their bases: an adapter no rule names takes its base's result.
  for (auto& [canonical, entry] : entries) {
    if (!is_lora_name(canonical) || apply_rules(canonical, entry)) continue;
    const auto base = entries.find(lora_base_name(canonical));
    if (base != entries.end()) entry = base->second;
  }
  for (size_t r = 0; r < rules_.size(); ++r)
    if (rules_[r].must_match && !matched[r])
      fail(
          "precision rule {} (pattern \"{}\") matches no parameter of the model ({} parameters; names are "
          "canonical checkpoint names such as '{}')",
          rules_[r].source, rules_[r].pattern, entries.size(), entries.empty() ? "" : entries.begin()->first);
  return CompiledPlan(std::move(entries));
}

}  // namespace ditrl::precision
