#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace ditrl::config {

namespace {

// Whether some line of `text` is the header `header` (blanks around it allowed).
bool has_header(const std::string& text, const std::string& header) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, header.size(), header) == 0 &&
        line.find_first_not_of(" \t\r", first + header.size()) == std::string::npos)
      return true;
  }
  return false;
}

toml::table parse_text(const std::string& text, const std::string& source_name) {
  try {
    return toml::parse(std::string_view(text), std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    // TOML itself refuses the mix; its message does not say what to do.
    if (has_header(text, "[reward]") && has_header(text, "[[reward]]"))
      fail("{}: the deck has both a [reward] table and [[reward]] entries: use one [reward] table for a single "
           "reward, or one [[reward]] entry per reward", source_name);
    fail("{}: TOML syntax error: {}", where(e.source()), e.description());
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

std::string quoted(const std::string& raw) {
  std::string out = "\"";
  for (char ch : raw) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// Rules that span sections: the batch-knob invariant (docs/algorithms.md §8) and
// family-specific guidance rules.
void validate_deck(const Config& c, Diagnostics& diag, const SourceMap& sources) {
  const Checker rollout(diag, sources, "rollout");
  const Checker train(diag, sources, "train");
  const int64_t samples = c.rollout.batch * c.rollout.samples_per_prompt;
  const int64_t consumed = c.train.global_batch * c.train.steps_per_rollout;
  if (samples != consumed)
    train.error("global_batch",
                fmt::format("breaks the batch-knob invariant rollout.batch x rollout.samples_per_prompt = "
                            "train.global_batch x train.steps_per_rollout: {} x {} = {} but {} x {} = {}",
                            c.rollout.batch, c.rollout.samples_per_prompt, samples, c.train.global_batch,
                            c.train.steps_per_rollout, consumed));
  const models::FamilyTraits* family = models::find_family_traits(c.model.family);
  if (family && !family->guided && (c.rollout.guidance_scale != 1.0 || c.rollout.negative_prompt))
    rollout.error("guidance_scale", "must be 1 with no negative prompt: LTX trains unguided");
  if (c.rollout.guidance_scale_2 && !(family && family->second_expert))
    rollout.error("guidance_scale_2", "is only used by Wan2.2's low-noise expert (family = \"wan\")");
  if (c.rollout.true_cfg_scale && !(family && family->true_cfg)) {
    std::vector<std::string> true_cfg;
    for (const models::FamilyTraits* f : models::family_registry())
      if (f->true_cfg) true_cfg.emplace_back(f->name);
    rollout.error("true_cfg_scale",
                  fmt::format("is only used by the families with true CFG ({})", fmt::join(true_cfg, ", ")));
  }
  if (!rl::algorithm_traits(c.train.loss).kl_term && c.train.kl_beta > 0)
    train.error("kl_beta", "applies to the Flow-GRPO loss only (loss = \"grpo\")");
  // Deterministic mode turns on LibTorch's deterministic algorithms, and LibTorch's SDPA dispatcher
  // refuses its cuDNN kernel under them: the first attention would fail with no kernel available.
  if (c.run.deterministic && c.precision.attention == models::AttentionBackend::Cudnn)
    Checker(diag, sources, "precision")
        .error("attention",
               "= \"cudnn\" has no deterministic kernel in LibTorch and run.deterministic = true: use \"efficient\" "
               "or \"flash\"");
}

// A reward server's worst case, every try to its deadline and every back-off,
// must end before the collective watchdog gives up on the rank that waits for
// it: the watchdog would end the run naming a collective, not the server.
void check_reward_deadline(const RewardSection& r, const Config& c, const Checker& at) {
  if (r.kind != rollout::RewardKind::Http) return;
  const double worst = r.timeout_s * static_cast<double>(r.retries + 1) +
                       r.backoff_s * (std::pow(2.0, static_cast<double>(r.retries)) - 1);
  if (worst >= c.parallel.collective_timeout_s)
    at.error("timeout_s", fmt::format("x (retries + 1) plus the back-offs is {} s, not below parallel.collective_timeout_s "
                                      "= {} s: lower timeout_s or retries, or raise the collective timeout",
                                      worst, c.parallel.collective_timeout_s));
}

// Each reward's own rules; [[reward]] entries also need distinct names, which
// become metric series and file columns.
void validate_rewards(const Config& c, Diagnostics& diag, const SourceMap& sources) {
  if (c.rewards.empty()) {
    const Checker reward(diag, sources, "reward");
    c.reward.validate(reward);
    check_reward_deadline(c.reward, c, reward);
    if (c.reward.weight != 1.0)
      reward.error("weight", "applies to [[reward]] entries only (a single [reward] is the run's reward as it is)");
    return;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < c.rewards.size(); ++i) {
    const RewardSection& r = c.rewards[i];
    const Checker entry(diag, sources, fmt::format("reward[{}]", i));
    r.validate(entry);
    check_reward_deadline(r, c, entry);
    if (r.name.empty())
      entry.error("name", "is required in a [[reward]] entry (it names the reward's metric series)");
    else if (r.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
             std::string::npos)
      entry.error("name", fmt::format("= \"{}\" may hold only letters, digits, _ and - (it names a metric series)",
                                      r.name));
    else if (!names.insert(r.name).second)
      entry.error("name", fmt::format("= \"{}\" names an earlier [[reward]] entry too", r.name));
  }
}

Config read_config(const toml::table& root, const std::string& source_name) {
  Config config;
  config.source = source_name;
  Diagnostics diag;
  SourceMap sources;
  sources.set_file(source_name);
  for (const auto& [key, node] : root) sources.set(std::string(key.str()), where(node.source()));

  Reader reader(root, "", diag, sources);
  config.sections(reader);
  reader.finish();
  if (diag.empty()) {
    config.run.validate(Checker(diag, sources, "run"));
    config.model.validate(Checker(diag, sources, "model"));
    config.precision.validate(Checker(diag, sources, "precision"));
    config.rollout.validate(Checker(diag, sources, "rollout"));
    validate_rewards(config, diag, sources);
    config.train.validate(Checker(diag, sources, "train"));
    validate_deck(config, diag, sources);
  }
  diag.throw_if_any("invalid deck " + source_name);
  return config;
}

// The entry of an array of tables (`[[reward]]`) that a --set component
// selects: the one whose `name` it is, or the one at its 0-based index.
toml::table* array_entry(toml::array& entries, const std::string& section, const std::string& selector,
                         const std::string& assignment) {
  for (toml::node& entry : entries) {
    toml::table* t = entry.as_table();
    if (t && t->get("name") && t->get("name")->value<std::string>() == selector) return t;
  }
  if (!selector.empty() && selector.size() <= 9 && selector.find_first_not_of("0123456789") == std::string::npos) {
    const size_t index = std::stoul(selector);
    if (index < entries.size() && entries[index].as_table()) return entries[index].as_table();
  }
  fail("--set {}: no [[{}]] entry is named '{}' and it is not an index below {}", assignment, section, selector,
       entries.size());
}

// Applies one `section.key=value` assignment to a TOML tree. The value is
// parsed as TOML (numbers, booleans, arrays, quoted strings); anything that is
// not valid TOML is taken as a bare string. `[[reward]]` entries are reached by
// name or index: `reward.pickscore.weight=0.5`, `reward.0.timeout_s=30`.
void apply_override(toml::table& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("--set {}: expected section.key=value", assignment);
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const std::vector<std::string> path = split(key, '.');
  for (const std::string& part : path)
    if (part.empty()) fail("--set {}: empty component in key '{}'", assignment, key);

  const std::string origin = "--set " + assignment;
  toml::table parsed;
  try {
    parsed = toml::parse(std::string_view("v = " + value), std::string_view(origin));
  } catch (const toml::parse_error&) {
    parsed = toml::parse(std::string_view("v = " + quoted(value)), std::string_view(origin));
  }

  toml::table* table = &root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    toml::node* child = table->get(path[i]);
    if (child && child->is_array()) {
      if (i + 2 >= path.size())
        fail("--set {}: '{}' holds several entries: name one, as {}.NAME.key or {}.INDEX.key", assignment, path[i],
             path[i], path[i]);
      table = array_entry(*child->as_array(), path[i], path[i + 1], assignment);
      ++i;
      continue;
    }
    if (!child) {
      // Made by parsing, so that the section's source is this --set argument
      // (an unknown section is then reported as coming from it).
      toml::table made = toml::parse(std::string_view("t = {}"), std::string_view(origin));
      table->insert(path[i], std::move(*made.get("t")));
      child = table->get(path[i]);
    }
    table = child->as_table();
    if (!table) fail("--set {}: '{}' is not a section", assignment, path[i]);
  }
  table->insert_or_assign(path.back(), std::move(*parsed.get("v")));
}

}  // namespace

Config parse_deck(const std::string& text, const std::string& source_name,
                  const std::vector<std::string>& overrides) {
  toml::table root = parse_text(text, source_name);
  for (const std::string& assignment : overrides) apply_override(root, assignment);
  return read_config(root, source_name);
}

Config load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open deck {}: no such file or not readable", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_deck(text.str(), path, overrides);
}

std::vector<RewardSection> reward_list(const Config& config) {
  return config.rewards.empty() ? std::vector<RewardSection>{config.reward} : config.rewards;
}

std::string to_toml(const Config& config) {
  Config copy = config;
  toml::table root;
  Writer writer(root);
  copy.sections(writer);
  std::ostringstream out;
  out << toml::toml_formatter(root) << "\n";
  return out.str();
}

}  // namespace ditrl::config
