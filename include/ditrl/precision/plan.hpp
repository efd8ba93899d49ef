#pragma once

// The precision plan (docs/design.md §4): master, reduce and forward dtypes plus
// ordered per-parameter overrides of the compute dtype, compiled against a
// model's parameter names into one entry per canonical name.
//
// Semantics:
// - Rules apply in order; a rule that changes a parameter's dtype becomes
//   "the rule that set it", so later rules win.
// - A rule whose dtype a parameter already has changes nothing: an override
//   equal to the default compiles to nothing.
// - A rule (with must_match) that matches no parameter is an error naming it.
// - Names are compared in canonical form (names.hpp): a plan compiled from
//   PEFT names (base_model.model.X, X.base_layer.weight) answers canonical
//   lookups and the other way round.
// - A LoRA adapter X.lora_A.weight / X.lora_B.weight that no rule names gets
//   its base X.weight's dtype and rule; rules naming the adapter (matching
//   its own name) decide it alone.

#include <ditrl/precision/dtype.hpp>

#include <map>
#include <string>
#include <vector>

namespace ditrl::precision {

struct DtypeRule {
  std::string pattern;  // glob over canonical names
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::string source;  // where the rule came from, e.g. `precision.override[0] "*.norm2.*"`
  // False for a family's built-in defaults, which may name modules that a
  // preset lacks; the deck's own rules must match something.
  bool must_match = true;
};

struct ParamPrecision {
  c10::ScalarType master = c10::ScalarType::Float;
  c10::ScalarType compute = c10::ScalarType::BFloat16;
  c10::ScalarType reduce = c10::ScalarType::Float;
  std::string rule = "default";  // source of the rule that set `compute`
};

class CompiledPlan {
 public:
  explicit CompiledPlan(std::map<std::string, ParamPrecision> entries) : entries_(std::move(entries)) {}

  // Any spelling of a parameter name; throws naming the parameter when the
  // plan was compiled without it.
  const ParamPrecision& at(const std::string& name) const;
  bool contains(const std::string& name) const;
  // By canonical name.
  const std::map<std::string, ParamPrecision>& entries() const { return entries_; }

 private:
  std::map<std::string, ParamPrecision> entries_;
};

class PrecisionPlan {
 public:
  PrecisionPlan(c10::ScalarType master, c10::ScalarType reduce, c10::ScalarType forward,
                std::vector<DtypeRule> rules = {});
  CompiledPlan compile(const std::vector<std::string>& parameter_names) const;

  c10::ScalarType master() const { return master_; }
  c10::ScalarType reduce() const { return reduce_; }
  c10::ScalarType forward() const { return forward_; }
  const std::vector<DtypeRule>& rules() const { return rules_; }

 private:
  c10::ScalarType master_;
  c10::ScalarType reduce_;
  c10::ScalarType forward_;
  std::vector<DtypeRule> rules_;
};

}  // namespace ditrl::precision
